"""This project's MOPO on benchmarks/peers/work.py's work: the config from config.make_config, the
state from train.init_cells, one span = one epoch of cells_program.make_cells_chunk (what
launch.train_runs calls), all through the library, so that changes to mombo_jax's epoch show here
unchanged.
"""
import contextlib
import dataclasses
import functools
import types

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.peers import work as work_lib
from mombo_jax.core import (
  buffer,
  cells_program,
  dynamics,
  placement,
  rewrites,
  rollout,
  sac,
  targets,
  termination,
  train,
)
from mombo_jax.settings import config as config_lib, environment


def make_config(work: work_lib.Work, seeds: int = 1, **overrides):
  """MOPO on hopper at the work's sizes. Every setting of the issue is a Config field:
  num_critics, actor_hidden / critic_hidden (3 x 256), batch_size, steps_per_epoch (the span),
  rollout_batch_size, rollout_length, buffer_retain_epochs, real_ratio, dyn_members / dyn_elites /
  dyn_hidden (7 x 4x200), beta (MOPO's lambda)."""
  hidden = (work.hidden,) * work.layers
  values = dict(num_critics=work.critics, actor_hidden=hidden, critic_hidden=hidden,
                batch_size=work.batch, steps_per_epoch=work.steps,
                rollout_batch_size=work.rollout_batch, rollout_length=work.rollout_length,
                buffer_retain_epochs=work.retain_epochs, real_ratio=work.real_ratio,
                dyn_members=work.members, dyn_elites=work.elites,
                dyn_hidden=(work.dyn_hidden,) * work.dyn_layers, beta=work.penalty,
                num_seeds=seeds, seed=work.seed)
  values.update(overrides)
  return config_lib.make_config("hopper-medium", "mopo", **values)


def real_batch(data: dict) -> buffer.Batch:
  return buffer.from_transitions(types.SimpleNamespace(**data))


class Ours:
  """`seeds` cells (seeds work.seed ..) in one program: span() runs one epoch of all of them."""

  def __init__(self, work: work_lib.Work, data: dict, seeds: int = 1, **overrides):
    self.work, self.seeds = work, seeds
    config = make_config(work, seeds, **overrides)
    self.config = config
    real = real_batch(data)
    seed_keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(work.seed, work.seed + seeds))
    init_keys, self.keys = (jax.vmap(jax.random.fold_in, (0, None))(seed_keys, i) for i in (1, 2))
    dyn = jax.jit(jax.vmap(lambda k: dynamics.init_state(k, work_lib.OBS, work_lib.ACT, config)))(
        init_keys)
    state = jax.jit(train.init_cells, static_argnums=1)(init_keys, config, real, dyn)
    stacked, cells = train.single_dataset(real, config, seeds)
    self.state = placement.shard_cells(state)
    self.stacked, self.cells = placement.replicate(stacked), placement.shard_cells(cells)
    self.keys = placement.shard_cells(self.keys)
    self.choices = rewrites.choose(environment.predict_rows(), environment.critic_matmul())
    self.chunk = cells_program.make_cells_chunk(config, seeds, 1, layout=environment.cells(),
                                                choices=self.choices,
                                                cpu_dots=environment.cpu_dots())
    self.epoch = 0
    # One seed's pieces (profile.py and the FLOP count).
    self.real, self.dyn1 = real, jax.tree.map(lambda x: x[0], dyn)
    self.term_fn = termination.termination_fn(config.env_name)

  def compile(self):
    seconds, self.compiled = work_lib.timed(lambda: self.chunk.lower(
        self.state, self.stacked, self.keys, self.cells, 0, 1).compile())
    return seconds

  def span(self) -> float:
    """One epoch (rollout + steps) of every cell, compiled beforehand; returns its seconds."""
    seconds, (self.state, _) = work_lib.timed(self.compiled, self.state, self.stacked, self.keys,
                                              self.cells, self.epoch, 1)
    self.epoch += 1
    return seconds

  def epoch_jaxpr_flops(self) -> float:
    """FLOPs of one span from the epoch's jaxpr (benchmarks/common.jaxpr_flops: scans times their
    lengths; the chunk's epoch loop counts once, = one epoch)."""
    from benchmarks import common
    # __wrapped__: a program compiled with compiler options cannot be traced inside make_jaxpr.
    return common.jaxpr_flops(self.chunk.__wrapped__, self.state, self.stacked, self.keys,
                              self.cells, 0, 1)

  # ---- one seed's pieces, as make_epoch runs them (profile.py and the FLOP count) -------------

  @contextlib.contextmanager
  def one_piece(self):
    """The rollout traced in one piece (rewrites.Rewrites.predict_rows None), the same arithmetic
    as in pieces: for XLA's FLOP count, which counts the pieces' loop body once."""
    with rewrites.tracing(dataclasses.replace(self.choices, predict_rows=None)):
      yield

  def _agent_ring(self):
    one = jax.tree.map(lambda x: x[0], self.state)
    return one.agent, one.buffer

  def rollout_piece(self):
    """(fn, args): start states drawn, rollout.run (model steps + buffer.add), as make_epoch."""
    config = self.config

    def fn(key, agent, ring):
      k_start, k_roll = jax.random.split(key)
      start = jax.random.randint(k_start, (config.rollout.rollout_batch_size,), 0,
                                 self.real.reward.shape[0])
      policy_fn = functools.partial(train._policy, agent, config)
      return rollout.run(k_roll, policy_fn, self.dyn1, buffer.take(self.real, start).obs, ring,
                         config, self.term_fn)
    agent, ring = self._agent_ring()
    return fn, (jax.random.PRNGKey(1), agent, ring)

  def target_fn(self):
    return functools.partial(targets.get_target(self.config), dyn=self.dyn1, config=self.config,
                             term_fn=self.term_fn)

  def step_piece(self):
    """(fn, args): one gradient step as make_epoch's scan body: buffer.sample_mixed + sac.update."""
    config, target_fn = self.config, self.target_fn()
    n_real = buffer.real_rows(config.agent.batch_size, config.rollout.real_ratio)

    def fn(agent, ring, key):
      k_batch, k_update = jax.random.split(key)
      batch = buffer.sample_mixed(self.real, ring, k_batch, config.agent.batch_size, n_real)
      return sac.update(agent, batch, k_update, target_fn, config)
    agent, ring = self._agent_ring()
    return fn, (agent, ring, jax.random.PRNGKey(3))

  def sample_piece(self):
    config = self.config
    n_real = buffer.real_rows(config.agent.batch_size, config.rollout.real_ratio)

    def fn(key, ring):
      return buffer.sample_mixed(self.real, ring, key, config.agent.batch_size, n_real)
    return fn, (jax.random.PRNGKey(2), self._agent_ring()[1])

  def write_piece(self):
    """(fn, args): buffer.add of one rollout's rows (all masked in), as rollout.run writes them."""
    ring = self._agent_ring()[1]
    n = self.config.rollout.rollout_batch_size * self.config.rollout.rollout_length
    rows = jax.tree.map(lambda x: jnp.ones((n,) + x.shape[1:], x.dtype), ring.data)
    return buffer.add, (ring, rows, jnp.asarray(np.ones(n, bool)))
