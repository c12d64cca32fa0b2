"""Where each run of a launch starts (launch.Launch.prepare): its dynamics ensembles (trained,
reused, or for a resume stand-ins its checkpoint overwrites), its cells' state (fresh, or restored
from its latest checkpoint), its host state (metrics.csv's rows, diverged seeds, the
overestimation watch), and the rows of an evaluation that a killed launch lost (write_lost_rows).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax.core import dynamics, placement, train as train_lib
from mombo_jax.data import scores, transitions as transitions_lib
from mombo_jax.dynamics.dynamics_store import get_dynamics
from mombo_jax.errors import Interrupted, UserError
from mombo_jax.records.outputs import RENAMED_COLUMNS
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import distributed, overestimation
from mombo_jax.run.console import log
from mombo_jax.run.host_run import HostRun, build_evaluators, returns_all
from mombo_jax.run.program import Program
from mombo_jax.run.run_specs import RunSpec
from mombo_jax.settings import config as config_lib
from mombo_jax.signals import StopFlag
from mombo_jax.storage import checkpoint


def run_dynamics(spec: RunSpec, wd: Workdir, ckpt: checkpoint.RunCheckpointer,
                 transitions: transitions_lib.Transitions, keys: jax.Array,
                 should_stop: Optional[StopFlag] = None) -> dynamics.DynamicsState:
  """The run's dynamics ensembles [S] (keys: its dynamics keys [S, 2]): trained or reused
  (dynamics_store.get_dynamics), or for a resume untrained stand-ins of the right shapes."""
  if ckpt.latest_step() is None:
    return get_dynamics(spec.config, transitions, spec.dataset, wd.dynamics_dir,
                        should_stop=should_stop, log=log)
  # The run's CellState holds its dynamics: the restore brings them back, so the saved
  # ensembles are not needed (nor checked: they may have gone, or predate reuse keys that record
  # the training settings). Only their shapes are built here.
  log(f"Resuming {spec.workdir}: its dynamics ensembles come from its checkpoint.")
  obs_dim, act_dim = transitions.observations.shape[1], transitions.actions.shape[1]
  return jax.jit(jax.vmap(
      lambda k: dynamics.init_state(k, obs_dim, act_dim, spec.config)))(keys)


def restore_cells(ckpt: checkpoint.RunCheckpointer, fresh: train_lib.CellState,
                  own: config_lib.Config, program: config_lib.Config
                  ) -> Tuple[train_lib.CellState, dict]:
  """(state [S], checkpoint metadata) of a run: its cells of the launch's fresh init, or its
  latest checkpoint restored onto them (own: the run's config; program: the program's, whose
  ring may be longer)."""
  if ckpt.latest_step() is None:
    return fresh, {}
  try:
    # The checkpoint holds the run's own ring (a plain run's); the program's may be longer.
    state, meta = ckpt.restore(placement.resize_rings(fresh, train_lib.capacity(own)))
  except checkpoint.CheckpointError as e:
    raise UserError(str(e)) from None
  state = placement.resize_rings(state, train_lib.capacity(program))
  log(f"Resumed from {ckpt.directory} at epoch {int(np.asarray(state.epoch)[0])}.")
  return state, meta or {}


def host_run(spec: RunSpec, wd: Workdir, ckpt: checkpoint.RunCheckpointer, cells: slice,
             meta: dict, start: int, bound: float, transitions: transitions_lib.Transitions
             ) -> HostRun:
  """A run's host state resumed at epoch `start` (0: fresh): metrics.csv's rows up to there
  (written back, process 0), the seeds that diverged and the overestimation watch (from its
  checkpoint's metadata `meta`; bound: its dataset's return bound), the rows its checkpoint says
  are lost."""
  seeds = np.arange(spec.config.seed, spec.config.seed + spec.config.num_seeds)
  rows = wd.read_rows(max_epoch=start)
  unwritten = meta.get("eval")
  if not (unwritten and int(unwritten["epoch"]) == start
          and not any(int(row["epoch"]) == start for row in rows)):
    unwritten = None             # else: killed between the checkpoint and the rows
  if distributed.is_main():
    wd.write_rows(rows)
  # A checkpoint saved before the watch existed (or a fresh run): rebuilt from metrics.csv.
  q = (overestimation.OverestimationWatch(seeds, bound, meta["q"]) if "q" in meta
       else overestimation.OverestimationWatch.from_rows(seeds, bound, rows))
  # What the behaviour policy scored: the final line sets the run's score beside it.
  dataset_score = float(np.mean(scores.normalized_score(
      spec.dataset, transitions_lib.episode_returns(transitions))))
  return HostRun(spec=spec, workdir=wd, cell_slice=cells, seeds=seeds, ckpt=ckpt, q=q, rows=rows,
                 diverged={int(d["seed"]): d for d in meta.get("diverged", [])},
                 unwritten_eval=unwritten, dataset_score=dataset_score)


def write_lost_rows(unwritten: List[HostRun], program: Program, eval_workers: int = 0,
                    should_stop: Optional[StopFlag] = None):
  """Writes the rows of the evaluation at program.start that a launch killed after that
  checkpoint lost (runs `unwritten`: r.unwritten_eval the checkpoint's `eval` metadata),
  evaluating the restored actors with that point's env seeds: the returns the lost evaluation
  had."""
  actors = distributed.to_host(program.state.agent.actor.params)
  if not distributed.is_main():
    for r in unwritten:
      r.unwritten_eval = None
    return
  build_evaluators(unwritten, eval_workers)
  epoch = program.start
  try:
    every = returns_all(unwritten, actors, epoch, should_stop)
  except Interrupted as e:      # nothing is lost: the checkpoint still holds what it needs
    raise Interrupted(e.signum, f"the evaluation of epoch {epoch} (redone on resume)") from None
  for r, returns in zip(unwritten, every):
    last = {}
    # The run's cells' values -> the launch's axis [C]; an older checkpoint's metric names as
    # metrics.csv's readers name them today.
    for k, v in r.unwritten_eval["last"].items():
      full = np.full(program.num_cells, np.nan)
      full[r.cell_slice] = v
      last[RENAMED_COLUMNS.get(k, k)] = full
    r.add_evaluation(returns, last, epoch, r.unwritten_eval)
    log(f"Wrote the evaluation of epoch {epoch}{r.where(len(unwritten) > 1)}, which the stopped "
        "launch had not written.")
    r.unwritten_eval = None


def join_cells(trees):
  """Pytrees with a leading cell axis, concatenated along it."""
  return jax.tree.map(lambda *xs: jnp.concatenate(xs), *trees)


def cell_slices(specs: Sequence[RunSpec]) -> List[slice]:
  """Each run's cells on the program's cell axis [C]: its seeds, the runs side by side."""
  out, offset = [], 0
  for s in specs:
    out.append(slice(offset, offset + s.config.num_seeds))
    offset += s.config.num_seeds
  return out


def common_start(specs: Sequence[RunSpec], starts: List[int]) -> int:
  """The epoch every run resumes at; UserError when they stopped at different ones."""
  if len(set(starts)) > 1:
    raise UserError("The workdirs of this launch stopped at different epochs ("
                    + ", ".join(f"{s.workdir}: {e}" for s, e in zip(specs, starts))
                    + "); one program trains them in step. Resume each with its own "
                    "experiments.run launch (one --dataset and --beta) to the same epoch, or "
                    "delete the lagging ones.")
  return starts[0]
