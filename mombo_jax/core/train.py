"""The offline training epoch: one model rollout into the ring buffer, then `lax.scan` over the
epoch's gradient steps on mixed real/synthetic batches. Pure; jit-compiled once over cells (a cell:
one seed of one dataset and beta; vmapped, or looped on CPU: cell_layout), several epochs per device
call in cells_program.make_cells_chunk.

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
  dynamics,
  rewrites,
  rollout,
  sac,
  targets,
  termination,
  xla_options,
)
from mombo_jax.core.epoch_settings import EpochSettings, epoch_settings


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


def checked_per_cell(per_cell) -> tuple:
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
  per_cell = checked_per_cell(per_cell)
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
