"""The offline training epoch: one model rollout into the ring buffer, then `lax.scan` over the
epoch's gradient steps on mixed real/synthetic batches. Pure; jit-compiled once, vmapped over cells
(a cell: one seed of one dataset and beta), several epochs per device call in make_cells_chunk.

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
import numpy as np

from mombo_jax import buffer, dynamics, rollout, sac, targets, termination


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
  agent = sac.init_agent(key, obs_dim, action_dim, config, total_steps=config.schedule_steps)
  ring = buffer.init_ring(config.synthetic_capacity, obs_dim, action_dim)
  return TrainState(agent=agent, buffer=ring, dynamics=dyn, epoch=jnp.zeros((), jnp.int32),
                    diverged=jnp.zeros((), bool))


def init_cells(keys, config, real, dyn):
  """init vmapped over cells: keys [C, 2], dyn with a leading cell axis C -> TrainState [C]."""
  return jax.vmap(init, in_axes=(0, None, None, 0))(keys, config, real, dyn)


class Cell(struct.PyTreeNode):
  """What may differ between the cells (seeds x datasets x betas) of one compiled program; vmapped
  with the state (leading cell axis). Every other setting is the config's, shared by all cells."""
  dataset: jax.Array        # int32 scalar: which of the stacked datasets (buffer.stack) it trains on
  size: jax.Array           # int32 scalar: that dataset's real transitions (rows past it: padding)
  beta: jax.Array           # f32 scalar: MOMBO / MOBILE beta, MOPO lambda


def make_cells(dataset, size, beta) -> Cell:
  """Cell with arrays [C] from per-cell sequences (or numbers, broadcast to the others' length)."""
  n = max(np.size(dataset), np.size(size), np.size(beta))
  as_ = lambda x, t: np.broadcast_to(np.asarray(x, t), (n,)).copy()  # noqa: E731
  return Cell(dataset=as_(dataset, np.int32), size=as_(size, np.int32),
              beta=as_(beta, np.float32))


def single_dataset(real: buffer.Batch, config, cells: int = None):
  """(real stacked [1, N, ...], Cell [cells]) for seeds of one dataset at config.beta: the
  datasets and cells arguments of make_cells_epoch's function for a plain run. cells: default
  config.num_seeds."""
  n = real.reward.shape[0]
  cells = config.num_seeds if cells is None else cells
  return jax.tree.map(lambda x: x[None], real), make_cells(np.zeros(cells), n, config.beta)


def make_epoch(config):
  """Returns a pure epoch(state, real, key, cell=None) -> (state, metrics) of one cell (one seed).

  real: the real dataset, Batch [N, ...], with cell None (then beta = config.beta); or datasets
  stacked [D, N_max, ...] (buffer.stack) with a Cell saying which one, its size and beta. Shared by
  all cells: vmap it with in_axes None.
  metrics: {name: [steps_per_epoch]} per gradient step (sac.update's, e.g. `q_mean`: the critics'
  mean Q on the step's batch, which the runner watches against the return bound), plus rollout
  statistics (scalars),
  `diverged` (bool scalar: the seed is frozen, this epoch or before) and `diverged/<quantity>` (bool
  scalars, quantity in DIVERGENCE_CHECKS: which check failed THIS epoch on a healthy seed).
  """
  target = targets.get_target(config)
  term_fn = termination.termination_fn(config.env_name)

  def epoch(state: TrainState, real: buffer.Batch, key, cell: Cell = None):
    if cell is None:
      chex.assert_rank(real.obs, 2)
      dataset, size, beta = None, real.obs.shape[0], None
    else:
      chex.assert_rank(real.obs, 3)
      dataset, size, beta = cell.dataset, cell.size, cell.beta
    k_start, k_roll, k_steps = jax.random.split(key, 3)
    agent, dyn = state.agent, state.dynamics
    start = jax.random.randint(k_start, (config.rollout_batch_size,), 0, size)
    policy_fn = functools.partial(_policy, agent, config)
    ring, roll_metrics = rollout.run(k_roll, policy_fn, dyn,
                                     buffer.take(real, start, dataset).obs, state.buffer, config,
                                     term_fn, beta=beta)
    target_fn = functools.partial(target, dyn=dyn, config=config, term_fn=term_fn, beta=beta)

    def step(agent, k):
      k_batch, k_update = jax.random.split(k)
      batch = buffer.sample_mixed(real, ring, k_batch, config.batch_size, config.real_ratio,
                                  dataset, size)
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


CELL_AXIS = "cells"


def cell_mesh():
  """1-D Mesh over all devices (of every process, in a multi-process run), axis CELL_AXIS: the
  cell axis is split over it."""
  return jax.sharding.Mesh(np.asarray(jax.devices()), (CELL_AXIS,))


def cell_shardings():
  """(sharding of a leading cell axis split over all devices, replicated sharding)."""
  mesh = cell_mesh()
  return (jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(CELL_AXIS)),
          jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def check_cell_count(num_cells: int, fix: str = ""):
  """Raises ValueError unless num_cells splits evenly over the devices (of all processes).

  The message speaks of seeds, the cells a user asks for (--seeds) in a plain run. fix: the advice
  that ends the message (default: use a multiple of the device count, or make fewer devices
  visible).
  """
  devices = jax.devices()
  n = len(devices)
  if num_cells % n:
    where = "" if jax.process_count() == 1 else f" of {jax.process_count()} processes"
    fix = fix or (f"use a multiple of {n} seeds, or make fewer devices visible "
                  "(CUDA_VISIBLE_DEVICES, or XLA_FLAGS=--xla_force_host_platform_device_count "
                  "on CPU)")
    raise ValueError(f"{num_cells} seed(s) do not split evenly over the {n} "
                     f"{devices[0].platform} device(s){where} the seed axis is sharded over: {fix}.")


def _place(tree, sharding):
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)

  # Several processes: every process holds the whole value on the host and contributes the part
  # that lives on its own devices (device_put cannot address other processes' devices).
  def one(x):
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
      impl = jax.random.key_impl(x)
      return jax.random.wrap_key_data(one(jax.random.key_data(x)), impl=impl)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
  return jax.tree.map(one, tree)


def shard_cells(tree):
  """`tree` (every leaf with a leading cell axis) placed as make_cells_epoch / make_cells_chunk
  expect it."""
  return _place(tree, cell_shardings()[0])


def replicate(tree):
  """`tree` (e.g. the real dataset) copied onto every device."""
  return _place(tree, cell_shardings()[1])


def make_cells_epoch(config, num_cells: int):
  """jit(shard_map(vmap(epoch))) over a leading cell axis of state, key and cells; the datasets
  are shared: fn(state [C], real [D, N_max, ...], keys [C], cells: Cell [C])
    -> (state [C], metrics {name: [C, ...]} as make_epoch's, with the cell axis first).

  A cell is one seed of one (dataset, beta); a plain run has C = config.num_seeds cells of one
  dataset (single_dataset builds its arguments) and passes num_cells=config.num_seeds. The cell
  axis of state, key, cells, new state and metrics is sharded over all devices (cell_shardings),
  each device training C / devices cells; the datasets are replicated. Pass arrays placed with
  shard_cells / replicate (or uncommitted ones): a committed array on another placement is refused
  by jit. num_cells is C and must split evenly over the devices (check_cell_count). The state
  argument is donated: its buffers (the ring buffer above all) are reused in place. Cached per
  config (ignoring fields the epoch never reads), so runs in one process share the compiled function.
  """
  check_cell_count(num_cells)
  return _cells_epoch(epoch_config(config))


def make_cells_chunk(config, num_cells: int, max_epochs: int):
  """jit(shard_map(fori_loop over epochs of vmap(epoch))):
  fn(state [C], real [D, N_max, ...], keys [C], cells: Cell [C], start: int32 [], n: int32 [])
    -> (state [C], metrics {name: [max_epochs, C]})
  Runs epochs start .. start+n-1 (1 <= n <= max_epochs; n and start are traced, so ONE compile
  serves every chunk length), epoch e using per-cell key fold_in(keys[c], e): exactly what calling
  make_cells_epoch's function n times with jax.vmap(fold_in, (0, None))(keys, e) does.
  metrics row i < n: epoch start+i's metrics, each reduced over its trailing axes to one value
  per cell (per-step arrays -> their mean over the epoch; bool flags such as `diverged` and
  `diverged/<check>` stay bool); rows >= n are zeros/False. The state is donated.

  Several epochs per device call: the host is not involved between them (no dispatch, no metrics
  transfer per epoch). Placement, num_cells and caching as make_cells_epoch's; start and n are
  replicated scalars (Python ints or int32 arrays). n beyond max_epochs runs max_epochs epochs
  (the new state's `epoch` counts what ran), as the metrics hold no more rows.
  """
  if max_epochs < 1:
    raise ValueError(f"max_epochs={max_epochs}: a chunk runs at least one epoch.")
  check_cell_count(num_cells)
  return _cells_chunk(epoch_config(config), int(max_epochs))


# Fields the compiled epoch never reads (training the dynamics, evaluation, seeding, naming) and
# beta (a per-cell array): epoch_config resets them to the defaults.
_NOT_IN_EPOCH = ("seed", "num_seeds", "eval_every", "eval_episodes", "beta", "dyn_lr",
                 "dyn_batch_size", "dyn_holdout_ratio", "dyn_max_holdout", "dyn_improvement",
                 "dyn_patience", "dyn_max_epochs", "dyn_checkpoint_every_s")


def epoch_config(config):
  """config with the fields the compiled epoch never reads set to fixed values: cells whose
  configs give the same epoch_config can share one compiled program."""
  defaults = type(config)()
  return dataclasses.replace(config, env=config.env_name + "-random",  # only the env is read
                             **{k: getattr(defaults, k) for k in _NOT_IN_EPOCH})


_P = jax.sharding.PartitionSpec
# Arguments (state, real, keys, cells): the datasets replicated, everything else split by cell.
_EPOCH_SPECS = (_P(CELL_AXIS), _P(), _P(CELL_AXIS), _P(CELL_AXIS))


def _over_cells(per_device, in_specs, out_specs):
  """jit(shard_map(per_device)) on cell_mesh, the state (argument 0) donated.

  shard_map, not sharding propagation alone: each device runs per_device on its own cells, and
  nothing is left to the partitioner that could add cross-device traffic (cells never meet). One
  device: the same program as a plain jit(per_device), bit for bit."""
  mesh = cell_mesh()
  named = lambda spec: jax.sharding.NamedSharding(mesh, spec)  # noqa: E731
  fn = jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                     check_vma=False)
  return jax.jit(fn, donate_argnums=0, in_shardings=tuple(map(named, in_specs)),
                 out_shardings=tuple(map(named, out_specs)))


@functools.lru_cache(maxsize=16)
def _cells_epoch(config):
  return _over_cells(jax.vmap(make_epoch(config), in_axes=(0, None, 0, 0)), _EPOCH_SPECS,
                     (_P(CELL_AXIS), _P(CELL_AXIS)))


def _per_cell(metrics: dict) -> dict:
  """One cell's epoch metrics, one value each: per-step arrays averaged (as the runner logs
  them), bool flags any-reduced so they stay bool; scalars as they are."""
  def one(x):
    if x.ndim == 0:
      return x
    return jnp.any(x) if x.dtype == jnp.bool_ else jnp.mean(x)
  return {k: one(v) for k, v in metrics.items()}


# The cache key needs no cell count: the jitted function specialises on its arguments' shapes.
@functools.lru_cache(maxsize=16)
def _cells_chunk(config, max_epochs):
  vepoch = jax.vmap(make_epoch(config), in_axes=(0, None, 0, 0))
  fold = jax.vmap(jax.random.fold_in, in_axes=(0, None))

  # jit: the eval_shape below and the loop body then share one trace of the epoch (jit's trace
  # cache); XLA inlines the call, so the loop body is the plain vmapped epoch.
  @jax.jit
  def one(state, real, keys, cells, epoch):
    state, metrics = vepoch(state, real, fold(keys, epoch), cells)
    return state, jax.vmap(_per_cell)(metrics)

  def chunk(state, real, keys, cells, start, n):
    # This device's cells: state [C / devices], metrics buffer [max_epochs, C / devices].
    start = jnp.asarray(start, jnp.int32)
    shapes = jax.eval_shape(one, state, real, keys, cells, start)[1]
    rows = jax.tree.map(lambda s: jnp.zeros((max_epochs,) + s.shape, s.dtype), shapes)

    def body(i, carry):
      state, rows = carry
      state, metrics = one(state, real, keys, cells, start + i)
      rows = jax.tree.map(lambda r, m: jax.lax.dynamic_update_index_in_dim(r, m, i, 0), rows,
                          metrics)
      return state, rows

    # A traced trip count: one while loop serves every n (no recompile per chunk length).
    n = jnp.clip(jnp.asarray(n, jnp.int32), 0, max_epochs)
    return jax.lax.fori_loop(0, n, body, (state, rows))

  return _over_cells(chunk, _EPOCH_SPECS + (_P(), _P()), (_P(CELL_AXIS), _P(None, CELL_AXIS)))

