"""k-step model rollouts with the current policy into the synthetic ring buffer (docs/spec.md
section 6).

Pure and jittable; vmap it over seeds. The k steps run in a lax.scan; every step's rows are stacked
and written with one masked `buffer.add` at the end (rows of branches that already terminated are
masked out, so the ring only ever holds real model transitions).

Two rollout rules beside the gymnasium-faithful termination functions (termination.termination_fn):
- runaway: a next state with any |x| >= config.rollout.rollout_obs_limit (100, as the references'
  termination code for all three envs; termination.model_done, which MOMBO's per-elite targets
  share) is written as a terminal row and ends its branch;
- non-finite: a model output (next state, reward, or their variances) that is NaN/inf ends its
  branch and is NOT written, so the ring never holds a row whose target could turn NaN.
"""
import dataclasses
import functools
from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp

from mombo_jax.core import buffer as buffer_lib, dynamics, targets, termination


@dataclasses.dataclass(frozen=True)
class CellRollout:
  """A cell's own rollout settings, where the cells of one program differ in them (train.Cell);
  None: the config's. Each may be traced.

  beta: f32 scalar, the reward penalty's coefficient (MOPO's lambda; default config.beta).
  length: k, int32 scalar <= K = config.rollout.rollout_length (default K).
  capacity: the ring slots the cell uses (buffer.add; default the whole ring).
  """
  beta: Any = None
  length: Any = None
  capacity: Any = None


def run(key, policy_fn: Callable, dyn: dynamics.DynamicsState, start_obs,
        buf: buffer_lib.RingBuffer, config, term_fn: Callable,
        cell: CellRollout = CellRollout()):
  """Rolls out N branches for k steps and stores them in `buf`.

  policy_fn(obs [N, S], key) -> action [N, A]; dyn: one seed's ensemble; start_obs [N, S] real
  states; term_fn(obs, action, next_obs) -> bool [N] (termination.termination_fn); cell: this
  cell's own beta, k and ring capacity (CellRollout; default the config's).
  Each step uses one uniformly random elite per row (dynamics.step) and runs only the elites'
  networks, unless the algorithm's reward penalty reads every member (targets.EnsemblePenalty,
  MOPO's): then the step runs them all, once. A branch that terminates writes its terminal row
  (done = 1) and then stops. Rows carry the producing elite's Gaussian (next_obs_mean/var,
  reward_mean/var) and the state's own variance obs_var (the previous step's next_obs_var; zero at
  step 0). An algorithm with penalise_reward (MOPO) has reward and reward_mean penalised by beta x
  its penalty U of the step's rows (_ModelStep.penalty).

  The scan always runs K steps; steps >= k write nothing and count in no metric, and step i uses
  split(key, K)[i], which under JAX's partitionable threefry is split(key, k)[i]: a k-step
  rollout in a K-step scan writes exactly the rows of a k-step scan.

  Returns (buf, metrics) with scalar metrics: reward (mean over written rows), terminated_frac
  (fraction of branches that ended within k steps: terminal, runaway or non-finite), length (mean
  rows written per branch), next_obs_var (mean over written rows and dims), num_added (rows
  written), nonfinite_frac (fraction of branches ended by a non-finite model output, whose row was
  dropped), and where the reward is penalised, penalty: the mean over written rows of the
  unscaled penalty U (the reward loses beta * U; metrics.csv's rollout/penalty, which older runs
  logged as rollout/mopo_penalty).
  """
  chex.assert_rank(start_obs, 2)
  n, _ = start_obs.shape
  k = config.rollout.rollout_length
  active = jnp.arange(k) < (k if cell.length is None else cell.length)   # bool [K]: step i runs
  penalty = targets.get_penalty(config) if config.algorithm.penalise_reward else None
  step = _ModelStep(policy_fn, dyn, config, term_fn, penalty,
                    config.beta if cell.beta is None else cell.beta)
  init = (start_obs, jnp.zeros_like(start_obs), jnp.ones((n,), bool))
  (_, _, alive_end), (rows, written, dropped, u) = jax.lax.scan(
      step, init, (jax.random.split(key, k), active))
  # [k, N, ...] -> [k * N, ...]: step-major order, so older steps enter the ring first.
  flat = jax.tree.map(lambda x: x.reshape((k * n,) + x.shape[2:]), rows)
  mask = written.reshape(k * n)
  buf = buffer_lib.add(buf, flat, mask, cell.capacity)
  return buf, _metrics(flat, mask, alive_end, dropped, None if penalty is None else u)


# eq=False: hashed by identity, as the closure it stands for (lax.scan hashes its body; the
# ensemble's arrays are no hashable field).
@dataclasses.dataclass(frozen=True, eq=False)
class _ModelStep:
  """One model step of every branch, the body of run's lax.scan: (obs, obs_var, alive) [N, ...]
  and (step key, on: whether step i < k) -> the next carry and (rows, written, dropped, U)."""
  policy_fn: Callable
  dyn: dynamics.DynamicsState
  config: Any
  term_fn: Callable
  penalty: Optional[Callable]     # the algorithm's penalty (resolved) where it penalises the reward
  beta: Any

  def __call__(self, carry, inputs):
    step_key, on = inputs
    obs, obs_var, alive = carry
    k_pi, k_model = jax.random.split(step_key)
    action = self.policy_fn(obs, k_pi)
    chex.assert_rank(action, 2)
    out = dynamics.step(self.dyn, obs, action, k_model, self.config,
                        every_member=isinstance(self.penalty, targets.EnsemblePenalty))
    reward, reward_mean, u = out.reward, out.reward_mean, ()
    if self.penalty is not None:
      u = self.penalty_of(obs, obs_var, action, out, k_model)
      reward = reward - self.beta * u
      reward_mean = reward_mean - self.beta * u
    finite = _all_finite(out.next_obs, out.next_obs_mean, out.next_obs_var, reward, reward_mean,
                         out.reward_var)
    done = termination.model_done(self.term_fn, obs, action, out.next_obs,
                                  self.config.rollout.rollout_obs_limit)
    rows = _rows(obs, obs_var, action, out, reward, reward_mean, done.astype(jnp.float32))
    written = alive & finite & on
    still = written & ~done
    # Ended branches carry zeros, not the model's NaN/inf, into the next step's inputs.
    next_obs = jnp.where(still[:, None], out.next_obs, 0.0)
    next_var = jnp.where(still[:, None], out.next_obs_var, 0.0)
    # A step past the cell's k leaves the branches as they were (alive_end: alive after step k).
    still = jnp.where(on, still, alive)
    return (next_obs, next_var, still), (rows, written, alive & ~finite & on, u)

  def penalty_of(self, obs, obs_var, action, out: dynamics.StepResult, k_model):
    """U [N] of the step's rows: an EnsemblePenalty's from the step's own every-member Gaussians
    (one ensemble forward per step); any other penalty called on the rows (agent None; its key
    folded from the step's model key)."""
    if out.ensemble is not None:
      return self.penalty.of_ensemble(out.ensemble)
    rows = _rows(obs, obs_var, action, out, out.reward, out.reward_mean,
                 jnp.zeros_like(out.reward))
    u = self.penalty(None, rows, jax.random.fold_in(k_model, 1), dyn=self.dyn,
                     config=self.config, term_fn=self.term_fn)
    chex.assert_shape(u, out.reward.shape)
    return u


def _rows(obs, obs_var, action, out: dynamics.StepResult, reward, reward_mean, done):
  """The step's rows as a buffer.Batch [N, ...] (the producing elite's Gaussian from `out`)."""
  return buffer_lib.Batch(
      obs=obs, action=action, reward=reward, next_obs=out.next_obs, done=done, obs_var=obs_var,
      next_obs_mean=out.next_obs_mean, next_obs_var=out.next_obs_var, reward_mean=reward_mean,
      reward_var=out.reward_var)


def _metrics(flat: buffer_lib.Batch, mask, alive_end, dropped, u=None) -> dict:
  """run's metrics from the flat rows [k * N, ...], mask [k * N] (written), alive_end [N],
  dropped [k, N] and U [k, N] (None: the reward is not penalised)."""
  n = alive_end.shape[0]
  n_rows = jnp.sum(mask.astype(jnp.float32))
  denom = jnp.maximum(n_rows, 1.0)

  def masked_mean(x):
    # Selection, not multiplication: a NaN in an unwritten row must not reach the metric.
    return jnp.sum(jnp.where(mask, x, 0.0)) / denom

  metrics = {
      "reward": masked_mean(flat.reward),
      "terminated_frac": 1.0 - jnp.mean(alive_end.astype(jnp.float32)),
      "length": n_rows / n,
      "next_obs_var": masked_mean(jnp.mean(flat.next_obs_var, axis=-1)),
      "num_added": n_rows,
      "nonfinite_frac": jnp.sum(dropped.astype(jnp.float32)) / n,
  }
  if u is not None:
    metrics["penalty"] = masked_mean(u.reshape(mask.shape))
  return metrics


def _all_finite(*arrays):
  """bool [N]: every entry of row n is finite in every array ([N] or [N, D])."""
  ok = [jnp.isfinite(a) if a.ndim == 1 else jnp.all(jnp.isfinite(a), axis=-1) for a in arrays]
  return functools.reduce(jnp.logical_and, ok)
