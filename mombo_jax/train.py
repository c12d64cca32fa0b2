"""The offline training epoch: one model rollout into the ring buffer, then `lax.scan` over the
epoch's gradient steps on mixed real/synthetic batches. Pure; jit-compiled once, vmapped over seeds.

Never imports gymnasium, Minari, Orbax or absl: data comes in as arrays.

Divergence is handled per seed inside the compiled epoch: after the gradient steps, a seed whose
step losses (critic, actor, alpha) went non-finite or beyond +-config.max_abs_loss, or whose agent
(parameters, target parameters, optimiser states) holds a non-finite value, keeps the agent it
entered the epoch with (its last healthy one) and is marked `diverged` for good. The selection is a
per-seed `jnp.where`, so the other seeds' computations are untouched (no lax.cond under vmap). A
diverged seed's step metrics may be NaN: consumers mask them with metrics["diverged"].
"""
import dataclasses
import functools

import chex
import flax.struct as struct
import jax
import jax.numpy as jnp

from mombo_jax import buffer, dynamics, rollout, sac, targets


class TrainState(struct.PyTreeNode):
  """Everything of one seed that changes during training (vmapped: a leading seed axis)."""
  agent: sac.AgentState
  buffer: buffer.RingBuffer
  dynamics: dynamics.DynamicsState
  epoch: jax.Array          # int32 scalar: epochs completed
  diverged: jax.Array       # bool scalar: frozen at its last healthy agent (see module docstring)


def init(key, config, real: buffer.Batch, dyn) -> TrainState:
  """Fresh state of one seed. real: the real dataset as a Batch [N, ...]; dyn: this seed's model."""
  obs_dim, action_dim = real.obs.shape[-1], real.action.shape[-1]
  agent = sac.init_agent(key, obs_dim, action_dim, config,
                         total_steps=config.epochs * config.steps_per_epoch)
  ring = buffer.init_ring(config.synthetic_capacity, obs_dim, action_dim)
  return TrainState(agent=agent, buffer=ring, dynamics=dyn, epoch=jnp.zeros((), jnp.int32),
                    diverged=jnp.zeros((), bool))


def init_seeds(keys, config, real, dyn):
  """init vmapped over seeds: keys [S, 2], dyn with a leading seed axis S."""
  return jax.vmap(init, in_axes=(0, None, None, 0))(keys, config, real, dyn)


def make_epoch(config):
  """Returns a pure epoch(state, real, key) -> (state, metrics) of one seed.

  real: the real dataset, Batch [N, ...] (shared by all seeds: vmap it with in_axes None).
  metrics: {name: [steps_per_epoch]} per gradient step, plus rollout statistics (scalars),
  `diverged` (bool scalar: the seed is frozen, this epoch or before) and `diverged/<quantity>` (bool
  scalars, quantity in DIVERGENCE_CHECKS: which check failed THIS epoch on a healthy seed).
  """
  target = targets.get_target(config)
  term_fn = dynamics.termination_fn(config.env_name)

  def epoch(state: TrainState, real: buffer.Batch, key):
    chex.assert_rank(real.obs, 2)
    k_start, k_roll, k_steps = jax.random.split(key, 3)
    agent, dyn = state.agent, state.dynamics
    start = jax.random.randint(k_start, (config.rollout_batch_size,), 0, real.obs.shape[0])
    policy_fn = functools.partial(_policy, agent, config)
    ring, roll_metrics = rollout.run(k_roll, policy_fn, dyn, real.obs[start], state.buffer, config,
                                     term_fn)
    target_fn = functools.partial(target, dyn=dyn, config=config, term_fn=term_fn)

    def step(agent, k):
      k_batch, k_update = jax.random.split(k)
      batch = buffer.sample_mixed(real, ring, k_batch, config.batch_size, config.real_ratio)
      return sac.update(agent, batch, k_update, target_fn, config)

    agent, step_metrics = jax.lax.scan(step, agent,
                                       jax.random.split(k_steps, config.steps_per_epoch))
    failed = health_checks(agent, step_metrics, config)
    newly = functools.reduce(jnp.logical_or, failed.values())
    diverged = state.diverged | newly
    # Selection per seed: the frozen seed keeps its input agent; its ring buffer may take the new
    # rows (it is never trained on again) so no second copy of the large buffer is kept.
    agent = jax.tree.map(lambda new, old: jnp.where(diverged, old, new), agent, state.agent)
    metrics = dict(step_metrics)
    metrics.update({f"rollout/{k}": v for k, v in roll_metrics.items()})
    metrics["diverged"] = diverged
    metrics.update({f"diverged/{k}": v & ~state.diverged for k, v in failed.items()})
    return state.replace(agent=agent, buffer=ring, epoch=state.epoch + 1,
                         diverged=diverged), metrics

  return epoch


DIVERGENCE_CHECKS = ("critic_loss", "actor_loss", "alpha_loss", "params")


def health_checks(agent: sac.AgentState, step_metrics: dict, config) -> dict:
  """{quantity: bool scalar, True = failed} for one seed after an epoch's gradient steps.

  step_metrics[name]: [steps] losses of the epoch; a loss fails when any step is non-finite or
  beyond +-config.max_abs_loss (a finite explosion, e.g. beta=1e18, is a divergence too).
  `params`: any non-finite floating leaf of the agent (parameters, targets, optimiser states).
  """
  failed = {}
  for name in DIVERGENCE_CHECKS[:-1]:
    x = step_metrics[name]
    failed[name] = ~jnp.all(jnp.isfinite(x) & (jnp.abs(x) <= config.max_abs_loss))
  leaves = [x for x in jax.tree.leaves(agent) if jnp.issubdtype(x.dtype, jnp.inexact)]
  failed["params"] = ~functools.reduce(jnp.logical_and,
                                       [jnp.all(jnp.isfinite(x)) for x in leaves])
  return failed


def _policy(agent, config, obs, key):
  return sac.policy_sample(agent, obs, key, config)


def make_seeds_epoch(config):
  """jit(vmap(epoch)) over a leading seed axis of state and key; the dataset is shared.

  The state argument is donated: its buffers (the ring buffer above all) are reused in place.
  Cached per config (ignoring fields the epoch never reads), so runs in one process share the
  compiled function.
  """
  return _seeds_epoch(dataclasses.replace(config, seed=0, num_seeds=1, eval_every=1,
                                          eval_episodes=1))


@functools.lru_cache(maxsize=16)
def _seeds_epoch(config):
  return jax.jit(jax.vmap(make_epoch(config), in_axes=(0, None, 0)), donate_argnums=0)
