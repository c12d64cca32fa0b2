"""The device side of a launch: its arguments (`Program`), the config its program is compiled
from (`program_config`), the compiled device call, cached per process (`compile_chunk`), and how
many epochs one call runs (`chunk_length`, at most about `CALL_SECONDS`). launch.Launch drives it.
"""
from __future__ import annotations

import collections
import dataclasses

import jax
import numpy as np

from mombo_jax.core import buffer, cells_program, rewrites, train as train_lib
from mombo_jax.settings import config as config_lib, environment

# Longest a device call may run (epochs are batched up to the next evaluation, but no more than
# this by the last call's pace; one epoch at least): SIGTERM / SIGINT are honoured between calls,
# so a stop waits about this long. A call costs the host a metrics pull (milliseconds).
CALL_SECONDS = 3.0


@dataclasses.dataclass
class Program:
  """The device side of a launch: the compiled program's shared config and its arguments, cell
  axis C (sharded over the devices), datasets D (replicated)."""
  config: config_lib.Config    # the runs' shared settings (check_runs: what may differ),
                               # rollout_length the longest run's (program_config)
  num_cells: int
  state: train_lib.CellState   # [C]
  real: buffer.Batch           # [D, N_max, ...]
  keys: jax.Array              # [C] epoch keys: epoch e of cell c uses fold_in(keys[c], e)
  cells: train_lib.Cell        # [C]
  start: int                   # the epoch every workdir resumes at
  per_cell: tuple = ()         # train.CELL_SETTINGS the runs differ in: read from `cells`


def program_config(specs):
  """The config of the launch's program (specs: its run_specs.RunSpecs): the first run's
  (check_runs: every run's agrees with it in what the epoch reads alike), with the longest
  rollout_length of the runs (the rollout scan's length and the ring's capacity; each cell uses
  its own, train.Cell)."""
  return specs[0].config.replace(
      rollout_length=max(s.config.rollout.rollout_length for s in specs))


# Compiled chunks of this process, by function and argument signature: launches of one setup in
# one process (tests, notebooks, a resumed grid) compile once. AOT compiles bypass jit's cache.
_COMPILED = collections.OrderedDict()
_MAX_COMPILED = 8


def compile_choices() -> dict:
  """How the environment asks the training programs to be compiled (settings/environment.py):
  make_cells_chunk's / make_cells_epoch's layout, cpu_dots and choices (rewrites.Rewrites), each
  unset one the backend's default. What a launch compiles with; benchmarks pass it too."""
  return dict(layout=environment.cells(), cpu_dots=environment.cpu_dots(),
              choices=rewrites.choose(environment.predict_rows(), environment.critic_matmul()))


def compile_chunk(program: Program):
  """The launch's compiled device call: (state, real, keys, cells, start, n) -> (state, metrics
  [eval_every, C]) running epochs start .. start+n-1 (cells_program.make_cells_chunk)."""
  fn = cells_program.make_cells_chunk(program.config, program.num_cells,
                                      program.config.evaluation.eval_every,
                                      program.per_cell, **compile_choices())
  args = (program.state, program.real, program.keys, program.cells, np.int32(program.start),
          np.int32(1))
  leaves, tree = jax.tree.flatten(args)
  key = (fn, tree, tuple((np.shape(x), str(x.dtype), getattr(x, "sharding", None)) for x in leaves))
  if key not in _COMPILED:
    _COMPILED[key] = fn.lower(*args).compile()
    while len(_COMPILED) > _MAX_COMPILED:
      _COMPILED.popitem(last=False)
  _COMPILED.move_to_end(key)
  return _COMPILED[key]


def chunk_length(epoch, end, eval_every, seconds_per_epoch=None) -> int:
  """Epochs of the next device call: up to the next evaluation (or `end`), at most CALL_SECONDS
  of device time by the last call's pace; one epoch while the pace is unknown."""
  n = min(eval_every - epoch % eval_every, end - epoch)
  if seconds_per_epoch is None:
    return 1
  return max(1, min(n, int(CALL_SECONDS // max(seconds_per_epoch, 1e-9))))
