"""A checkpoint folder's files, seen without Orbax: what a stopped writer left there (`leftovers`,
`remove_leftovers`: unfinished saves, half-deleted steps), whether a save fits before Orbax starts
writing (`room_problem`), the OS's words for a failed save (`os_cause`),
what to delete of an unreadable step (`delete_advice`), and the noise an aborted read leaves
(`quiet_aborted_reads`). checkpoint_step.py builds on them; the run's records remove leftovers
through them without importing Orbax.
"""
from __future__ import annotations

import errno
import glob
import logging
import os
import shutil
import sys
from typing import Any, List, Optional, Tuple

import jax

from mombo_jax.storage import manifest as mf

# Files every step Orbax commits holds (written in its temporary folder before the rename that
# commits it): the step's metadata and each item's own. A step folder missing one is what a stopped
# launch left of deleting an old step (Orbax deletes a step's files one by one, then the folder):
# Orbax would list it as a step and warn about it at every turn ("Metadata file does not exist").
_COMMITTED_FILES = ("_CHECKPOINT_METADATA", os.path.join("state", "_METADATA"),
                    os.path.join("meta", "metadata"))


def leftovers(directory: str) -> List[Tuple[str, str]]:
  """(path, what it is) of what a stopped writer left in a checkpoint folder: unfinished saves
  (<step>.orbax-checkpoint-tmp*) and half-deleted steps (a <step> folder missing a file every
  committed step holds). Reads nothing but the folder listing."""
  if not os.path.isdir(directory):
    return []
  found = [(path, "an unfinished checkpoint a stopped launch left") for path in
           sorted(glob.glob(os.path.join(directory, "*.orbax-checkpoint-tmp*")))]
  for name in sorted((d for d in os.listdir(directory) if d.isdigit()), key=int):
    path = os.path.join(directory, name)
    missing = [f for f in _COMMITTED_FILES if not os.path.exists(os.path.join(path, f))]
    if os.path.isdir(path) and missing:
      found.append((path, f"checkpoint step {name} a stopped launch left half-deleted (no "
                          f"{', '.join(missing)})"))
  return found


def remove_leftovers(directory: str) -> List[str]:
  """Removes `leftovers(directory)` and returns one line per removal ("removed <path>, <what>").
  Only the writer may call it (holding the lock of the folder's run): a reader would delete a
  save or a delete in progress."""
  lines = []
  for path, what in leftovers(directory):
    shutil.rmtree(path, ignore_errors=True)
    lines.append(f"removed {path}, {what}")
  return lines


_OS_CAUSES = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO)


def os_cause(e: BaseException) -> str:
  """The OS's words for an error somewhere in e's chain ("No space left on device"), also when
  tensorstore wrapped them in its own text; else e's first line, shortened."""
  seen = e
  while seen is not None:
    if isinstance(seen, OSError) and seen.strerror:
      return seen.strerror
    for code in _OS_CAUSES:
      if os.strerror(code) in str(seen):
        return os.strerror(code)
    seen = seen.__cause__ or seen.__context__
  text = str(e).splitlines()[0] if str(e) else ""
  return f"{type(e).__name__}: {text[:200]}"


def room_problem(directory: str, tree: Any, kind: str, where: str) -> Optional[str]:
  """Why a save cannot succeed, found before Orbax starts writing (its failures mid-write come
  with pages of tensorstore and asyncio noise): a folder that cannot be written, or less free
  space than the state's raw size (an upper bound: the arrays are compressed); None when it can.
  checkpoint.py raises it as a CheckpointError."""
  need = sum(int(getattr(x, "nbytes", 8)) for x in jax.tree.leaves(tree) if not mf.is_key(x))
  try:
    os.makedirs(directory, exist_ok=True)
    probe = os.path.join(directory, f".write-probe-{os.getpid()}")
    with open(probe, "wb"):
      pass
    os.remove(probe)
    free = shutil.disk_usage(directory).free
  except OSError as e:
    return (f"Saving the {kind} checkpoint {where} failed ({e.strerror or e}: "
            f"{directory}). Nothing was committed there and the earlier "
            "checkpoints are intact; check permissions and the filesystem.")
  if free < need:
    return (f"Saving the {kind} checkpoint {where} needs up to {need / 2**20:.1f} "
            f"MiB, and {directory} has {free / 2**20:.1f} MiB free (No space left "
            "on device). Nothing was committed there and the earlier checkpoints "
            "are intact; free some space and run the same command again.")
  return None


def delete_advice(kind: str, step_dir: str) -> str:
  """What to delete of a `kind` checkpoint's unreadable step (its folder step_dir)."""
  if kind == "run":
    return (f"Runs fall back to the previous checkpoint by themselves; to drop this one, delete "
            f"{step_dir} only.")
  if kind == "dynamics":
    return f"Delete {os.path.dirname(step_dir)} and the dynamics ensembles are trained again."
  return f"Delete {step_dir} (only that folder) and run again."


class _QuietAbortedReads:
  """Drops the noise of reads tensorstore aborted, and nothing else.

  When one chunk of a step cannot be read (a truncated file), Orbax's event loop ends with that
  error while tensorstore's other reads of the step are still running; each then delivers its
  result to the closed loop from its own thread, and Python prints the RuntimeError "Event loop is
  closed" as an unraisable exception (a traceback each: 63 for a quick run's step), and asyncio
  logs the futures and tasks nobody retrieved. The read's own error is raised as a
  CorruptCheckpointError all the same; these are its echoes. Installed at each read: a sys
  unraisable hook (the previous one handles everything else) and a filter on asyncio's logger
  (only futures whose error names a step folder this process has read)."""

  def __init__(self):
    self.dirs, self.previous = set(), None
    logging.getLogger("asyncio").addFilter(self.filter)

  def install(self):
    """Wraps the process's unraisable hook, unless it is this one already (pytest, say, puts its
    own back after each test)."""
    if sys.unraisablehook != self.unraisable:
      self.previous, sys.unraisablehook = sys.unraisablehook, self.unraisable

  def unraisable(self, unraisable):
    exc, tb = unraisable.exc_value, unraisable.exc_traceback
    frames = []
    while tb is not None:
      frames.append(tb.tb_frame.f_code.co_name)
      tb = tb.tb_next
    if not (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"
            and "call_soon_threadsafe" in frames):
      self.previous(unraisable)

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    return not (text.split("\n")[0].endswith("exception was never retrieved")
                and any(d in text for d in self.dirs))


_QUIET: Optional[_QuietAbortedReads] = None


def quiet_aborted_reads(step_dir: str):
  """Before Orbax reads the step folder `step_dir`: should the read be aborted, its echoes are
  dropped (_QuietAbortedReads)."""
  global _QUIET
  if _QUIET is None:
    _QUIET = _QuietAbortedReads()
  _QUIET.install()
  _QUIET.dirs.add(os.path.abspath(step_dir))
