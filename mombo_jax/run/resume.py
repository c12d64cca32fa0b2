"""Where a launch's runs start (launch.Launch.prepare), beside what each run restores itself
(host_run.HostRun.restore, .resume): each run's dynamics ensembles (trained, reused, or for a
resume stand-ins its checkpoint overwrites), the epoch they all resume at, and the rows of an
evaluation that a killed launch lost (write_lost_rows).
"""
from __future__ import annotations

from typing import Optional, Sequence

import jax
import jax.numpy as jnp

from mombo_jax.core import dynamics
from mombo_jax.data import transitions as transitions_lib
from mombo_jax.dynamics.dynamics_store import get_dynamics
from mombo_jax.errors import Interrupted, UserError
from mombo_jax.run import distributed
from mombo_jax.run.console import CONSOLE, log
from mombo_jax.run.evaluation import returns_all
from mombo_jax.run.host_run import HostRun
from mombo_jax.run.program import Program
from mombo_jax.signals import StopFlag


def run_dynamics(run: HostRun, transitions: transitions_lib.Transitions,
                 should_stop: Optional[StopFlag] = None) -> dynamics.DynamicsState:
  """The run's dynamics ensembles [S] (from its dynamics keys, run.keys[0]): trained or reused
  (dynamics_store.get_dynamics), or for a resume untrained stand-ins of the right shapes."""
  spec = run.spec
  if run.ckpt.latest_step() is None:
    return get_dynamics(spec.config, transitions, spec.dataset, run.folder.dynamics_dir,
                        should_stop=should_stop, console=CONSOLE)
  # The run's CellState holds its dynamics: the restore brings them back, so the saved
  # ensembles are not needed (nor checked: they may have gone, or predate reuse keys that record
  # the training settings). Only their shapes are built here.
  log(f"Resuming {spec.workdir}: its dynamics ensembles come from its checkpoint.")
  obs_dim, act_dim = transitions.observations.shape[1], transitions.actions.shape[1]
  return jax.jit(jax.vmap(
      lambda k: dynamics.init_state(k, obs_dim, act_dim, spec.config)))(run.keys[0])


def write_lost_rows(lost: Sequence[HostRun], program: Program,
                    should_stop: Optional[StopFlag] = None):
  """Writes the rows of the evaluation at program.start that a launch killed after that
  checkpoint lost (runs `lost`: run.point the checkpoint's `eval` metadata), evaluating the
  restored actors with that point's env seeds: the returns the lost evaluation had. Every
  process calls it (the actors are gathered); process 0 evaluates and writes."""
  actors = distributed.to_host(program.state.agent.actor.params)
  if not distributed.is_main():
    return
  epoch = program.start
  try:
    returns = returns_all(lost, actors, epoch, should_stop)
  except Interrupted as e:      # nothing is lost: the checkpoint still holds what it needs
    raise Interrupted(e.signum, f"the evaluation of epoch {epoch} (redone on resume)") from None
  for r in lost:
    r.write_evaluation(returns[r])
    log(f"Wrote the evaluation of epoch {epoch}{r.where}, which the stopped launch had not "
        "written.")


def join_cells(trees):
  """Pytrees with a leading cell axis, concatenated along it."""
  return jax.tree.map(lambda *xs: jnp.concatenate(xs), *trees)


def common_start(runs: Sequence[HostRun]) -> int:
  """The epoch every run resumes at (run.start, from HostRun.restore); UserError when they
  stopped at different ones."""
  starts = {r.start for r in runs}
  if len(starts) > 1:
    raise UserError("The workdirs of this launch stopped at different epochs ("
                    + ", ".join(f"{r.spec.workdir}: {r.start}" for r in runs)
                    + "); one program trains them in step. Resume each with its own "
                    "experiments.run launch (one --dataset and --beta) to the same epoch, or "
                    "delete the lagging ones.")
  return runs[0].start
