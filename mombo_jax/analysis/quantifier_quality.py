"""The paper's Table 2 on trained runs (appendix "Uncertainty quantifier experiment";
docs/protocol.md, "Table 2 (uncertainty quantifiers): the reading"; experiments.uncertainty): how
often, and how tightly, each algorithm's own uncertainty quantifier U bounds the error of a
single-sample Bellman backup.

For a tuple (s, a, r, s'_real, d) and M draws of the learned model:
  B Q(s, a)       = r + g (1-d) mean_{i <= num_policy} min_j Q'(s'_real, a'_i), a'_i ~ pi(s'_real)
  B^ Q(s, a, s^') = r^ + g (1-d^) min_j Q'(s^', a^'), (s^', r^) ONE draw of the model (a
                    uniformly random elite, as in rollouts), a^' ~ pi(s^') one sample, d^ the
                    termination fn
  accuracy        = mean over draws of 1(U >= |B Q - B^ Q|), tightness = mean of U - |B Q - B^ Q|,
U the per-row penalty training subtracts (targets.get_penalty, times beta), drawn with each draw
(it is random for every algorithm but MOPO: policy samples, MOBILE's next-state samples, and for
lcb the Gaussian of the elite that drew s^'). Both backups are deterministic (no entropy term).
Only B Q is an expectation: averaging B^ Q over draws too would remove the single-sample error U
is meant to bound.

The two readings the paper leaves open are measured beside it, on the same draws (the same s^',
a^' and d^):
  real_reward  B^ Q with the tuple's real reward: r + g (1-d^) min_j Q'(s^', a^') (the paper's
               B^ Q(s, a, s') = r(s, a) + g Q(s', pi(s')) writes the reward function, not a
               model's), scored against the algorithm's own U;
  eq1          MOMBO's U as eq. (1) writes it, g sigma_MM, with the reward-variance term of the
               target that implements it (targets.penalty_mombo_lcb): sqrt(var_r^ + g^2 (1-d^) v*)
               from the Gaussian of the elite that drew s^' (MOMBO runs only; for a lcb run it is
               its own U), scored against the model-reward B^ Q.

Shapes: B = tuples, S = obs dim, A = action dim, M = model draws, P = policy samples.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import chex
import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax.analysis.trained import SeedNets
from mombo_jax.core import buffer, dynamics, targets, termination

# The targets' own terminal rule (selection: a NaN behind a terminal stays out), not a copy.
from mombo_jax.core.targets import _continue
from mombo_jax.env import envs
from mombo_jax.errors import InvalidArgument


def selected_steps(length: int, every: int = 10) -> np.ndarray:
  """Indices of the transitions kept from an episode of `length` steps: every `every`-th step
  (the 10th, 20th, ...: indices every-1, 2*every-1, ...) and the last one."""
  idx = np.arange(every - 1, length, every)
  if length and (not idx.size or idx[-1] != length - 1):
    idx = np.append(idx, length - 1)
  return idx


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
  next_obs_p = jnp.broadcast_to(next_obs, (num_policy,) + next_obs.shape)   # [P, B, S]
  value = q_fn(next_obs_p, policy_fn(next_obs_p, key)).mean(axis=0)         # [B]
  out = reward + gamma * _continue(done, value)
  chex.assert_shape(out, reward.shape)
  return out


class Draw(NamedTuple):
  """What draw_fn returns: one model draw per row. next_obs [B, S] (s^'), reward [B] (r^), done
  [B] (d^), u [B] (the algorithm's own U, unscaled), u_eq1 [B] or None (MOMBO's U as eq. (1), the
  `eq1` reading; None: not computed). A plain 4-tuple is read as u_eq1=None."""
  next_obs: Any
  reward: Any
  done: Any
  u: Any
  u_eq1: Any = None


def sample_bellman(policy_fn: Callable, q_fn: Callable, draw_fn: Callable, obs, action, key, *,
                   gamma: float, reward=None) -> dict:
  """One draw: {"sample": B^ Q(s, a, s^') [B], "u": U [B] unscaled} with draw_fn(obs, action, k)
  one model draw per row (Draw: s^', r^, d^, U) and B^ Q = r^ + g (1 - d^) q(s^', a^'), a^' ~
  pi(s^') one sample; plus "sample_real_reward" = reward + g (1 - d^) q(s^', a^') (the same
  q) when the real `reward` [B] is given, and "u_eq1" [B] when the draw has it.

  draw_fn(obs [B, S], action [B, A], key) -> Draw or (next_obs [B, S], reward [B], done [B],
  u [B]).
  """
  k_draw, k_pi = jax.random.split(key)
  draw = Draw(*draw_fn(obs, action, k_draw))
  chex.assert_equal_shape([draw.next_obs, obs])
  chex.assert_shape([draw.reward, draw.done, draw.u], obs.shape[:1])
  value = gamma * _continue(draw.done, q_fn(draw.next_obs, policy_fn(draw.next_obs, k_pi)))
  out = dict(sample=draw.reward + value, u=draw.u)
  if reward is not None:
    chex.assert_equal_shape([reward, draw.reward])
    out["sample_real_reward"] = reward + value
  if draw.u_eq1 is not None:
    chex.assert_equal_shape([draw.u_eq1, draw.u])
    out["u_eq1"] = draw.u_eq1
  return out


class Tuples(NamedTuple):
  """Tuples (s, a, r, s'_real, d) of the real environment: obs [B, S], action [B, A], reward [B],
  next_obs [B, S], done [B]."""
  obs: Any
  action: Any
  reward: Any
  next_obs: Any
  done: Any


def bellman_gaps(policy_fn: Callable, q_fn: Callable, draw_fn: Callable, tuples: Tuples, key, *,
                 gamma: float, num_draws: int = 100, num_policy: int = 1000) -> dict:
  """The core of the experiment on `tuples` of the real environment, from plain callables
  (closed-form pieces in tests; a trained run's networks in `uncertainty_quality`): see
  exact_bellman, sample_bellman.

  Returns {"exact": B Q [B], "sample": B^ Q [M, B], "u": U [M, B] (unscaled), "sample_real_reward":
  B^ Q with the real reward [M, B], and "u_eq1": [M, B] where draw_fn gives it}, M = num_draws
  independent draws (sequential: memory of one draw).
  """
  obs, action, reward, next_obs, done = tuples
  chex.assert_rank([obs, action, next_obs, reward, done], [2, 2, 2, 1, 1])
  chex.assert_equal_shape_prefix([obs, action, next_obs, reward, done], 1)
  k_exact, k_draws = jax.random.split(key)
  exact = exact_bellman(policy_fn, q_fn, reward, next_obs, done, k_exact, gamma=gamma,
                        num_policy=num_policy)
  draws = jax.lax.map(
      lambda k: sample_bellman(policy_fn, q_fn, draw_fn, obs, action, k, gamma=gamma,
                               reward=reward),
      jax.random.split(k_draws, num_draws))
  chex.assert_shape(list(draws.values()), (num_draws, obs.shape[0]))
  return dict(exact=exact, **draws)


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


# The readings measured beside the chosen one (module docstring): name -> (B^ Q key, U key) of
# bellman_gaps' result.
READINGS = {"real_reward": ("sample_real_reward", "u"), "eq1": ("sample", "u_eq1")}


def reading_scores(gaps: dict, scale: float) -> dict:
  """quantifier_scores of every READINGS entry gaps holds (exact [B] and [M, B] arrays, as
  bellman_gaps returns them), each key suffixed with the reading: accuracy_real_reward [B],
  tightness_unscaled_eq1 [B], penalty_eq1_mean, bellman_error_real_reward_mean, ..."""
  out = {}
  for name, (sample, u) in READINGS.items():
    if sample in gaps and u in gaps:
      scores = quantifier_scores(gaps["exact"], gaps[sample], gaps[u], scale)
      out.update({(f"{k[:-5]}_{name}_mean" if k.endswith("_mean") else f"{k}_{name}"): v
                  for k, v in scores.items()})
  return out


def bellman_metrics(u, exact, sample) -> dict:
  """Per-transition accuracy 1(U >= |B Q - B^ Q|) and tightness U - |B Q - B^ Q| (paper appendix)
  for U, B^ Q [B] (or [M, B]: averaged over the M draws) and B Q [B]; returns {"accuracy": [B],
  "tightness": [B]} and their means ("accuracy_mean", "tightness_mean")."""
  s = quantifier_scores(exact, sample, u, 1.0)
  return {k: s[k] for k in ("accuracy", "tightness", "accuracy_mean", "tightness_mean")}


def model_done(config, term_fn: Callable, obs, action, next_obs):
  """d^ [B] float32 of a model draw as rollout.run marks it: the termination function, or a runaway
  state (any |x| >= config.rollout.rollout_obs_limit, which ends a rollout branch as terminal)."""
  done = termination.model_done(term_fn, obs, action, next_obs, config.rollout.rollout_obs_limit)
  return done.astype(jnp.float32)


def model_draw(nets: SeedNets, obs, action, key, eq1: bool = False):
  """One draw of the run's learned model per row, as a rollout writes it, and that row's penalty.

  obs [B, S], action [B, A]. (s^', r^) from a uniformly random elite per row (dynamics.step, the
  rollouts' own step); d^ = model_done. Returns (row, u): row a buffer.Batch [B, ...] carrying the
  producing elite's Gaussian (what a rollout row stores; reward = r^ unpenalised, also for MOPO:
  B^ uses the model's estimate of r and MOPO's penalty is its U), u [B] the UNSCALED penalty of the
  row, `penalty(nets, row, key)`. eq1=True: (row, u, u_eq1), u_eq1 [B] = penalty_eq1 of the row
  with u's key (so a lcb run's u_eq1 is its u).
  """
  config = nets.config
  term_fn = termination.termination_fn(config.env_name)
  k_step, k_u = jax.random.split(key)
  out = dynamics.step(nets.dyn, obs, action, k_step, config)
  row = buffer.Batch(obs=obs, action=action, reward=out.reward, next_obs=out.next_obs,
                     done=model_done(config, term_fn, obs, action, out.next_obs),
                     obs_var=jnp.zeros_like(obs), next_obs_mean=out.next_obs_mean,
                     next_obs_var=out.next_obs_var, reward_mean=out.reward_mean,
                     reward_var=out.reward_var)
  if eq1:
    return row, penalty(nets, row, k_u), penalty_eq1(nets, row, k_u)
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
  members of ||sigma||_2 (targets.max_std_norm).
  """
  config = nets.config
  u = targets.get_penalty(config)(nets.agent(), rows, key, dyn=nets.dyn, config=config,
                                  term_fn=termination.termination_fn(config.env_name))
  return config.beta * u if scaled else u


def penalty_eq1(nets: SeedNets, rows, key):
  """MOMBO's U as eq. (1) [B], unscaled, on model rows (buffer.Batch [B, ...] carrying the Gaussian
  of the elite that drew each row): eq. (1)'s g sigma_MM(s', pi(s')) with the reward variance the
  target adds, sqrt(var_r + g^2 (1-d) v*), v* the MM variance of the target critic with the smaller
  MM mean at (next_obs_mean, a' ~ pi(next_obs_mean)) with input variance next_obs_var: the very
  function MOMBO lcb's target calls (targets.penalty_mombo_lcb), whatever the run's target."""
  return targets.penalty_mombo_lcb(nets.agent(), rows, key, config=nets.config)


def seed_functions(nets: SeedNets):
  """(policy_fn, q_fn, draw_fn) of one trained seed for bellman_gaps: a' ~ pi, min over the target
  critics of Q' (plain, zero input variance), and model_draw's Draw (s^', r^, d^, u, and for a
  MOMBO run u_eq1)."""
  def draw_fn(obs, action, key):
    if nets.config.algorithm.moment_matching:
      row, u, u_eq1 = model_draw(nets, obs, action, key, eq1=True)
      return Draw(row.next_obs, row.reward, row.done, u, u_eq1)
    row, u = model_draw(nets, obs, action, key)
    return Draw(row.next_obs, row.reward, row.done, u)

  return (lambda obs, key: nets.policy(obs, key)[0],
          lambda obs, action: nets.q(obs, action).min(axis=0), draw_fn)


@functools.partial(jax.jit, static_argnames=("num_draws", "num_policy"))
def _seed_gaps(nets, tuples, key, num_draws, num_policy):
  # The networks are an argument, never closed over: XLA would fold the weights in as constants.
  policy_fn, q_fn, draw_fn = seed_functions(nets)
  return bellman_gaps(policy_fn, q_fn, draw_fn, tuples, key,
                      gamma=nets.config.agent.gamma, num_draws=num_draws, num_policy=num_policy)


def _chunk_rows(n: int, chunk: int) -> int:
  """Rows per jitted call: `chunk`, or for fewer tuples the next power of two (>= 8), so seeds with
  different tuple counts share a few compiled shapes."""
  return min(int(chunk), max(8, 1 << max(0, int(n) - 1).bit_length()))


def uncertainty_quality(nets: SeedNets, batch: dict, key, num_draws: int = 100,
                        num_policy: int = 1000, chunk: int = 256) -> dict:
  """quantifier_scores of one seed on tuples batch = {obs [B, S], action [B, A], reward [B],
  next_obs [B, S], done [B]} (real_transitions' or dataset_states' dict), with U scaled by the
  run's beta, and reading_scores (the readings beside it, keys suffixed _real_reward / _eq1; _eq1
  for MOMBO runs only); plus exact [B], sample [M, B], u [M, B] (unscaled), sample_real_reward
  [M, B] and (MOMBO) u_eq1 [M, B].

  Tuples go through in jitted chunks of `chunk` rows (the last one padded with copies of its first
  row, dropped after): memory is num_policy x chunk critic rows for B Q, and few compilations.
  """
  arrays = {k: np.asarray(batch[k], np.float32) for k in Tuples._fields}
  n = arrays["reward"].shape[0]
  if n == 0:
    raise InvalidArgument("No tuples to evaluate the uncertainty quantifier on.")
  size = _chunk_rows(n, chunk)
  parts = []
  for i, lo in enumerate(range(0, n, size)):
    take = np.arange(lo, lo + size)
    take = np.where(take < n, take, lo)
    res = _seed_gaps(nets, Tuples(*(jnp.asarray(arrays[k][take]) for k in Tuples._fields)),
                     jax.random.fold_in(key, i), num_draws, num_policy)
    keep = min(size, n - lo)
    parts.append(jax.tree.map(lambda x, keep=keep: np.asarray(x)[..., :keep], res))
  gaps = {k: np.concatenate([p[k] for p in parts], axis=-1) for k in parts[0]}
  out = quantifier_scores(gaps["exact"], gaps["sample"], gaps["u"], float(nets.config.beta))
  out.update(reading_scores(gaps, float(nets.config.beta)))
  out.update(gaps)
  return out


def real_transitions(nets: SeedNets, env_name, episodes: int, seed: int,
                     every: int = 10, max_episode_steps: Optional[int] = None) -> dict:
  """--states=policy (the paper's): runs the deterministic policy (evaluation mode) for `episodes`
  episodes in the real env (episode i reset with seed * 1000 + i) and keeps the selected_steps of
  each. env_name: what envs.make_env takes; the run's dataset (its envs.eval_env_spec: the env
  its evaluation used, e.g. D4RL's walker model for an imported D4RL walker dataset). Returns
  numpy obs [B, S], action [B, A] (the policy's, in [-1, 1]), reward [B], next_obs [B, S],
  done [B] (terminated; truncation still bootstraps) and episode [B]."""
  policy = jax.jit(SeedNets.policy_mode)
  recorded = envs.run_episodes(
      lambda: envs.make_env(env_name, max_episode_steps=max_episode_steps),
      lambda obs: policy(nets, jnp.asarray(obs)), episodes, int(seed) * 1000)
  rows = {k: [] for k in ("obs", "action", "reward", "next_obs", "done", "episode")}
  for ep, episode in enumerate(recorded):
    for i in selected_steps(len(episode["rewards"]), every):
      rows["obs"].append(episode["observations"][i])
      rows["action"].append(episode["actions"][i])
      rows["reward"].append(episode["rewards"][i])
      rows["next_obs"].append(episode["observations"][i + 1])
      rows["done"].append(float(episode["terminations"][i]))
      rows["episode"].append(ep)
  return {k: np.asarray(v, np.int64 if k == "episode" else np.float32) for k, v in rows.items()}


def dataset_states(transitions, num_states: int = 1000, seed: int = 0) -> dict:
  """--states=dataset: num_states transitions of a dataset (data.Transitions) drawn without
  replacement with np.random.default_rng(seed) (all of them if it holds fewer), so every algorithm
  and seed trained on that dataset is scored on the very same tuples (no policy-quality confound).
  Returns numpy obs [B, S], action [B, A], reward [B], next_obs [B, S], done [B] (terminals;
  truncations bootstrap) and index [B] (row in the dataset, sorted)."""
  n = len(transitions.rewards)
  if n == 0:
    raise InvalidArgument("The dataset holds no transitions.")
  idx = np.sort(np.random.default_rng(seed).choice(n, min(int(num_states), n), replace=False))
  return dict(obs=np.asarray(transitions.observations[idx], np.float32),
              action=np.asarray(transitions.actions[idx], np.float32),
              reward=np.asarray(transitions.rewards[idx], np.float32),
              next_obs=np.asarray(transitions.next_observations[idx], np.float32),
              done=np.asarray(transitions.terminals[idx], np.float32), index=idx.astype(np.int64))
