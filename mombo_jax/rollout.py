"""k-step model rollouts with the current policy into the synthetic ring buffer (SPEC.md section 6).

Pure and jittable; vmap it over seeds. The k steps run in a lax.scan; every step's rows are stacked
and written with one masked `buffer.add` at the end (rows of branches that already terminated are
masked out, so the ring only ever holds real model transitions).
"""
from typing import Callable

import chex
import jax
import jax.numpy as jnp

from mombo_jax import buffer as buffer_lib
from mombo_jax import dynamics


def run(key, policy_fn: Callable, dyn: dynamics.DynamicsState, start_obs,
        buf: buffer_lib.RingBuffer, config, term_fn: Callable):
  """Rolls out N branches for k = config.rollout_length steps and stores them in `buf`.

  policy_fn(obs [N, S], key) -> action [N, A]; dyn: one seed's ensemble; start_obs [N, S] real
  states; term_fn(obs, action, next_obs) -> bool [N] (dynamics.termination_fn).
  Each step uses one uniformly random elite per row (dynamics.step). A branch that terminates
  writes its terminal row (done = 1) and then stops. Rows carry the producing elite's Gaussian
  (next_obs_mean/var, reward_mean/var) and the state's own variance obs_var (the previous step's
  next_obs_var; zero at step 0). MOPO (config.algo == "mopo"): reward and reward_mean are
  penalised by config.beta * mopo_penalty.

  Returns (buf, metrics) with scalar metrics: reward (mean over written rows), terminated_frac
  (fraction of branches that terminated within k steps), length (mean steps per branch),
  mopo_penalty (mean over written rows), next_obs_var (mean over written rows and dims),
  num_added (rows written).
  """
  chex.assert_rank(start_obs, 2)
  n, _ = start_obs.shape
  k = config.rollout_length
  penalise = config.algo == "mopo"

  def one_step(carry, step_key):
    obs, obs_var, alive = carry
    k_pi, k_model = jax.random.split(step_key)
    action = policy_fn(obs, k_pi)
    chex.assert_rank(action, 2)
    out = dynamics.step(dyn, obs, action, k_model, config)
    done = term_fn(obs, action, out.next_obs)
    reward, reward_mean = out.reward, out.reward_mean
    if penalise:
      reward = reward - config.beta * out.mopo_penalty
      reward_mean = reward_mean - config.beta * out.mopo_penalty
    rows = buffer_lib.Batch(
        obs=obs, action=action, reward=reward, next_obs=out.next_obs,
        done=done.astype(jnp.float32), obs_var=obs_var, next_obs_mean=out.next_obs_mean,
        next_obs_var=out.next_obs_var, reward_mean=reward_mean, reward_var=out.reward_var)
    return (out.next_obs, out.next_obs_var, alive & ~done), (rows, alive, out.mopo_penalty)

  init = (start_obs, jnp.zeros_like(start_obs), jnp.ones((n,), bool))
  (_, _, alive_end), (rows, written, penalty) = jax.lax.scan(
      one_step, init, jax.random.split(key, k))
  # [k, N, ...] -> [k * N, ...]: step-major order, so older steps enter the ring first.
  flat = jax.tree.map(lambda x: x.reshape((k * n,) + x.shape[2:]), rows)
  mask = written.reshape(k * n)
  buf = buffer_lib.add(buf, flat, mask)

  w = mask.astype(jnp.float32)
  n_rows = jnp.sum(w)
  denom = jnp.maximum(n_rows, 1.0)
  metrics = {
      "reward": jnp.sum(flat.reward * w) / denom,
      "terminated_frac": 1.0 - jnp.mean(alive_end.astype(jnp.float32)),
      "length": n_rows / n,
      "mopo_penalty": jnp.sum(penalty.reshape(k * n) * w) / denom,
      "next_obs_var": jnp.sum(jnp.mean(flat.next_obs_var, axis=-1) * w) / denom,
      "num_added": n_rows,
  }
  return buf, metrics
