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
import functools
from typing import Callable

import chex
import jax
import jax.numpy as jnp

from mombo_jax.core import buffer as buffer_lib, dynamics, targets, termination


def run(key, policy_fn: Callable, dyn: dynamics.DynamicsState, start_obs,
        buf: buffer_lib.RingBuffer, config, term_fn: Callable, beta=None, length=None,
        capacity=None):
  """Rolls out N branches for k steps and stores them in `buf`.

  policy_fn(obs [N, S], key) -> action [N, A]; dyn: one seed's ensemble; start_obs [N, S] real
  states; term_fn(obs, action, next_obs) -> bool [N] (termination.termination_fn).
  Each step uses one uniformly random elite per row (dynamics.step) and runs only the elites'
  networks, except for MOPO, whose penalty needs every member's. A branch that terminates
  writes its terminal row (done = 1) and then stops. Rows carry the producing elite's Gaussian
  (next_obs_mean/var, reward_mean/var) and the state's own variance obs_var (the previous step's
  next_obs_var; zero at step 0). MOPO (config.algorithm.penalize_reward): reward and reward_mean are
  penalised by beta * mopo_penalty (beta: f32 scalar, may be traced; default config.beta); another
  record with penalize_reward by beta * its own `penalty` (agent None, the step's rows as batch).

  length: k, int32 scalar <= K = config.rollout.rollout_length (may be traced: a cell's own rollout
  length in a program of several, train.Cell; default K). The scan always runs K steps; steps
  >= k write nothing and count in no metric, and step i uses split(key, K)[i], which under JAX's
  partitionable threefry is split(key, k)[i]: a k-step rollout in a K-step scan writes exactly
  the rows of a k-step scan. capacity: the ring slots this cell uses (buffer.add; default the
  whole ring).

  Returns (buf, metrics) with scalar metrics: reward (mean over written rows), terminated_frac
  (fraction of branches that ended within k steps: terminal, runaway or non-finite), length (mean
  rows written per branch), next_obs_var (mean over written rows and dims), num_added (rows
  written), nonfinite_frac (fraction of branches ended by a non-finite model output, whose row was
  dropped), and where the reward is penalised (MOPO, or a record with penalize_reward) penalty:
  the mean over written rows of the unscaled penalty U (the reward loses beta * U; metrics.csv's
  rollout/penalty, which older runs logged as rollout/mopo_penalty).
  """
  # One function: one lax.scan over the K model steps whose step closes over the policy, the
  # ensemble and the termination function; split, its pieces would pass the step's arrays around.
  chex.assert_rank(start_obs, 2)
  n, _ = start_obs.shape
  k = config.rollout.rollout_length
  active = jnp.arange(k) < (k if length is None else length)     # bool [K]: step i runs
  penalise = config.algorithm.penalize_reward
  # MOPO's penalty comes out of the step itself (every member's prediction: ONE ensemble forward
  # per model step); another record that penalises the reward brings its own penalty (called on
  # the step's rows). Compared as resolved functions: a built-in record holds a stand-in.
  penalty_fn = targets.get_penalty(config) if penalise else None
  own_penalty = penalise and penalty_fn is not targets.penalty_mopo
  beta = config.beta if beta is None else beta

  def one_step(carry, inputs):
    step_key, on = inputs
    obs, obs_var, alive = carry
    k_pi, k_model = jax.random.split(step_key)
    action = policy_fn(obs, k_pi)
    chex.assert_rank(action, 2)
    out = dynamics.step(dyn, obs, action, k_model, config, penalty=penalise and not own_penalty)
    reward, reward_mean = out.reward, out.reward_mean
    penalty = out.mopo_penalty
    if own_penalty:
      rows = buffer_lib.Batch(
          obs=obs, action=action, reward=out.reward, next_obs=out.next_obs,
          done=jnp.zeros_like(out.reward), obs_var=obs_var, next_obs_mean=out.next_obs_mean,
          next_obs_var=out.next_obs_var, reward_mean=out.reward_mean, reward_var=out.reward_var)
      penalty = penalty_fn(None, rows, jax.random.fold_in(k_model, 1), dyn=dyn, config=config,
                           term_fn=term_fn)
      chex.assert_shape(penalty, (n,))
    if penalise:
      reward = reward - beta * penalty
      reward_mean = reward_mean - beta * penalty
    finite = _all_finite(out.next_obs, out.next_obs_mean, out.next_obs_var, reward, reward_mean,
                         out.reward_var)
    done = termination.model_done(term_fn, obs, action, out.next_obs,
                                  config.rollout.rollout_obs_limit)
    rows = buffer_lib.Batch(
        obs=obs, action=action, reward=reward, next_obs=out.next_obs,
        done=done.astype(jnp.float32), obs_var=obs_var, next_obs_mean=out.next_obs_mean,
        next_obs_var=out.next_obs_var, reward_mean=reward_mean, reward_var=out.reward_var)
    written = alive & finite & on
    still = written & ~done
    # Ended branches carry zeros, not the model's NaN/inf, into the next step's inputs.
    next_obs = jnp.where(still[:, None], out.next_obs, 0.0)
    next_var = jnp.where(still[:, None], out.next_obs_var, 0.0)
    # A step past the cell's k leaves the branches as they were (alive_end: alive after step k).
    still = jnp.where(on, still, alive)
    return (next_obs, next_var, still), (rows, written, alive & ~finite & on,
                                         penalty if penalise else ())

  init = (start_obs, jnp.zeros_like(start_obs), jnp.ones((n,), bool))
  (_, _, alive_end), (rows, written, dropped, penalty) = jax.lax.scan(
      one_step, init, (jax.random.split(key, k), active))
  # [k, N, ...] -> [k * N, ...]: step-major order, so older steps enter the ring first.
  flat = jax.tree.map(lambda x: x.reshape((k * n,) + x.shape[2:]), rows)
  mask = written.reshape(k * n)
  buf = buffer_lib.add(buf, flat, mask, capacity)

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
  if penalise:
    metrics["penalty"] = masked_mean(penalty.reshape(k * n))
  return buf, metrics


def _all_finite(*arrays):
  """bool [N]: every entry of row n is finite in every array ([N] or [N, D])."""
  ok = [jnp.isfinite(a) if a.ndim == 1 else jnp.all(jnp.isfinite(a), axis=-1) for a in arrays]
  return functools.reduce(jnp.logical_and, ok)
