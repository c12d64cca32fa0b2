"""Analyses of trained runs (paper appendix): moment matching vs Monte Carlo estimates of the
next-state value, and the accuracy / tightness of each algorithm's uncertainty quantifier (the
paper's Table 2, appendix "Uncertainty quantifier experiment", SPEC.md section 9; the definition is
written out above `selected_steps`).

A run is read back through the run's own loaders: its config.json (written by experiments.run) and
its newest checkpoint (checkpoint.RunCheckpointer, restored without a template, i.e. as the flax
state dict of the TrainState). The networks are rebuilt from the config (sac.make_actor /
sac.make_critic) and the dynamics ensemble is the one stored in the run's state.

Shapes: B = states, S = obs dim, A = action dim, E = critics, N = Monte Carlo samples, R = repeats.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from typing import Callable, List, Optional, Sequence

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax.training.train_state import TrainState

from mombo_jax import buffer, config as config_lib, dynamics, sac, targets
from mombo_jax.critics import sample_tanh_gaussian


# ------------------------------------------------------------------------------- loading runs

def load_config(workdir: str):
  """(Config, dataset) from <workdir>/config.json. Raises ValueError naming the file."""
  path = os.path.join(workdir, "config.json")
  try:
    with open(path) as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path} is missing or unreadable ({e}); pass a run workdir written by "
                     "experiments.run.") from None
  fields = {f.name for f in dataclasses.fields(config_lib.Config)}
  # JSON turned the config's tuples into lists; the frozen Config must stay hashable.
  values = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items() if k in fields}
  return config_lib.Config(**values), saved.get("dataset") or values.get("env")


@flax.struct.dataclass
class SeedNets:
  """One seed's trained networks. actor, critic, target_critic: Flax variables ({"params": ...});
  dyn: DynamicsState of that seed; log_alpha: f32 [] (the entropy temperature's log, used by a
  soft-backup run's targets). A pytree (config static): jitted functions take it as an argument,
  so XLA never folds the trained weights in as constants (slow compiles)."""
  config: config_lib.Config = flax.struct.field(pytree_node=False)
  actor: dict
  critic: dict
  target_critic: dict
  dyn: dynamics.DynamicsState
  log_alpha: jax.Array

  @property
  def action_dim(self) -> int:
    return int(self.actor["params"][f"Dense_{len(self.config.actor_hidden)}"]["kernel"].shape[-1])

  def policy(self, obs, key):
    """(a ~ pi(.|obs) [..., A], log pi [...])."""
    mean, log_std = sac.make_actor(self.config, self.action_dim).apply(self.actor, obs)
    return sample_tanh_gaussian(mean, log_std, key)

  def policy_mode(self, obs):
    """tanh(mean) [..., A], the evaluation action."""
    mean, _ = sac.make_actor(self.config, self.action_dim).apply(self.actor, obs)
    return jnp.tanh(mean)

  def q(self, obs, action, obs_var=None, target=True):
    """Q [E, ...] of the (target) critics, or their MM (mean, var) [E, ...] with obs_var."""
    params = self.target_critic if target else self.critic
    return sac.make_critic(self.config).apply(params, obs, action, obs_var)

  def agent(self) -> sac.AgentState:
    """The networks as the sac.AgentState that targets.py reads (apply functions, parameters,
    log_alpha); no optimiser state (tx None): for evaluation only."""
    def state(apply_fn, params):
      return TrainState(step=jnp.zeros((), jnp.int32), apply_fn=apply_fn, params=params, tx=None,
                        opt_state=None)

    return sac.AgentState(
        actor=state(sac.make_actor(self.config, self.action_dim).apply, self.actor),
        critic=state(sac.make_critic(self.config).apply, self.critic),
        target_critic_params=self.target_critic,
        log_alpha=state(None, {"log_alpha": jnp.asarray(self.log_alpha, jnp.float32)}))


@dataclasses.dataclass
class TrainedRun:
  """A run read back: config, dataset, seeds, the checkpoint's epoch and per-seed networks."""
  workdir: str
  config: config_lib.Config
  dataset: str
  seeds: List[int]
  epoch: int
  nets: List[SeedNets]


def load_run(workdir: str, step: Optional[int] = None) -> TrainedRun:
  """A run's config and newest (or `step`'s) checkpoint. Raises ValueError with what is missing."""
  from mombo_jax import checkpoint
  config, dataset = load_config(workdir)
  ckpt_dir = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(ckpt_dir):
    raise ValueError(f"{workdir} has no checkpoints folder; pass a run workdir of experiments.run "
                     "that finished at least one evaluation.")
  ckpt = checkpoint.RunCheckpointer(ckpt_dir, keep=None)
  try:
    tree, meta = ckpt.restore(step=step)
  except checkpoint.CheckpointError as e:
    raise ValueError(str(e)) from None
  finally:
    ckpt.close()
  agent, dyn = tree["agent"], tree["dynamics"]
  num = int(np.shape(tree["epoch"])[0])
  nets = []
  for i in range(num):
    pick = lambda t, i=i: jax.tree.map(lambda x: jnp.asarray(x[i]), t)  # noqa: E731
    d = pick(dyn)
    nets.append(SeedNets(config=config, actor=pick(agent["actor"]["params"]),
                         critic=pick(agent["critic"]["params"]),
                         target_critic=pick(agent["target_critic_params"]),
                         log_alpha=pick(agent["log_alpha"]["params"]["log_alpha"]),
                         dyn=dynamics.DynamicsState(params=d["params"],
                                                    input_mean=d["input_mean"],
                                                    input_std=d["input_std"],
                                                    elites=d["elites"].astype(jnp.int32))))
  return TrainedRun(workdir=workdir, config=config, dataset=dataset,
                    seeds=list(range(config.seed, config.seed + num)),
                    epoch=int(meta.get("epoch", meta.get("step", -1))), nets=nets)


# ----------------------------------------------------------- moment matching vs Monte Carlo

def elite_gaussian(nets: SeedNets, obs, action, elite_rank: int = 0):
  """The next-state Gaussian (mean, var) [B, S] of one elite (rank 0 = best holdout loss)."""
  s_mean, s_var, _, _ = dynamics.predict(nets.dyn, obs, action, nets.config)
  member = nets.dyn.elites[elite_rank]
  return s_mean[member], s_var[member]


def mm_value(nets: SeedNets, mean, var, next_action):
  """MOMBO's next-state value: the MM moments of the target critic with the smaller MM mean, as
  in targets._mm_min. Returns (member j* [B] int, mean [B], var [B])."""
  m, v = nets.q(mean, next_action, var)                               # [E, B]
  j = jnp.argmin(m, axis=0)
  rows = jnp.arange(m.shape[1])
  return j, m[j, rows], v[j, rows]


def member_q_fn(nets: SeedNets, member) -> Callable:
  """q(obs [..., B, S], action [..., B, A]) -> [..., B]: target critic member[b] for state b
  (the ensemble is evaluated whole, as in the target)."""
  member = jnp.asarray(member)

  def q(obs, action):
    values = nets.q(obs, action)                                      # [E, ..., B]
    idx = jnp.broadcast_to(member, values.shape[1:])[None]
    return jnp.take_along_axis(values, idx, axis=0)[0]

  return q


def mc_estimates(q_fn: Callable, mean, var, action, key, n: int, repeats: int):
  """[R, B] Monte Carlo estimates of E[q(s', a)], s' ~ N(mean, diag var) [B, S], each the average
  of n samples; the R repeats use independent samples (sequential, so memory is one repeat's)."""
  keys = jax.random.split(key, repeats)
  return jax.lax.map(lambda k: mc_estimate(q_fn, mean, var, action, k, n), keys)


def mc_estimate(q_fn: Callable, mean, var, action, key, n: int):
  """[B] one Monte Carlo estimate of E[q(s', a)] from n samples of s' ~ N(mean, diag var)."""
  eps = jax.random.normal(key, (n,) + mean.shape, mean.dtype)
  samples = mean + jnp.sqrt(var) * eps                                 # [n, B, S]
  return jnp.mean(q_fn(samples, jnp.broadcast_to(action, (n,) + action.shape)), axis=0)


def time_call(fn: Callable, *args, number: int = 5) -> float:
  """Median wall-clock seconds of fn(*args), after one warm-up call (compilation), each call
  waited for with block_until_ready."""
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(number):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def mm_vs_mc(nets: SeedNets, obs, key, ns: Sequence[int] = (2, 10, 100, 1000, 10000),
             repeats: int = 50, elite_rank: int = 0, timing_calls: int = 5) -> dict:
  """The paper's Figure 1 experiment on states obs [B, S].

  a ~ pi(s); (mu, var) = the elite's next-state Gaussian; a' ~ pi(mu) (as in the MOMBO target;
  the same a' for every estimator, so only s' is random); j* = the target critic with the smaller
  MM mean. MM: (m, v) of Q_j*(s', a') in one MM pass. MC: for each N, `repeats` independent
  estimates mean_{i<=N} Q_j*(s'_i, a'), s'_i ~ N(mu, var).
  Returns dict(mm_mean [B], mm_var [B], member [B], estimates {N: [R, B]},
  seconds {"MM" or N: seconds per call for all B states}, num_states B).
  """
  k_a, k_next, k_mc = jax.random.split(key, 3)
  obs = jnp.asarray(obs, jnp.float32)
  action, _ = nets.policy(obs, k_a)
  mu, var = elite_gaussian(nets, obs, action, elite_rank)
  next_action, _ = nets.policy(mu, k_next)
  # Everything is an argument of the jitted calls (nothing folded in as a constant), so MM and MC
  # are timed on equal terms.
  mm = jax.jit(mm_value)
  member, mm_mean, mm_var = mm(nets, mu, var, next_action)
  out = dict(mm_mean=np.asarray(mm_mean), mm_var=np.asarray(mm_var), member=np.asarray(member),
             estimates={}, seconds={"MM": time_call(mm, nets, mu, var, next_action,
                                                    number=timing_calls)},
             num_states=int(obs.shape[0]))
  args = (nets, member, mu, var, next_action)
  for i, n in enumerate(ns):
    n = int(n)
    k = jax.random.fold_in(k_mc, i)
    many = jax.jit(lambda nets, member, m, v, a, k, n=n: mc_estimates(
        member_q_fn(nets, member), m, v, a, k, n, repeats))
    out["estimates"][n] = np.asarray(many(*args, k))
    one = jax.jit(lambda nets, member, m, v, a, k, n=n: mc_estimate(
        member_q_fn(nets, member), m, v, a, k, n))
    out["seconds"][n] = time_call(one, *args, k, number=timing_calls)
  return out


def mm_vs_mc_rows(result: dict) -> tuple:
  """(summary rows, raw rows) for the CSVs: one summary row per (method, state) with the mean and
  std over repeats of the estimates, |mean - MM mean|, the MM mean / std and seconds per call;
  raw rows hold every estimate."""
  summary, raw = [], []
  for b in range(result["num_states"]):
    m, s = float(result["mm_mean"][b]), float(np.sqrt(result["mm_var"][b]))
    summary.append(dict(method="MM", n_samples=0, state=b, estimate_mean=m, estimate_std=0.0,
                        abs_error_vs_mm=0.0, mm_mean=m, mm_std=s, critic=int(result["member"][b]),
                        seconds_per_call=result["seconds"]["MM"]))
    for n, est in result["estimates"].items():
      summary.append(dict(method="MC", n_samples=n, state=b,
                          estimate_mean=float(est[:, b].mean()),
                          estimate_std=float(est[:, b].std()),
                          abs_error_vs_mm=float(abs(est[:, b].mean() - m)), mm_mean=m, mm_std=s,
                          critic=int(result["member"][b]), seconds_per_call=result["seconds"][n]))
      raw += [dict(n_samples=n, state=b, repeat=r, estimate=float(est[r, b]))
              for r in range(est.shape[0])]
  return summary, raw


def plot_mm_vs_mc(result: dict, path: str, title: str = "", max_states: int = 3):
  """Figure 1 of the paper, per state: the spread of the MC estimates (violins over repeats) for
  each N beside the MM estimate (line) and the MM Gaussian of Q (+-1 std band); then the spread of
  the estimates against N with the MM prediction sqrt(v / N); and the seconds per estimate."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  ns = sorted(result["estimates"])
  states = list(range(min(max_states, result["num_states"])))
  fig, axes = plt.subplots(1, len(states) + 2, figsize=(4.2 * (len(states) + 2), 3.8))
  for ax, b in zip(axes, states):
    m, s = result["mm_mean"][b], np.sqrt(result["mm_var"][b])
    data = [result["estimates"][n][:, b] for n in ns]
    ax.violinplot(data, positions=range(len(ns)), showmeans=True)
    ax.axhline(m, color="C3", lw=1.5, label=f"MM estimate {m:.3g}")
    ax.axhspan(m - s, m + s, color="C3", alpha=0.12, label=f"MM Gaussian ±1 std ({s:.2g})")
    ax.set_xticks(range(len(ns)), [str(n) for n in ns])
    ax.set(xlabel="Monte Carlo samples N", ylabel="estimate of E[Q(s', a')]", title=f"state {b}")
    ax.legend(fontsize=7)
  ax = axes[len(states)]
  for b in states:
    spread = [result["estimates"][n][:, b].std() for n in ns]
    line, = ax.loglog(ns, spread, "o-", label=f"state {b}: MC spread")
    ax.loglog(ns, np.sqrt(result["mm_var"][b] / np.asarray(ns, float)), "--",
              color=line.get_color(), lw=1, label="MM sqrt(v / N)")
  ax.set(xlabel="N", ylabel="std of the estimates over repeats", title="MC error vs N")
  ax.legend(fontsize=6)
  ax = axes[-1]
  labels = ["MM"] + [str(n) for n in ns]
  secs = [result["seconds"]["MM"]] + [result["seconds"][n] for n in ns]
  ax.bar(range(len(labels)), np.asarray(secs) / result["num_states"] * 1e3,
         color=["C3"] + ["C0"] * len(ns))
  ax.set_yscale("log")
  ax.set_xticks(range(len(labels)), labels)
  ax.set(xlabel="estimator (MC: N)", ylabel="ms per estimate (per state)",
         title=f"cost ({result['num_states']} states per call)")
  if title:
    fig.suptitle(title)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


# ------------------------------------------------------------- uncertainty quantifier quality
#
# The paper's Table 2 (appendix "Uncertainty quantifier experiment", SPEC.md section 9). For a
# tuple (s, a, r, s'_real, d) and M draws of the learned model:
#   B Q(s, a)       = r + g (1-d) mean_{i <= num_policy} min_j Q'(s'_real, a'_i), a'_i ~ pi(s'_real)
#   B^ Q(s, a, s^') = r^ + g (1-d^) min_j Q'(s^', a^'), (s^', r^) ONE draw of the model (a
#                     uniformly random elite, as in rollouts), a^' ~ pi(s^') one sample, d^ the
#                     termination fn
#   accuracy        = mean over draws of 1(U >= |B Q - B^ Q|), tightness = mean of U - |B Q - B^ Q|,
# U the per-row penalty training subtracts (targets.get_penalty, times beta), drawn with each draw
# (it is random for every algorithm but MOPO: policy samples, MOBILE's next-state samples, and for
# lcb the Gaussian of the elite that drew s^'). Both backups are deterministic (no entropy term).
# Only B Q is an expectation: averaging B^ Q over draws too would remove the single-sample error U
# is meant to bound.

def selected_steps(length: int, every: int = 10) -> np.ndarray:
  """Indices of the transitions kept from an episode of `length` steps: every `every`-th step
  (the 10th, 20th, ...: indices every-1, 2*every-1, ...) and the last one."""
  idx = np.arange(every - 1, length, every)
  if length and (not idx.size or idx[-1] != length - 1):
    idx = np.append(idx, length - 1)
  return idx


def _continue(done, value):
  """value where the episode goes on, 0 at terminals (selection, as in targets.py: a NaN behind a
  terminal stays out)."""
  return jnp.where(done > 0, jnp.zeros_like(value), value)


def exact_bellman(policy_fn: Callable, q_fn: Callable, reward, next_obs, done, key, *,
                  gamma: float, num_policy: int = 1000):
  """B Q(s, a) [B] on the real transition: r + g (1 - d) mean_{i <= num_policy} q(s', a'_i),
  a'_i ~ pi(s') (the paper: "we estimate the exact Bellman target by taking samples from the
  policies"); deterministic backup. The true dynamics of MuJoCo are deterministic, so the real s'
  is the whole expectation over s'.

  policy_fn(obs [..., S], key) -> a [..., A]; q_fn(obs [..., S], a [..., A]) -> [...] (the min over
  the target critics); reward, done [B]; next_obs [B, S].
  """
  chex.assert_rank([reward, done, next_obs], [1, 1, 2])
  chex.assert_equal_shape_prefix([reward, done, next_obs], 1)
  many = jnp.broadcast_to(next_obs, (num_policy,) + next_obs.shape)         # [P, B, S]
  value = q_fn(many, policy_fn(many, key)).mean(axis=0)                     # [B]
  out = reward + gamma * _continue(done, value)
  chex.assert_shape(out, reward.shape)
  return out


def sample_bellman(policy_fn: Callable, q_fn: Callable, draw_fn: Callable, obs, action, key, *,
                   gamma: float):
  """One draw: (B^ Q(s, a, s^') [B], U [B] unscaled) with (s^', r^, d^, U) = draw_fn(obs, action,
  k) one model draw per row and r^ + g (1 - d^) q(s^', a^'), a^' ~ pi(s^') one sample.

  draw_fn(obs [B, S], action [B, A], key) -> (next_obs [B, S], reward [B], done [B], u [B]).
  """
  k_draw, k_pi = jax.random.split(key)
  next_obs, reward, done, u = draw_fn(obs, action, k_draw)
  chex.assert_equal_shape([next_obs, obs])
  chex.assert_shape([reward, done, u], obs.shape[:1])
  out = reward + gamma * _continue(done, q_fn(next_obs, policy_fn(next_obs, k_pi)))
  return out, u


def bellman_gaps(policy_fn: Callable, q_fn: Callable, draw_fn: Callable, obs, action, reward,
                 next_obs, done, key, *, gamma: float, num_draws: int = 100,
                 num_policy: int = 1000) -> dict:
  """The core of the experiment on tuples (obs [B, S], action [B, A], reward [B], next_obs [B, S],
  done [B]) of the real environment, from plain callables (closed-form pieces in tests; a trained
  run's networks in `uncertainty_quality`): see exact_bellman, sample_bellman.

  Returns {"exact": B Q [B], "sample": B^ Q [M, B], "u": U [M, B] (unscaled)}, M = num_draws
  independent draws (sequential: memory of one draw).
  """
  chex.assert_rank([obs, action, next_obs, reward, done], [2, 2, 2, 1, 1])
  chex.assert_equal_shape_prefix([obs, action, next_obs, reward, done], 1)
  k_exact, k_draws = jax.random.split(key)
  exact = exact_bellman(policy_fn, q_fn, reward, next_obs, done, k_exact, gamma=gamma,
                        num_policy=num_policy)
  sample, u = jax.lax.map(
      lambda k: sample_bellman(policy_fn, q_fn, draw_fn, obs, action, k, gamma=gamma),
      jax.random.split(k_draws, num_draws))
  chex.assert_shape([sample, u], (num_draws, obs.shape[0]))
  return dict(exact=exact, sample=sample, u=u)


def quantifier_scores(exact, sample, u, scale: float) -> dict:
  """Accuracy and tightness per tuple, each averaged over the draws, in float64.

  exact [B]; sample, u [M, B] (u unscaled, U = scale * u as training subtracts it; scale = beta,
  MOPO's lambda). Returns per tuple [B]: accuracy = mean_m 1(U >= |B Q - B^ Q|), tightness =
  mean_m (U - |B Q - B^ Q|), accuracy_unscaled / tightness_unscaled (the same with u),
  penalty (mean U), penalty_unscaled (mean u), bellman_error (mean |B Q - B^ Q|); and each one's
  mean over the tuples as <name>_mean (float).
  """
  exact, sample, u = (np.asarray(x, np.float64) for x in (exact, sample, u))
  if sample.ndim == 1:
    sample, u = sample[None], u[None]
  err = np.abs(exact[None] - sample)                                        # [M, B]
  scaled = scale * u
  out = dict(accuracy=(scaled >= err).mean(0), tightness=(scaled - err).mean(0),
             accuracy_unscaled=(u >= err).mean(0), tightness_unscaled=(u - err).mean(0),
             penalty=scaled.mean(0), penalty_unscaled=u.mean(0), bellman_error=err.mean(0))
  out.update({f"{k}_mean": float(np.mean(v)) for k, v in list(out.items())})
  return out


def bellman_metrics(u, exact, sample) -> dict:
  """Per-transition accuracy 1(U >= |B Q - B^ Q|) and tightness U - |B Q - B^ Q| (paper appendix)
  for U, B^ Q [B] (or [M, B]: averaged over the M draws) and B Q [B]; returns {"accuracy": [B],
  "tightness": [B]} and their means ("accuracy_mean", "tightness_mean")."""
  s = quantifier_scores(exact, sample, u, 1.0)
  return {k: s[k] for k in ("accuracy", "tightness", "accuracy_mean", "tightness_mean")}


def model_done(config, term_fn: Callable, obs, action, next_obs):
  """d^ [B] float32 of a model draw as rollout.run marks it: the termination function, or a runaway
  state (any |x| >= config.rollout_obs_limit, which ends a rollout branch as terminal)."""
  done = term_fn(obs, action, next_obs)
  if config.rollout_obs_limit is not None:
    done = done | jnp.any(jnp.abs(next_obs) >= config.rollout_obs_limit, axis=-1)
  return done.astype(jnp.float32)


def model_draw(nets: SeedNets, obs, action, key):
  """One draw of the run's learned model per row, as a rollout writes it, and that row's penalty.

  obs [B, S], action [B, A]. (s^', r^) from a uniformly random elite per row (dynamics.step, the
  rollouts' own step); d^ = model_done. Returns (row, u): row a buffer.Batch [B, ...] carrying the
  producing elite's Gaussian (what a rollout row stores; reward = r^ unpenalised, also for MOPO:
  B^ uses the model's estimate of r and MOPO's penalty is its U), u [B] the UNSCALED penalty of the
  row, `penalty(nets, row, key)`.
  """
  config = nets.config
  term_fn = dynamics.termination_fn(config.env_name)
  k_step, k_u = jax.random.split(key)
  out = dynamics.step(nets.dyn, obs, action, k_step, config, penalty=False)
  row = buffer.Batch(obs=obs, action=action, reward=out.reward, next_obs=out.next_obs,
                     done=model_done(config, term_fn, obs, action, out.next_obs),
                     obs_var=jnp.zeros_like(obs), next_obs_mean=out.next_obs_mean,
                     next_obs_var=out.next_obs_var, reward_mean=out.reward_mean,
                     reward_var=out.reward_var)
  return row, penalty(nets, row, k_u)


def penalty(nets: SeedNets, rows, key, scaled: bool = False):
  """The algorithm's own uncertainty quantifier U [B] on model rows (buffer.Batch [B, ...]): the
  very function its training target calls (targets.get_penalty(config)), so never a copy.
  Unscaled by default; scaled=True multiplies by config.beta (MOMBO / MOBILE beta, MOPO lambda),
  i.e. what training subtracts from the target (MOPO: from the model reward).

  Per algorithm (see targets.py): MOMBO lcb sqrt(var_r + g^2 (1-d) v*) from the Gaussian of the
  elite that drew the row (for Table 2: the draw's random elite, the Gaussian a rollout row stores,
  with that draw's d^); elite_spread std_e T_e (ddof=1); mixture sqrt(mean_e MM var_e + var_e T_e);
  MOBILE std over elites of the mean over N next-state samples of min_j Q'; MOPO max over all
  members of ||sigma||_2 (dynamics.step's mopo_penalty).
  """
  config = nets.config
  u = targets.get_penalty(config)(nets.agent(), rows, key, dyn=nets.dyn, config=config,
                                  term_fn=dynamics.termination_fn(config.env_name))
  return config.beta * u if scaled else u


def seed_functions(nets: SeedNets):
  """(policy_fn, q_fn, draw_fn) of one trained seed for bellman_gaps: a' ~ pi, min over the target
  critics of Q' (plain, zero input variance), and model_draw's (s^', r^, d^, u)."""
  def draw_fn(obs, action, key):
    row, u = model_draw(nets, obs, action, key)
    return row.next_obs, row.reward, row.done, u

  return (lambda obs, key: nets.policy(obs, key)[0],
          lambda obs, action: nets.q(obs, action).min(axis=0), draw_fn)


@functools.partial(jax.jit, static_argnames=("num_draws", "num_policy"))
def _seed_gaps(nets, obs, action, reward, next_obs, done, key, num_draws, num_policy):
  # The networks are an argument, never closed over: XLA would fold the weights in as constants.
  policy_fn, q_fn, draw_fn = seed_functions(nets)
  return bellman_gaps(policy_fn, q_fn, draw_fn, obs, action, reward, next_obs, done, key,
                      gamma=nets.config.gamma, num_draws=num_draws, num_policy=num_policy)


def _chunk_rows(n: int, chunk: int) -> int:
  """Rows per jitted call: `chunk`, or for fewer tuples the next power of two (>= 8), so seeds with
  different tuple counts share a few compiled shapes."""
  return min(int(chunk), max(8, 1 << max(0, int(n) - 1).bit_length()))


def uncertainty_quality(nets: SeedNets, batch: dict, key, num_draws: int = 100,
                        num_policy: int = 1000, chunk: int = 256) -> dict:
  """quantifier_scores of one seed on tuples batch = {obs [B, S], action [B, A], reward [B],
  next_obs [B, S], done [B]} (real_transitions' or dataset_states' dict), with U scaled by the
  run's beta; plus exact [B], sample [M, B], u [M, B] (unscaled).

  Tuples go through in jitted chunks of `chunk` rows (the last one padded with copies of its first
  row, dropped after): memory is num_policy x chunk critic rows for B Q, and few compilations.
  """
  arrays = {k: np.asarray(batch[k], np.float32) for k in ("obs", "action", "reward", "next_obs",
                                                           "done")}
  n = arrays["reward"].shape[0]
  if n == 0:
    raise ValueError("No tuples to evaluate the uncertainty quantifier on.")
  size = _chunk_rows(n, chunk)
  parts = []
  for i, lo in enumerate(range(0, n, size)):
    take = np.arange(lo, lo + size)
    take = np.where(take < n, take, lo)
    res = _seed_gaps(nets, *(jnp.asarray(arrays[k][take]) for k in
                             ("obs", "action", "reward", "next_obs", "done")),
                     jax.random.fold_in(key, i), num_draws, num_policy)
    keep = min(size, n - lo)
    parts.append(jax.tree.map(lambda x, keep=keep: np.asarray(x)[..., :keep], res))
  exact = np.concatenate([p["exact"] for p in parts])
  sample = np.concatenate([p["sample"] for p in parts], axis=-1)
  u = np.concatenate([p["u"] for p in parts], axis=-1)
  out = quantifier_scores(exact, sample, u, float(nets.config.beta))
  out.update(exact=exact, sample=sample, u=u)
  return out


def real_transitions(nets: SeedNets, env_name: str, episodes: int, seed: int,
                     every: int = 10, max_episode_steps: Optional[int] = None) -> dict:
  """--states=policy (the paper's): runs the deterministic policy (evaluation mode) for `episodes`
  episodes in the real env and keeps the selected_steps of each. Returns numpy obs [B, S],
  action [B, A], reward [B], next_obs [B, S], done [B] (terminated; truncation still bootstraps)
  and episode [B]."""
  from mombo_jax import data
  env = data.make_env(env_name, **({} if max_episode_steps is None
                                   else {"max_episode_steps": int(max_episode_steps)}))
  policy = jax.jit(SeedNets.policy_mode)
  act = lambda obs: policy(nets, obs)  # noqa: E731
  low, high = env.action_space.low, env.action_space.high
  rows = {k: [] for k in ("obs", "action", "reward", "next_obs", "done", "episode")}
  try:
    for ep in range(episodes):
      obs, _ = env.reset(seed=int(seed) * 1000 + ep)
      episode = []
      while True:
        a = np.asarray(act(jnp.asarray(obs, jnp.float32)), np.float64)
        env_a = low + 0.5 * (a + 1.0) * (high - low)     # identity for [-1, 1] action spaces
        nxt, r, terminated, truncated, _ = env.step(env_a.astype(env.action_space.dtype))
        episode.append((obs, a, r, nxt, float(terminated)))
        obs = nxt
        if terminated or truncated:
          break
      for i in selected_steps(len(episode), every):
        for k, v in zip(("obs", "action", "reward", "next_obs", "done"), episode[i]):
          rows[k].append(v)
        rows["episode"].append(ep)
  finally:
    env.close()
  return {k: np.asarray(v, np.int64 if k == "episode" else np.float32) for k, v in rows.items()}


def dataset_states(transitions, num_states: int = 1000, seed: int = 0) -> dict:
  """--states=dataset: num_states transitions of a dataset (data.Transitions) drawn without
  replacement with np.random.default_rng(seed) (all of them if it holds fewer), so every algorithm
  and seed trained on that dataset is scored on the very same tuples (no policy-quality confound).
  Returns numpy obs [B, S], action [B, A], reward [B], next_obs [B, S], done [B] (terminals;
  truncations bootstrap) and index [B] (row in the dataset, sorted)."""
  n = len(transitions.rewards)
  if n == 0:
    raise ValueError("The dataset holds no transitions.")
  idx = np.sort(np.random.default_rng(seed).choice(n, min(int(num_states), n), replace=False))
  return dict(obs=np.asarray(transitions.observations[idx], np.float32),
              action=np.asarray(transitions.actions[idx], np.float32),
              reward=np.asarray(transitions.rewards[idx], np.float32),
              next_obs=np.asarray(transitions.next_observations[idx], np.float32),
              done=np.asarray(transitions.terminals[idx], np.float32), index=idx.astype(np.int64))
