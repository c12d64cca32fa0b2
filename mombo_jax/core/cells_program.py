"""The compiled program over the cell axis: the epoch of train.make_epoch for C cells at once (each
device's cells vmapped or looped: cell_layout), sharded over every device by shard_map (cells
never meet), and several epochs per device call (make_cells_chunk, what every launch runs).

  make_cells_epoch(config, C, ...) -> fn(state [C], real [D, N_max, ...], keys [C], cells [C])
  make_cells_chunk(config, C, max_epochs, ...) -> fn(..., start, n)

Pure JAX, like train.py: one cell's epoch is there, how the cells share a program is here.
"""
import functools

import jax
import jax.numpy as jnp

from mombo_jax.core import cell_layout, rewrites, train, xla_options
from mombo_jax.core.epoch_settings import epoch_settings
from mombo_jax.core.placement import CELL_AXIS, cell_mesh, check_cell_count


def make_cells_epoch(config, num_cells: int, per_cell=(), layout=None, cpu_dots: str = "eigen",
                     choices: rewrites.Rewrites = None):
  """jit(shard_map(epoch over cells)) over a leading cell axis of state, key and cells (each
  device's cells vmapped or looped: cell_layout.layout(layout)); the datasets are shared:
  fn(state [C], real [D, N_max, ...], keys [C], cells: Cell [C])
    -> (state [C], metrics {name: [C, ...]} as make_epoch's, with the cell axis first).

  A cell is one seed of one (dataset, beta); a plain run has C = config.num_seeds cells of one
  dataset (single_dataset builds its arguments) and passes num_cells=config.num_seeds. The cell
  axis of state, key, cells, new state and metrics is sharded over all devices (cell_shardings),
  each device training C / devices cells; the datasets are replicated. Pass arrays placed with
  shard_cells / replicate (or uncommitted ones): a committed array on another placement is refused
  by jit. num_cells is C and must split evenly over the devices (check_cell_count). The state
  argument is donated: its buffers (the ring buffer above all) are reused in place. Cached per
  config's EpochSettings (epoch_settings.epoch_settings: what the epoch reads), so runs in one
  process share the compiled function. layout ('vmap', 'loop'; None: the backend's default) and
  cpu_dots ('eigen', 'xla': xla_options) and choices (#29's CPU rewrites, rewrites.Rewrites; None:
  the backend's defaults, rewrites.choose()) come from above the core (settings/environment.py
  reads them from MOMBO_JAX_CELLS, MOMBO_JAX_CPU_DOTS, MOMBO_JAX_PREDICT_ROWS and
  MOMBO_JAX_CRITIC_MATMUL; program.compile_chunk passes them).
  """
  check_cell_count(num_cells)
  per_cell = train.checked_per_cell(per_cell)
  return _cells_epoch(epoch_settings(config, per_cell), per_cell, cell_layout.layout(layout),
                      cpu_dots, choices or rewrites.choose())


def make_cells_chunk(config, num_cells: int, max_epochs: int, per_cell=(), layout=None,
                     cpu_dots: str = "eigen", choices: rewrites.Rewrites = None):
  """jit(shard_map(fori_loop over epochs of the epoch over cells, cell_layout's)):
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
  (the new state's `epoch` counts what ran), as the metrics hold no more rows. per_cell: the
  settings the cells carry themselves (make_epoch; per_cell_settings of their configs). layout,
  cpu_dots and choices as make_cells_epoch's.
  """
  if max_epochs < 1:
    raise ValueError(f"max_epochs={max_epochs}: a chunk runs at least one epoch.")
  check_cell_count(num_cells)
  per_cell = train.checked_per_cell(per_cell)
  return _cells_chunk(epoch_settings(config, per_cell), int(max_epochs), per_cell,
                      cell_layout.layout(layout), cpu_dots, choices or rewrites.choose())


_P = jax.sharding.PartitionSpec
# Arguments (state, real, keys, cells): the datasets replicated, everything else split by cell.
_EPOCH_SPECS = (_P(CELL_AXIS), _P(), _P(CELL_AXIS), _P(CELL_AXIS))


def _over_cells(per_device, in_specs, out_specs, cpu_dots):
  """jit(shard_map(per_device)) on cell_mesh, the state (argument 0) donated.

  shard_map, not sharding propagation alone: each device runs per_device on its own cells, and
  nothing is left to the partitioner that could add cross-device traffic (cells never meet). One
  device: the same program as a plain jit(per_device), bit for bit."""
  mesh = cell_mesh()
  named = lambda spec: jax.sharding.NamedSharding(mesh, spec)  # noqa: E731
  fn = jax.shard_map(per_device, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                     check_vma=False)
  return xla_options.jit(fn, cpu_dots, donate_argnums=0, in_shardings=tuple(map(named, in_specs)),
                         out_shardings=tuple(map(named, out_specs)))


@functools.lru_cache(maxsize=16)
def _cells_epoch(config, per_cell, layout, cpu_dots, choices):
  return _over_cells(cell_layout.over_cells(train.make_epoch(config, per_cell, choices), layout),
                     _EPOCH_SPECS, (_P(CELL_AXIS), _P(CELL_AXIS)), cpu_dots)


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
def _cells_chunk(config, max_epochs, per_cell, layout, cpu_dots, choices):
  vepoch = cell_layout.over_cells(train.make_epoch(config, per_cell, choices), layout)
  fold = jax.vmap(jax.random.fold_in, in_axes=(0, None))

  # jit: the eval_shape below and the loop body then share one trace of the epoch (jit's trace
  # cache); XLA inlines the call, so the loop body is the plain epoch over cells.
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

  return _over_cells(chunk, _EPOCH_SPECS + (_P(), _P()), (_P(CELL_AXIS), _P(None, CELL_AXIS)),
                     cpu_dots)

