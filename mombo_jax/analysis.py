"""Analyses of trained runs (paper appendix): moment matching vs Monte Carlo estimates of the
next-state value, and the accuracy / tightness of each algorithm's uncertainty quantifier.

A run is read back through the run's own loaders: its config.json (written by experiments.run) and
its newest checkpoint (checkpoint.RunCheckpointer, restored without a template, i.e. as the flax
state dict of the TrainState). The networks are rebuilt from the config (sac.make_actor /
sac.make_critic) and the dynamics ensemble is the one stored in the run's state.

Shapes: B = states, S = obs dim, A = action dim, E = critics, N = Monte Carlo samples, R = repeats.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable, List, Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax import config as config_lib, dynamics, sac
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
  dyn: DynamicsState of that seed. A pytree (config static): jitted functions take it as an
  argument, so XLA never folds the trained weights in as constants (slow compiles)."""
  config: config_lib.Config = flax.struct.field(pytree_node=False)
  actor: dict
  critic: dict
  target_critic: dict
  dyn: dynamics.DynamicsState

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

def selected_steps(length: int, every: int = 10) -> np.ndarray:
  """Indices of the transitions kept from an episode of `length` steps: every `every`-th step
  (the 10th, 20th, ...: indices every-1, 2*every-1, ...) and the last one."""
  idx = np.arange(every - 1, length, every)
  if length and (not idx.size or idx[-1] != length - 1):
    idx = np.append(idx, length - 1)
  return idx


def bellman_metrics(u, exact, sample) -> dict:
  """Per-transition accuracy 1(U >= |B Q - B^ Q|) and tightness U - |B Q - B^ Q| (paper appendix),
  for U, B Q, B^ Q [B]; returns {"accuracy": [B] float, "tightness": [B]} and their means."""
  u, exact, sample = (np.asarray(x, np.float64) for x in (u, exact, sample))
  err = np.abs(exact - sample)
  acc = (u >= err).astype(np.float64)
  return dict(accuracy=acc, tightness=u - err, accuracy_mean=float(acc.mean()),
              tightness_mean=float((u - err).mean()))


def _min_q(nets: SeedNets, obs, action):
  """min over the target critics of Q(obs, action) [...]."""
  return nets.q(obs, action).min(axis=0)


def _continue(done, value):
  return jnp.where(done > 0, jnp.zeros_like(value), value)


def sample_bellman(nets: SeedNets, reward, next_obs, done, key, num_policy: int = 1000):
  """B^ Q(s, a, s') [B] on the real transition: r + g (1 - d) E_{a' ~ pi(s')} min_j Q'(s', a'),
  the expectation over num_policy policy samples (deterministic backup)."""
  actions, _ = nets.policy(jnp.broadcast_to(next_obs, (num_policy,) + next_obs.shape), key)
  value = _min_q(nets, jnp.broadcast_to(next_obs, actions.shape[:-1] + next_obs.shape[-1:]),
                 actions).mean(axis=0)
  return reward + nets.config.gamma * _continue(done, value)


def exact_bellman(nets: SeedNets, obs, action, key, num_samples: int = 1000):
  """B Q(s, a) [B] under the learned model: the mean over num_samples draws of (s', r) from a
  uniformly random elite (as in the rollouts), a' ~ pi(s'), of r + g (1 - d(s')) min_j Q'(s', a').
  """
  term_fn = dynamics.termination_fn(nets.config.env_name)
  keys = jax.random.split(key, num_samples)

  def one(k):
    k_step, k_pi = jax.random.split(k)
    step = dynamics.step(nets.dyn, obs, action, k_step, nets.config)
    done = term_fn(obs, action, step.next_obs).astype(jnp.float32)
    a_next, _ = nets.policy(step.next_obs, k_pi)
    return step.reward + nets.config.gamma * _continue(done, _min_q(nets, step.next_obs, a_next))

  return jax.lax.map(one, keys).mean(axis=0)


def penalty(nets: SeedNets, obs, action, key):
  """The algorithm's own uncertainty quantifier U(s, a) [B], in target units (what training
  subtracts from the Bellman target), with the run's beta / lambda:
  - MOMBO lcb: beta sqrt(var_r + g^2 (1-d) v*) of each elite's Gaussian (v* the MM variance of the
    target critic with the smaller MM mean at (mu_e, a'_e ~ pi(mu_e))), averaged over the elites
    (rollouts pick the elite uniformly); elite_spread: beta std_e T_e (ddof=1); mixture:
    beta sqrt(mean_e MM var_e + var_e T_e), as in targets.py;
  - MOBILE: beta std over elites (ddof=1) of the mean over N next-state samples of min_j Q';
  - MOPO: lambda max over all members of ||sigma||_2 (dynamics.step's mopo_penalty).
  """
  config = nets.config
  term_fn = dynamics.termination_fn(config.env_name)
  if config.algo == "mopo":
    return config.beta * dynamics.step(nets.dyn, obs, action, key, config).mopo_penalty
  s_mean, s_var, r_mean, r_var = dynamics.predict(nets.dyn, obs, action, config)
  take = lambda x: jnp.take(x, nets.dyn.elites, axis=0)  # noqa: E731
  s_mean, s_var, r_mean, r_var = map(take, (s_mean, s_var, r_mean, r_var))   # [E, B, ...]
  if config.algo == "mobile":
    k_noise, k_pi = jax.random.split(key)
    n = config.mobile_num_samples
    samples = s_mean + jnp.sqrt(s_var) * jax.random.normal(k_noise, (n,) + s_mean.shape)
    a_next, _ = nets.policy(samples, k_pi)
    q = _min_q(nets, samples, a_next)                                   # [N, E, B]
    return config.beta * q.mean(axis=0).std(axis=0, ddof=1)
  done = jax.vmap(lambda nxt: term_fn(obs, action, nxt))(s_mean).astype(jnp.float32)
  a_next, _ = nets.policy(s_mean, key)
  m, v = nets.q(s_mean, a_next, s_var)                                  # [C, E, B]
  j = jnp.argmin(m, axis=0)[None]
  m, v = jnp.take_along_axis(m, j, 0)[0], jnp.take_along_axis(v, j, 0)[0]
  t = r_mean + config.gamma * _continue(done, m)
  t_var = r_var + config.gamma ** 2 * _continue(done, v)
  if config.target == "elite_spread":
    return config.beta * t.std(axis=0, ddof=1)
  if config.target == "mixture":
    return config.beta * jnp.sqrt(t_var.mean(axis=0) + t.var(axis=0))
  return config.beta * jnp.sqrt(t_var).mean(axis=0)


def real_transitions(nets: SeedNets, env_name: str, episodes: int, seed: int,
                     every: int = 10, max_episode_steps: Optional[int] = None) -> dict:
  """Runs the deterministic policy (evaluation mode) for `episodes` episodes in the real env and
  keeps the selected_steps of each. Returns numpy obs [B, S], action [B, A], reward [B],
  next_obs [B, S], done [B] (terminated; truncation still bootstraps) and episode [B]."""
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


def uncertainty_quality(nets: SeedNets, batch: dict, key, num_samples: int = 1000) -> dict:
  """bellman_metrics of one seed on real transitions (real_transitions' dict), plus U, B Q, B^ Q."""
  k_u, k_exact, k_sample = jax.random.split(key, 3)
  obs, action = jnp.asarray(batch["obs"]), jnp.asarray(batch["action"])
  u = jax.jit(penalty)(nets, obs, action, k_u)
  exact = jax.jit(exact_bellman, static_argnums=4)(nets, obs, action, k_exact, num_samples)
  sample = jax.jit(sample_bellman, static_argnums=5)(
      nets, jnp.asarray(batch["reward"]), jnp.asarray(batch["next_obs"]),
      jnp.asarray(batch["done"]), k_sample, num_samples)
  out = bellman_metrics(u, exact, sample)
  out.update(u=np.asarray(u), exact=np.asarray(exact), sample=np.asarray(sample))
  return out
