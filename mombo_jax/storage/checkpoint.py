"""Checkpoints: whole pytrees (TrainStates, optax states, flax.struct dataclasses, typed and uint32
PRNG keys, Python scalars, leading seed axes) as Orbax CheckpointManager steps, verified on load.

Two ways to keep them: `save_pytree` / `load_pytree`, one step in a folder (a trained dynamics
ensemble, a saved actor), and `RunCheckpointer`, numbered steps of a run that keeps the newest N
and, on restore, falls back past corrupt steps with one line each (a run's; the dynamics
ensembles' unfinished training; the collector's SAC state). What one step holds, how it is
verified (a CRC32 manifest of every leaf) and what a template does: checkpoint_step.py, whose
errors are raised here too.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Optional

import jax

from mombo_jax.storage import manifest as mf
from mombo_jax.storage.checkpoint_files import remove_leftovers, room_problem
from mombo_jax.storage.checkpoint_step import (  # noqa: F401  (the errors: this module's API)
  FORMAT,
  FORMAT_SHARDED,
  READ_FORMATS,
  CheckpointError,
  CorruptCheckpointError,
  TemplateMismatchError,
  encode,
  manager,
  read_meta,
  read_step,
  save_step,
)


def save_pytree(path: str, tree: Any, metadata: Optional[dict] = None, overwrite: bool = False,
                kind: str = "saved"):
  """Save `tree` (any pytree of arrays / Python scalars, e.g. a train.CellState with a leading seed
  axis) and JSON-serialisable `metadata` as the CheckpointManager directory `path` (one step kept).

  Refuses an existing checkpoint at `path` unless overwrite=True; even then the old step stays in
  place until the new one is committed. `kind` names the checkpoint in error messages ("run",
  "dynamics", "collector", ...).
  """
  path = os.path.abspath(os.fspath(path))
  if os.path.exists(path) and not os.path.isdir(path):
    raise CheckpointError(f"Checkpoint path {path} is a file; choose another path.")
  if os.path.isdir(path) and os.listdir(path) and not overwrite:
    raise CheckpointError(f"Checkpoint path {path} already exists. Pass overwrite=True, delete it, "
                          "or choose another path.")
  encoded = encode(tree, metadata, kind, path)
  mngr = manager(path, keep=1)
  try:
    latest = mngr.latest_step()
    save_step(mngr, 0 if latest is None else latest + 1, encoded, kind)
  finally:
    mngr.close()


def load_pytree(path: str, template: Any = None, kind: str = "saved"):
  """(tree, metadata dict) of the checkpoint `save_pytree` wrote at `path`; the module docstring
  says what `template` does. Differences from the template -> TemplateMismatchError listing them;
  missing, truncated or altered data -> CorruptCheckpointError naming the step and the fix."""
  path = os.path.abspath(os.fspath(path))
  if not os.path.isdir(path):
    raise CheckpointError(f"No {kind} checkpoint at {path}: the directory does not exist. Check "
                          "the path.")
  mngr = manager(path, keep=None, create=False, cleanup=False)
  try:
    step = mngr.latest_step()
    if step is None:
      raise CorruptCheckpointError(f"The {kind} checkpoint {path} holds no committed step (the "
                                   f"write was cut off, or it is not a checkpoint). Delete {path} "
                                   "and run again.")
    return read_step(mngr, step, template, kind)
  finally:
    mngr.close()


class RunCheckpointer:
  """Numbered checkpoints of one run in `directory` (e.g. <workdir>/checkpoints), one Orbax
  CheckpointManager step each.

  save(step, state, metadata) commits atomically and keeps the newest `keep` (always including
  the one just written; steps after it, left by a timeline that was abandoned when an older step was
  restored, are removed first). restore(template) loads the newest valid one, skipping corrupt ones
  with one `log` line each (which step, why, the next step tried, what to delete; no traceback).
  The restored metadata carries "step", the step actually restored. `kind` names the checkpoints
  in messages ("run", "dynamics training", "collector"). A writer (keep not None; the one process
  holding the folder's lock) first removes what a stopped writer left (remove_leftovers:
  unfinished saves, half-deleted steps), saying so in one `log` line each. log=None: silent.
  """

  def __init__(self, directory: str, keep: Optional[int] = 3, kind: str = "run",
               log: Optional[Callable[[str], Any]] = print):
    if keep is not None and keep < 1:
      raise ValueError(f"keep must be >= 1 or None (keep all), got {keep}.")
    self.directory = os.path.abspath(os.fspath(directory))
    self.keep, self.kind, self._log = keep, kind, log
    if os.path.exists(self.directory) and not os.path.isdir(self.directory):
      raise CheckpointError(f"{self.directory} is a file, not a checkpoint folder.")
    # keep=None is a reader (keeps everything, writes nothing): it leaves unfinished saves and
    # half-deleted steps alone. A writer removes them before Orbax sees them (one note each).
    if keep is not None and jax.process_index() == 0:
      for line in remove_leftovers(self.directory):
        if log is not None:
          log(f"note: {line}.")
    self._mngr = manager(self.directory, keep, cleanup=keep is not None)

  def path(self, step: int) -> str:
    return os.path.join(self.directory, str(int(step)))

  def steps(self) -> list:
    """Committed steps, ascending. Not verified (restore checks)."""
    self._mngr.reload()
    return sorted(int(s) for s in self._mngr.all_steps())

  def latest_step(self) -> Optional[int]:
    """Newest committed step or None. restore() may still fall back if that one is corrupt; use
    the "step" in restore()'s metadata as the step actually resumed."""
    steps = self.steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: Any, metadata: Optional[dict] = None):
    step = int(step)
    if step < 0:
      raise ValueError(f"step must be >= 0, got {step}.")
    metadata = dict(metadata or {})
    if metadata.setdefault("step", step) != step:
      raise ValueError(f"metadata['step'] = {metadata['step']} disagrees with step = {step}.")
    problem = room_problem(self.directory, state, self.kind, self.path(step))
    if problem is not None:
      raise CheckpointError(problem)
    encoded = encode(state, metadata, self.kind, self.path(step))
    for stale in [s for s in self.steps() if s >= step]:
      self._mngr.delete(stale)
    save_step(self._mngr, step, encoded, self.kind)

  def metadata(self, step: Optional[int] = None) -> Optional[dict]:
    """The user metadata of `step` (default: the latest) without reading any array, e.g. to
    build the template; None when there is no checkpoint."""
    step = self.latest_step() if step is None else int(step)
    return None if step is None else dict(read_meta(self._mngr, step, self.kind)["metadata"])

  def nbytes(self, template: Any = None, step: Optional[int] = None) -> tuple:
    """(bytes of the leaves of `template`, a sub-tree of the saved state as restore(partial=True)
    takes it (None: all of them); bytes of every leaf) of `step` (default: the latest), as held in
    memory (shape x itemsize; typed keys: their key data), from its manifest alone: no array is
    read. Tells what a partial restore reads of the whole."""
    step = self.latest_step() if step is None else int(step)
    if step is None:
      raise CheckpointError(f"No {self.kind} checkpoint in {self.directory}.")
    sizes = {tuple(leaf[0]): mf.nbytes(leaf)
             for leaf in read_meta(self._mngr, step, self.kind)["leaves"]}
    total = sum(sizes.values())
    return (total if template is None else sum(sizes.get(p, 0) for p in mf.leaves(template))), total

  def restore(self, template: Any = None, step: Optional[int] = None, partial: bool = False):
    """(state, metadata) of `step`, or of the newest valid step when step is None.

    partial=True reads only the leaves of `template`, a sub-tree of the saved state with the same
    paths from the root (e.g. {"agent": {"actor": {"params": ...}}}), and checks their CRCs."""
    if step is not None:
      return read_step(self._mngr, int(step), template, self.kind, partial)
    steps = self.steps()
    if not steps:
      raise CheckpointError(f"No {self.kind} checkpoint in {self.directory}.")
    for s, older in zip(reversed(steps), [*reversed(steps[:-1]), None]):
      try:
        return read_step(self._mngr, s, template, self.kind, partial)
      except CorruptCheckpointError as e:
        if self._log is not None:
          then = f"trying step {older}" if older is not None else "no older step left"
          self._log(f"warning: skipping the corrupt {self.kind} checkpoint at step {s}, {then}. "
                    + " ".join(str(e).split()))     # one line, whatever tensorstore's text holds
    raise CheckpointError(f"Every {self.kind} checkpoint in {self.directory} is corrupt (steps "
                          f"{steps}). Delete {self.directory} to start that part again.")

  def close(self):
    self._mngr.close()
