"""Checkpoints: whole pytrees (TrainStates, optax states, flax.struct dataclasses, typed and uint32
PRNG keys, Python scalars, leading seed axes) as Orbax CheckpointManager steps, verified on load.

Every checkpoint (a run's: `RunCheckpointer`, keep-N numbered steps; the dynamics ensembles and
their unfinished training; the collector's SAC state) is a step folder `<dir>/<n>/` of two items:
  state/  the tree, written by Orbax's StandardSave: whole arrays from host copies; arrays split
          over devices (a launch's cell-sharded state) as they are, each process writing the
          shards on its own devices, nothing gathered (typed PRNG keys Orbax stores as key data
          plus their impl)
  meta/   JSON: format tag, kind, the caller's metadata and a manifest of every leaf: path, shape,
          dtype, weakly typed or not, CRC32 of its bytes (of its key data for a typed key), key
          impl. A leaf split over devices has instead of one CRC32 a list of [block, CRC32], one
          per distinct shard (block: [start, stop] per dim), each computed by a process holding
          it and shared in one allgather of the CRC table (format /4; without such leaves /3)
Orbax gives the atomic commit (a step is written to a temporary folder and renamed into place; a
killed write leaves no step behind), keep-N and the latest step.

Why the CRC32s: Orbax does not notice every corruption. A byte flipped inside a stored chunk
restores silently as wrong numbers (tests/test_checkpoint.py shows it with Orbax alone); truncated
or missing chunks do raise, deep inside tensorstore. Checking every leaf read against the manifest
(per shard where it lists shards) turns both into one `CorruptCheckpointError` naming the step,
the leaf and the shard.

Templates: a pytree like the one saved, of concrete arrays or jax.ShapeDtypeStructs (jax.eval_shape
of the init function). It is checked against the manifest first, so every structure, shape and
dtype difference is listed before any array is read (Orbax alone would cast dtypes silently).
Weakly typed leaves (Python scalars) may change width, not kind: TrainState.create's step=0 is int32
under eval_shape, int64 when saved. Orbax's StandardRestore then reads into the template's structure
and node types (static fields such as apply_fn come from the template), every array to the host in
its saved dtype (every process reads all of each leaf it restores, whoever wrote it: a checkpoint
of 2 processes resumes in 1), so that the CRC sees the saved bytes; each leaf is then placed as
the template has it: on its sharding, on the default device for a ShapeDtypeStruct without one,
numpy for numpy, Python scalar for Python scalar, typed key for typed key. `partial=True` reads
only the leaves of a template that is a sub-tree of the saved one, e.g. the actor's parameters
(Orbax's partial restore).
Without a template: Orbax's own form, nested dicts (custom nodes as dicts of their fields) and lists
(tuples) of numpy arrays, Python scalars and typed key arrays.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import shutil
import warnings
from typing import Any, Callable, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from mombo_jax.storage import manifest as mf
from mombo_jax.storage.checkpoint_files import (
  delete_advice,
  os_cause,
  remove_leftovers,
  room_problem,
)

# What the meta item's manifest holds per leaf: /3 one CRC32 of the whole leaf; /4 (written when
# some leaf is split over devices) also, for such leaves, a CRC32 per shard. Both are read.
FORMAT = "mombo_jax.checkpoint/3"
FORMAT_SHARDED = "mombo_jax.checkpoint/4"
READ_FORMATS = (FORMAT, FORMAT_SHARDED)
_MAX_LISTED = 10          # differences listed in an error message before "... and N more"


class CheckpointError(RuntimeError):
  """A checkpoint cannot be written or read; the message names the path and the fix."""


class CorruptCheckpointError(CheckpointError):
  """The files on disk are missing, truncated or altered."""


class TemplateMismatchError(CheckpointError):
  """The checkpoint is intact but does not fit the template (other config, other code version)."""


class CheckpointWarning(UserWarning):
  """RunCheckpointer skipped a corrupt checkpoint."""


def _json_default(obj):
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    return dataclasses.asdict(obj)
  if isinstance(obj, (np.ndarray, np.generic, jax.Array)):
    return np.asarray(obj).tolist()
  raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _encode(tree: Any, metadata: Optional[dict], kind: str, where: str):
  """-> (the tree as Orbax writes it, the meta item). Fails before anything touches the disk.

  Whole leaves go to Orbax as host copies (one copy serves the CRC and the write); leaves split
  over devices go as they are: Orbax writes each process's own shards, and the manifest lists a
  CRC per distinct shard (each process computes those of its shards; manifest.combine shares them).
  In a multi-process run every process calls this together, with the same tree structure."""
  try:
    meta_json = json.loads(json.dumps(metadata or {}, default=_json_default))
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"Checkpoint metadata for {where} is not JSON-serialisable ({e}). Pass "
                          "plain dicts / lists / numbers / strings (dataclasses and numpy values "
                          "are converted).") from e
  manifest = []

  def leaf(path, x):
    if not isinstance(x, mf.LEAF_TYPES):
      raise CheckpointError(f"Cannot checkpoint leaf {mf.fmt(path)} of type {type(x).__name__} in "
                            f"{where}: only arrays and Python scalars are saved. Mark it "
                            "pytree_node=False or drop it.")
    impl = str(jax.random.key_impl(x)) if mf.is_key(x) else None
    if not mf.whole(x):
      manifest.append([list(path), *mf.describe(x), mf.is_weak(x), mf.shard_crcs(x), impl])
      return x
    data = mf.host(x)
    manifest.append([list(path), *mf.describe(x), mf.is_weak(x), mf.crc_of(data), impl])
    # One host copy serves the CRC and Orbax; typed keys and Python scalars Orbax takes as they are.
    return x if mf.is_key(x) or isinstance(x, mf.SCALARS) else data
  tree = mf.leaf_map(leaf, tree)
  try:
    mf.combine(manifest, where)
  except ValueError as e:
    raise CheckpointError(str(e)) from None
  sharded = any(isinstance(leaf[4], list) for leaf in manifest)
  return tree, dict(format=FORMAT_SHARDED if sharded else FORMAT, kind=kind, metadata=meta_json,
                    leaves=manifest)


def _manager(directory: str, keep: Optional[int], create: bool = True, cleanup: bool = True):
  # cleanup: remove the unfinished step folders a killed save left. Only a writer (holding the
  # run's lock) may: a reader would delete the save in progress of a live run.
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                         enable_async_checkpointing=False,
                                         cleanup_tmp_directories=cleanup)
  return ocp.CheckpointManager(directory, options=options, item_names=("state", "meta"))


def _save_step(mngr, step: int, encoded, kind: str):
  where = os.path.join(str(mngr.directory), str(step))
  try:
    saved = mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(encoded[0]),
                                                    meta=ocp.args.JsonSave(encoded[1])), force=True)
    mngr.wait_until_finished()
  except Exception as e:  # Orbax / tensorstore / OS errors: one clear message
    # The unfinished step folder would fill the disk further: removed now (and any left by a
    # killed process at the next start, by the writer's manager).
    for tmp in glob.glob(where + ".orbax-checkpoint-tmp*"):
      shutil.rmtree(tmp, ignore_errors=True)
    raise CheckpointError(f"Saving the {kind} checkpoint {where} failed ({os_cause(e)}). "
                          "Nothing was committed there and the earlier checkpoints are intact; "
                          "check free disk space and permissions.") from None
  if not saved:
    raise CheckpointError(f"Orbax declined to save the {kind} checkpoint {where} (a step at or "
                          "after it exists).")


def _read_meta(mngr, step: int, kind: str) -> dict:
  step_dir = os.path.join(str(mngr.directory), str(step))
  try:
    body = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    found = body.get("format")
  except Exception as e:
    raise CorruptCheckpointError(f"The {kind} checkpoint {step_dir} is corrupt: its meta item is "
                                 f"unreadable ({type(e).__name__}: {str(e)[:300]}). "
                                 + delete_advice(kind, step_dir)) from e
  if found not in READ_FORMATS:  # not a CorruptCheckpointError: an older step would not help
    raise CheckpointError(f"The {kind} checkpoint {step_dir} has the format {found!r}; this "
                          f"version of mombo_jax reads {' and '.join(READ_FORMATS)} only. Delete "
                          f"{os.path.dirname(step_dir)} to start that part again, or use the "
                          "mombo_jax version that wrote it.")
  return body


def _read_step(mngr, step: int, template: Any, kind: str, partial: bool = False):
  """(tree, user metadata) of one step, verified; see the module docstring for templates."""
  step_dir = os.path.join(str(mngr.directory), str(step))
  fix, body = delete_advice(kind, step_dir), _read_meta(mngr, step, kind)
  saved = {tuple(p): (tuple(shape), dtype, weak, crc, impl)
           for p, shape, dtype, weak, crc, impl in body["leaves"]}

  def mismatch(problems):
    shown = problems[:_MAX_LISTED] + ([f"... and {len(problems) - _MAX_LISTED} more"]
                                      if len(problems) > _MAX_LISTED else [])
    return TemplateMismatchError(
        f"The {kind} checkpoint {step_dir} does not match the template ({len(problems)} "
        "difference(s)):\n  " + "\n  ".join(shown) + "\nIt was written by a different config "
        "(seeds, network sizes, env) or code version: pass another --workdir (or "
        "--dynamics_dir) for this config.")
  if template is not None:
    leaves = mf.leaves(template)
    problems = mf.mismatches(saved, leaves, partial)
    if problems:
      raise mismatch(problems)
    # Orbax reads every array to the host in its saved dtype (typed keys: their key data): the CRC
    # is of those bytes, and placing a leaf as the template has it is one device_put after.
    template = mf.leaf_map(lambda p, x: x if isinstance(x, mf.SCALARS) else np.broadcast_to(
        np.zeros((), "uint32" if saved[p][4] else saved[p][1]), saved[p][0]), template)
  elif partial:
    raise ValueError("A partial restore needs a template: the sub-tree to read.")
  try:
    if partial:
      # The manager's "state" item is bound to StandardRestore, which has no partial restore.
      with ocp.PyTreeCheckpointer() as reader:
        tree = reader.restore(os.path.join(step_dir, "state"), args=ocp.args.PyTreeRestore(
            template, ocp.checkpoint_utils.construct_restore_args(template), partial_restore=True))
    else:
      # Without a template Orbax puts typed keys (the only device arrays saved) on their saved
      # devices, or, where those do not exist here, on the default device.
      tree = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(
          template, fallback_sharding=jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))))
      tree = tree["state"]
      if template is None:   # Orbax's own form: leaves saved split over devices come back numpy
        tree = jax.tree.map(lambda x: x if mf.is_key(x) or not isinstance(x, jax.Array)
                            else np.asarray(x), tree)
  except Exception as e:  # tensorstore raises many types; one clear message for all of them
    if isinstance(e, ValueError) and "do not match" in str(e):  # empty nodes: Orbax compares them
      raise mismatch([str(e).split("\nIf this mismatch")[0]]) from e
    raise CorruptCheckpointError(
        f"The {kind} checkpoint {step_dir} could not be read by Orbax ({type(e).__name__}: "
        f"{str(e)[:300]}): files are missing, truncated or altered. {fix}") from e

  got = mf.leaves(tree)
  if not partial and set(got) != set(saved):
    raise CorruptCheckpointError(f"The {kind} checkpoint {step_dir} is inconsistent: Orbax "
                                 "restored other leaves than its manifest lists. " + fix)
  for p, x in got.items():
    shape, dtype, _, crc, impl = saved[p]
    where = mf.failed_crc(x, shape, dtype, crc, impl)
    if where is not None:
      raise CorruptCheckpointError(
          f"The {kind} checkpoint {step_dir} is corrupt: leaf {mf.fmt(p)} fails its CRC32 check"
          f"{where} (its stored bytes were altered). " + fix)
  if template is None:
    return tree, body["metadata"]

  def place(path, x):
    like, impl = leaves[path], saved[path][4]
    if isinstance(like, mf.SCALARS):
      return x
    x = jax.random.wrap_key_data(x, impl=impl) if impl else np.asarray(x, like.dtype)
    if isinstance(like, (np.ndarray, np.generic)):
      return x
    return jax.device_put(x, getattr(like, "sharding", None))   # None: the default device
  return mf.leaf_map(place, tree), body["metadata"]


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
  encoded = _encode(tree, metadata, kind, path)
  mngr = _manager(path, keep=1)
  try:
    latest = mngr.latest_step()
    _save_step(mngr, 0 if latest is None else latest + 1, encoded, kind)
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
  mngr = _manager(path, keep=None, create=False, cleanup=False)
  try:
    step = mngr.latest_step()
    if step is None:
      raise CorruptCheckpointError(f"The {kind} checkpoint {path} holds no committed step (the "
                                   f"write was cut off, or it is not a checkpoint). Delete {path} "
                                   "and run again.")
    return _read_step(mngr, step, template, kind)
  finally:
    mngr.close()


class RunCheckpointer:
  """Numbered checkpoints of one run in `directory` (e.g. <workdir>/checkpoints), one Orbax
  CheckpointManager step each.

  save(step, state, metadata) commits atomically and keeps the newest `keep` (always including
  the one just written; steps after it, left by a timeline that was abandoned when an older step was
  restored, are removed first). restore(template) loads the newest valid one, skipping corrupt ones
  with a CheckpointWarning. The restored metadata carries "step", the step actually restored.
  `kind` names the checkpoints in messages ("run", "dynamics training", "collector"). A writer
  (keep not None; the one process holding the folder's lock) first removes what a stopped writer
  left (remove_leftovers: unfinished saves, half-deleted steps), saying so in one `log` line each.
  """

  def __init__(self, directory: str, keep: Optional[int] = 3, kind: str = "run",
               log: Optional[Callable[[str], Any]] = print):
    if keep is not None and keep < 1:
      raise ValueError(f"keep must be >= 1 or None (keep all), got {keep}.")
    self.directory = os.path.abspath(os.fspath(directory))
    self.keep, self.kind = keep, kind
    if os.path.exists(self.directory) and not os.path.isdir(self.directory):
      raise CheckpointError(f"{self.directory} is a file, not a checkpoint folder.")
    # keep=None is a reader (keeps everything, writes nothing): it leaves unfinished saves and
    # half-deleted steps alone. A writer removes them before Orbax sees them (one note each).
    if keep is not None and jax.process_index() == 0:
      for line in remove_leftovers(self.directory):
        if log is not None:
          log(f"note: {line}.")
    self._mngr = _manager(self.directory, keep, cleanup=keep is not None)

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
    encoded = _encode(state, metadata, self.kind, self.path(step))
    for stale in [s for s in self.steps() if s >= step]:
      self._mngr.delete(stale)
    _save_step(self._mngr, step, encoded, self.kind)

  def metadata(self, step: Optional[int] = None) -> Optional[dict]:
    """The user metadata of `step` (default: the latest) without reading any array, e.g. to
    build the template; None when there is no checkpoint."""
    step = self.latest_step() if step is None else int(step)
    return None if step is None else dict(_read_meta(self._mngr, step, self.kind)["metadata"])

  def nbytes(self, template: Any = None, step: Optional[int] = None) -> tuple:
    """(bytes of the leaves of `template`, a sub-tree of the saved state as restore(partial=True)
    takes it (None: all of them); bytes of every leaf) of `step` (default: the latest), as held in
    memory (shape x itemsize; typed keys: their key data), from its manifest alone: no array is
    read. Tells what a partial restore reads of the whole."""
    step = self.latest_step() if step is None else int(step)
    if step is None:
      raise CheckpointError(f"No {self.kind} checkpoint in {self.directory}.")
    sizes = {tuple(leaf[0]): mf.nbytes(leaf)
             for leaf in _read_meta(self._mngr, step, self.kind)["leaves"]}
    total = sum(sizes.values())
    return (total if template is None else sum(sizes.get(p, 0) for p in mf.leaves(template))), total

  def restore(self, template: Any = None, step: Optional[int] = None, partial: bool = False):
    """(state, metadata) of `step`, or of the newest valid step when step is None.

    partial=True reads only the leaves of `template`, a sub-tree of the saved state with the same
    paths from the root (e.g. {"agent": {"actor": {"params": ...}}}), and checks their CRCs."""
    if step is not None:
      return _read_step(self._mngr, int(step), template, self.kind, partial)
    steps = self.steps()
    if not steps:
      raise CheckpointError(f"No {self.kind} checkpoint in {self.directory}.")
    skipped = []
    for s in reversed(steps):
      try:
        state, meta = _read_step(self._mngr, s, template, self.kind, partial)
      except CorruptCheckpointError as e:
        skipped.append(s)
        warnings.warn(f"Skipping corrupt {self.kind} checkpoint at step {s}: {e}",
                      CheckpointWarning, stacklevel=2)
        continue
      if skipped:
        warnings.warn(f"Fell back to {self.kind} checkpoint step {s} because newer step(s) "
                      f"{skipped} are corrupt.", CheckpointWarning, stacklevel=2)
      return state, meta
    raise CheckpointError(f"Every {self.kind} checkpoint in {self.directory} is corrupt (steps "
                          f"{steps}). Delete {self.directory} to start that part again.")

  def close(self):
    self._mngr.close()
