"""The offline training epoch: one model rollout into the ring buffer, then `lax.scan` over the
epoch's gradient steps on mixed real/synthetic batches. Pure; jit-compiled once, vmapped over seeds.

Never imports gymnasium, Minari, Orbax or absl: data comes in as arrays.
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


def init(key, config, real: buffer.Batch, dyn) -> TrainState:
  """Fresh state of one seed. real: the real dataset as a Batch [N, ...]; dyn: this seed's model."""
  obs_dim, action_dim = real.obs.shape[-1], real.action.shape[-1]
  agent = sac.init_agent(key, obs_dim, action_dim, config,
                         total_steps=config.epochs * config.steps_per_epoch)
  ring = buffer.init_ring(config.synthetic_capacity, obs_dim, action_dim)
  return TrainState(agent=agent, buffer=ring, dynamics=dyn, epoch=jnp.zeros((), jnp.int32))


def init_seeds(keys, config, real, dyn):
  """init vmapped over seeds: keys [S, 2], dyn with a leading seed axis S."""
  return jax.vmap(init, in_axes=(0, None, None, 0))(keys, config, real, dyn)


def make_epoch(config):
  """Returns a pure epoch(state, real, key) -> (state, metrics) of one seed.

  real: the real dataset, Batch [N, ...] (shared by all seeds: vmap it with in_axes None).
  metrics: {name: [steps_per_epoch]} per gradient step, plus rollout statistics (scalars).
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
    metrics = dict(step_metrics)
    metrics.update({f"rollout/{k}": v for k, v in roll_metrics.items()})
    return state.replace(agent=agent, buffer=ring, epoch=state.epoch + 1), metrics

  return epoch


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
