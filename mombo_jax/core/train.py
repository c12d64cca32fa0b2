"""The offline training epoch: one model rollout into the ring buffer, then `lax.scan` over the
epoch's gradient steps on mixed real/synthetic batches. Pure; jit-compiled once over cells (a cell:
one seed of one dataset and beta; vmapped, or looped on CPU: cell_layout), several epochs per device
call in make_cells_chunk.

Never imports gymnasium, Minari, Orbax or absl: data comes in as arrays.

Divergence is handled per seed inside the compiled epoch: after the gradient steps, a seed whose
step losses (critic, actor, alpha) went non-finite or beyond +-config.agent.max_abs_loss, or whose
agent (parameters, target parameters, optimiser states) holds a non-finite value, keeps the agent it
entered the epoch with (its last healthy one) and is marked `diverged` for good. The selection is a
per-seed `jnp.where`, so the other seeds' computations are untouched (no lax.cond under vmap). A
diverged seed's step metrics may be NaN: consumers mask them with metrics["diverged"].
"""
import dataclasses
import functools
from typing import Any

import chex
import flax.struct as struct
import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax.core import (
  buffer,
  cell_layout,
  dynamics,
  rewrites,
  rollout,
  sac,
  targets,
  termination,
  xla_options,
)
from mombo_jax.core.epoch_settings import EpochSettings, epoch_settings
from mombo_jax.core.placement import CELL_AXIS, cell_mesh, check_cell_count


class CellState(struct.PyTreeNode):
  """Everything of one cell (a seed of one dataset and beta) that changes during training; vmapped:
  a leading cell axis. Not flax's TrainState: it holds several of those (sac.AgentState)."""
  agent: sac.AgentState
  buffer: buffer.RingBuffer
  dynamics: dynamics.DynamicsState
  epoch: jax.Array          # int32 scalar: epochs completed
  diverged: jax.Array       # bool scalar: frozen at its last healthy agent (see module docstring)


def init(key, config, real: buffer.Batch, dyn) -> CellState:
  """Fresh state of one seed. real: the real dataset as a Batch [N, ...]; dyn: this seed's model."""
  obs_dim, action_dim = real.obs.shape[-1], real.action.shape[-1]
  agent = sac.init_agent(key, obs_dim, action_dim, config, total_steps=config.schedule_steps)
  ring = buffer.init_ring(capacity(config), obs_dim, action_dim)
  return CellState(agent=agent, buffer=ring, dynamics=dyn, epoch=jnp.zeros((), jnp.int32),
                    diverged=jnp.zeros((), bool))


def init_cells(keys, config, real, dyn):
  """init vmapped over cells: keys [C, 2], dyn with a leading cell axis C -> CellState [C]."""
  return jax.vmap(init, in_axes=(0, None, None, 0))(keys, config, real, dyn)


class Cell(struct.PyTreeNode):
  """What may differ between the cells (seeds x datasets x betas x their datasets' paper settings)
  of one compiled program; vmapped with the state (leading cell axis). Every other setting is the
  program config's, shared by all cells."""
  dataset_index: jax.Array  # int32 scalar: which of the stacked datasets (buffer.stack) it
                            # trains on
  size: jax.Array           # int32 scalar: that dataset's real transitions (rows past it: padding)
  beta: jax.Array           # f32 scalar: MOMBO / MOBILE beta, MOPO lambda
  # Its rollout length k <= the program's config.rollout.rollout_length K (the scan's static
  # length; the ring holds K's capacity, the cell uses capacity(config, k) of it).
  rollout_length: jax.Array  # int32 scalar
  real_rows: jax.Array      # int32 scalar: real rows per batch, buffer.real_rows(batch, ratio)
  auto_alpha: jax.Array     # bool scalar: learns its temperature (else config.agent.alpha)


def make_cells(dataset_index, size, configs) -> Cell:
  """Cell with arrays [C]: dataset_index and size per cell (sequences, or numbers broadcast), the
  other fields from each cell's own config (`configs`: one per cell, or one Config for all): its
  beta, rollout_length, real_rows = int(batch_size * real_ratio) and auto_alpha."""
  n = max(np.size(dataset_index), np.size(size), 1 if dataclasses.is_dataclass(configs)
          else len(configs))
  if dataclasses.is_dataclass(configs):
    configs = [configs] * n
  as_ = lambda x, t: np.broadcast_to(np.asarray(x, t), (n,)).copy()  # noqa: E731
  per = lambda f: as_([f(c) for c in configs], None)                  # noqa: E731
  return Cell(dataset_index=as_(dataset_index, np.int32), size=as_(size, np.int32),
              beta=per(lambda c: c.beta).astype(np.float32),
              rollout_length=per(lambda c: c.rollout.rollout_length).astype(np.int32),
              real_rows=per(lambda c: buffer.real_rows(c.agent.batch_size,
                                                       c.rollout.real_ratio)).astype(np.int32),
              auto_alpha=per(lambda c: c.agent.auto_alpha).astype(bool))


def capacity(config, rollout_length=None):
  """Ring rows of a cell with rollout length k (default config.rollout.rollout_length): retain
  epochs x rollout batch x k, the one place the ring's size is computed. config: a Config or its
  EpochSettings. int, or int32 when k is traced."""
  rollout = config.rollout
  k = rollout.rollout_length if rollout_length is None else rollout_length
  return rollout.buffer_retain_epochs * rollout.rollout_batch_size * k


def single_dataset(real: buffer.Batch, config, cells: int = None):
  """(real stacked [1, N, ...], Cell [cells]) for seeds of one dataset at config's settings: the
  datasets and cells arguments of make_cells_epoch's function for a plain run. cells: default
  config.num_seeds."""
  n = real.reward.shape[0]
  cells = config.num_seeds if cells is None else cells
  return jax.tree.map(lambda x: x[None], real), make_cells(np.zeros(cells), n, config)


# Settings the cells of one program may differ in beside the dataset and beta (their datasets'
# paper settings differ in these within an env: config.TASKS), read from train.Cell when listed
# in a program's `per_cell`. A program whose cells agree in one reads it from the config (static):
# the same compiled epoch, bit for bit, as before cells could differ in it.
# Each name maps to the settings group that holds it (settings/groups.py).
CELL_SETTINGS = {"rollout_length": "rollout", "real_ratio": "rollout", "auto_alpha": "agent"}


def cell_setting(config, name: str):
  """The CELL_SETTINGS `name` of a Config (or EpochSettings), from its group."""
  return getattr(getattr(config, CELL_SETTINGS[name]), name)


def per_cell_settings(configs) -> tuple:
  """The CELL_SETTINGS in which `configs` (the cells' or groups' configs) differ: the per_cell
  argument of their program (make_cells_chunk)."""
  return tuple(f for f in CELL_SETTINGS if len({cell_setting(c, f) for c in configs}) > 1)


def _settings(per_cell) -> tuple:
  """per_cell checked and in CELL_SETTINGS' order (a cache key)."""
  unknown = set(per_cell) - set(CELL_SETTINGS)
  if unknown:
    raise ValueError(f"per_cell {sorted(unknown)}: cells may differ only in "
                     f"{tuple(CELL_SETTINGS)}.")
  return tuple(f for f in CELL_SETTINGS if f in per_cell)


def make_epoch(config, per_cell=(), choices: rewrites.Rewrites = None):
  """Returns a pure epoch(state, real, key, cell=None) -> (state, metrics) of one cell (one seed),
  traced under `choices` (rewrites.tracing: #29's CPU rewrites; None: the backend's defaults).

  config: a Config or its epoch_settings.EpochSettings (what the epoch reads: the Algorithm
  among them, which supplies the Bellman target).

  real: the real dataset, Batch [N, ...], with cell None (then beta, rollout length, real rows
  and auto_alpha are config's); or datasets stacked [D, N_max, ...] (buffer.stack) with a Cell
  saying which one, its size and the cell's own settings (Cell). Shared by all cells: vmap it
  with in_axes None. per_cell (names of CELL_SETTINGS): the settings read from the Cell, not the
  config (default none). With "rollout_length", config.rollout.rollout_length is the longest cell's
  (the rollout scan's length and the ring's capacity); a shorter cell's rollout writes and reports
  what a program of its own length would (rollout.run), into the first capacity(config, k) slots
  of its ring. "real_ratio": Cell.real_rows real rows per batch; "auto_alpha": Cell.auto_alpha.
  metrics: {name: [steps_per_epoch]} per gradient step (sac.update's, e.g. `q_mean`: the critics'
  mean Q on the step's batch, which the runner watches against the return bound), plus rollout
  statistics (scalars),
  `diverged` (bool scalar: the seed is frozen, this epoch or before) and `diverged/<quantity>` (bool
  scalars, quantity in DIVERGENCE_CHECKS: which check failed THIS epoch on a healthy seed).
  Its float32 matmuls compute at config.matmul_precision, pinned when it is traced.
  """
  per_cell = _settings(per_cell)
  if not isinstance(config, EpochSettings):
    config = epoch_settings(config)
  term_fn = termination.termination_fn(config.env_name)

  def epoch(state: CellState, real: buffer.Batch, key, cell: Cell = None):
    with rewrites.tracing(choices):
      return _epoch(config, term_fn, state, real, key, _cell_values(config, per_cell, real, cell))

  # Every dot of the epoch (rollout, critic and actor updates, their gradients) at the run's
  # precision, whoever traces it (xla_options.at_precision): float32 by default, the references'.
  return xla_options.at_precision(epoch, config.matmul_precision)


@dataclasses.dataclass(frozen=True)
class _CellValues:
  """The per-cell values one epoch reads: the Cell's (traced) where the program's cells differ in
  them, else static (the config's Python value, or None: the reader's default is the config's)."""
  dataset_index: Any        # None: real is one dataset [N, ...]
  size: Any                 # the real rows drawn from
  beta: Any                 # None: config.beta
  rollout_length: Any       # None: the program's K
  real_rows: Any            # real rows per batch
  auto_alpha: Any           # None: config.agent.auto_alpha

  def rollout_settings(self, config) -> rollout.CellRollout:
    """The cell's own rollout settings (its ring slots: the capacity of its own k)."""
    k = self.rollout_length
    return rollout.CellRollout(self.beta, k, None if k is None else capacity(config, k))


def _cell_values(config, per_cell, real, cell) -> _CellValues:
  """The _CellValues of a cell (Cell, or None for one dataset at config's settings)."""
  if cell is None:
    chex.assert_rank(real.obs, 2)
    return _CellValues(None, real.obs.shape[0], None, None, _static_rows(config), None)
  chex.assert_rank(real.obs, 3)
  chex.assert_rank([cell.rollout_length, cell.real_rows, cell.auto_alpha], 0)
  # Python values where the cells agree: the static program of a plain run. (Where they differ,
  # the program's settings hold None: epoch_settings.)
  own = lambda f, value, static: value if f in per_cell else static  # noqa: E731
  return _CellValues(cell.dataset_index, cell.size, cell.beta,
                     own("rollout_length", cell.rollout_length, None),
                     cell.real_rows if "real_ratio" in per_cell else _static_rows(config),
                     own("auto_alpha", cell.auto_alpha, None))


def _static_rows(config) -> int:
  """The real rows per batch of config's real_ratio (the cells agree in it)."""
  return buffer.real_rows(config.agent.batch_size, config.rollout.real_ratio)


def _epoch(config, term_fn, state: CellState, real: buffer.Batch, key, cell: _CellValues):
  """One epoch of one cell (make_epoch's): the rollout, the gradient steps, the divergence check."""
  k_start, k_roll, k_steps = jax.random.split(key, 3)
  agent, dyn = state.agent, state.dynamics
  start = jax.random.randint(k_start, (config.rollout.rollout_batch_size,), 0, cell.size)
  policy_fn = functools.partial(_policy, agent, config)
  with jax.named_scope("rollout"):
    ring, roll_metrics = rollout.run(k_roll, policy_fn, dyn,
                                     buffer.take(real, start, cell.dataset_index).obs,
                                     state.buffer, config, term_fn, cell.rollout_settings(config))
  target_fn = targets.bind(config, dyn, term_fn, beta=cell.beta, real_rows=cell.real_rows,
                           auto_alpha=cell.auto_alpha)

  def step(agent, key):
    k_batch, k_update = jax.random.split(key)
    batch = buffer.sample_mixed(real, ring, k_batch, config.agent.batch_size, cell.real_rows,
                                cell.dataset_index, cell.size)
    return sac.update(agent, batch, k_update, target_fn, config, cell.auto_alpha)

  agent, step_metrics = jax.lax.scan(step, agent,
                                     jax.random.split(k_steps, config.steps_per_epoch))
  failed = health_checks(agent, step_metrics, config)
  diverged = state.diverged | functools.reduce(jnp.logical_or, failed.values())
  # Selection per seed: the frozen seed keeps its input agent; its ring buffer may take the new
  # rows (it is never trained on again) so no second copy of the large buffer is kept.
  agent = jax.tree.map(lambda new, old: jnp.where(diverged, old, new), agent, state.agent)
  metrics = dict(step_metrics)
  metrics.update({f"rollout/{k}": v for k, v in roll_metrics.items()})
  metrics["diverged"] = diverged
  metrics.update({f"diverged/{k}": v & ~state.diverged for k, v in failed.items()})
  return state.replace(agent=agent, buffer=ring, epoch=state.epoch + 1,
                       diverged=diverged), metrics


DIVERGENCE_CHECKS = ("critic_loss", "actor_loss", "alpha_loss", "params")

# The epoch's phases as named scopes (jax.named_scope: the jaxpr's name stacks and the compiled
# program's op_name metadata carry them; the program is the same): the rollout (make_epoch), the
# dynamics ensemble's predictions (dynamics.predict: in the rollout, and in the targets of MOBILE
# and MOMBO elite_spread / mixture), a gradient step's critic update (its Bellman target, critic
# loss, Adam step and Polyak update) and actor update (actor and temperature; sac.update).
# benchmarks/bench_phase_counts.py counts FLOPs and ops by them; a device profile can too.
PHASES = ("rollout", "dynamics", "critic_update", "actor_update")


def health_checks(agent: sac.AgentState, step_metrics: dict, config) -> dict:
  """{quantity: bool scalar, True = failed} for one seed after an epoch's gradient steps.

  step_metrics[name]: [steps] losses of the epoch; a loss fails when any step is non-finite or
  beyond +-config.agent.max_abs_loss (a finite explosion, e.g. beta=1e18, is a divergence too).
  `params`: any non-finite floating leaf of the agent (parameters, targets, optimiser states).
  """
  failed = {}
  for name in DIVERGENCE_CHECKS[:-1]:
    x = step_metrics[name]
    failed[name] = ~jnp.all(jnp.isfinite(x) & (jnp.abs(x) <= config.agent.max_abs_loss))
  leaves = [x for x in jax.tree.leaves(agent) if jnp.issubdtype(x.dtype, jnp.inexact)]
  failed["params"] = ~functools.reduce(jnp.logical_and,
                                       [jnp.all(jnp.isfinite(x)) for x in leaves])
  return failed


def _policy(agent, config, obs, key):
  # The rollout's actor in pieces of rows, as its dynamics predictions (dynamics.predict):
  # rewrites.py chooses them per backend.
  return sac.policy_sample(agent, obs, key, config,
                           piece_rows=rewrites.in_effect().predict_rows)


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
  per_cell = _settings(per_cell)
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
  per_cell = _settings(per_cell)
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
  return _over_cells(cell_layout.over_cells(make_epoch(config, per_cell, choices), layout),
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
  vepoch = cell_layout.over_cells(make_epoch(config, per_cell, choices), layout)
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

