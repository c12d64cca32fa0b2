"""One checkpoint step, its format: a pytree written as an Orbax step with its manifest
(`encode`, `save_step`) and read back verified (`read_step`), and the errors a checkpoint raises.
checkpoint.py builds the public calls on it (save_pytree / load_pytree, RunCheckpointer's keep-N
and fall-back).

Every checkpoint is a step folder `<dir>/<n>/` of two items:
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
the leaf and the shard. A read that tensorstore aborts leaves its other reads to finish on a
closed event loop; their noise (a traceback each) is dropped: checkpoint_files.quiet_aborted_reads.

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
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from mombo_jax.storage import manifest as mf
from mombo_jax.storage.checkpoint_files import delete_advice, os_cause, quiet_aborted_reads

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


def _json_default(obj):
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    return dataclasses.asdict(obj)
  if isinstance(obj, (np.ndarray, np.generic, jax.Array)):
    return np.asarray(obj).tolist()
  raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def encode(tree: Any, metadata: Optional[dict], kind: str, where: str):
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


def manager(directory: str, keep: Optional[int], create: bool = True, cleanup: bool = True):
  """Orbax's CheckpointManager of a checkpoint folder, steps of the items state and meta."""
  # cleanup: remove the unfinished step folders a killed save left. Only a writer (holding the
  # run's lock) may: a reader would delete the save in progress of a live run.
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                         enable_async_checkpointing=False,
                                         cleanup_tmp_directories=cleanup)
  return ocp.CheckpointManager(directory, options=options, item_names=("state", "meta"))


def save_step(mngr, step: int, encoded, kind: str):
  """Commits `encoded` (encode's pair) as step `step`, or raises a CheckpointError with the OS's
  cause, leaving no unfinished folder behind."""
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


def read_meta(mngr, step: int, kind: str) -> dict:
  """The meta item of `step` (format, kind, the caller's metadata, the manifest), unverified."""
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


def _mismatch(kind: str, step_dir: str, problems: list) -> TemplateMismatchError:
  shown = problems[:_MAX_LISTED] + ([f"... and {len(problems) - _MAX_LISTED} more"]
                                    if len(problems) > _MAX_LISTED else [])
  return TemplateMismatchError(
      f"The {kind} checkpoint {step_dir} does not match the template ({len(problems)} "
      "difference(s)):\n  " + "\n  ".join(shown) + "\nIt was written by a different config "
      "(seeds, network sizes, env) or code version: pass another --workdir (or "
      "--dynamics_dir) for this config.")


def _host_template(template: Any, saved: dict):
  """The template Orbax reads into: every array as the host array of its saved dtype (typed keys:
  their uint32 key data), so that the CRC sees the saved bytes; Python scalars as they are."""
  return mf.leaf_map(lambda p, x: x if isinstance(x, mf.SCALARS) else np.broadcast_to(
      np.zeros((), "uint32" if saved[p][4] else saved[p][1]), saved[p][0]), template)


def _orbax_read(mngr, step: int, template: Any, partial: bool, step_dir: str):
  """The state item of `step` as Orbax reads it into `template` (None: Orbax's own form)."""
  quiet_aborted_reads(step_dir)
  if partial:
    # The manager's "state" item is bound to StandardRestore, which has no partial restore.
    with ocp.PyTreeCheckpointer() as reader:
      return reader.restore(os.path.join(step_dir, "state"), args=ocp.args.PyTreeRestore(
          template, ocp.checkpoint_utils.construct_restore_args(template), partial_restore=True))
  # Without a template Orbax puts typed keys (the only device arrays saved) on their saved
  # devices, or, where those do not exist here, on the default device.
  tree = mngr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(
      template, fallback_sharding=jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))))
  tree = tree["state"]
  if template is None:   # Orbax's own form: leaves saved split over devices come back numpy
    tree = jax.tree.map(lambda x: x if mf.is_key(x) or not isinstance(x, jax.Array)
                        else np.asarray(x), tree)
  return tree


def _verify(tree: Any, saved: dict, partial: bool, kind: str, step_dir: str):
  """Raises a CorruptCheckpointError unless every leaf read matches its manifest entry's CRC32."""
  fix, got = delete_advice(kind, step_dir), mf.leaves(tree)
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


def _place(tree: Any, like: dict, saved: dict):
  """Each verified host leaf as its template leaf `like[path]` has it (sharding, numpy, scalar,
  typed key)."""
  def place(path, x):
    impl = saved[path][4]
    if isinstance(like[path], mf.SCALARS):
      return x
    x = jax.random.wrap_key_data(x, impl=impl) if impl else np.asarray(x, like[path].dtype)
    if isinstance(like[path], (np.ndarray, np.generic)):
      return x
    return jax.device_put(x, getattr(like[path], "sharding", None))   # None: the default device
  return mf.leaf_map(place, tree)


def read_step(mngr, step: int, template: Any, kind: str, partial: bool = False):
  """(tree, user metadata) of one step, verified; see the module docstring for templates."""
  step_dir = os.path.join(str(mngr.directory), str(step))
  body = read_meta(mngr, step, kind)
  saved = {tuple(p): (tuple(shape), dtype, weak, crc, impl)
           for p, shape, dtype, weak, crc, impl in body["leaves"]}
  like = None
  if template is not None:
    like = mf.leaves(template)
    problems = mf.mismatches(saved, like, partial)
    if problems:
      raise _mismatch(kind, step_dir, problems)
    template = _host_template(template, saved)
  elif partial:
    raise ValueError("A partial restore needs a template: the sub-tree to read.")
  try:
    tree = _orbax_read(mngr, step, template, partial, step_dir)
  except Exception as e:  # tensorstore raises many types; one clear message for all of them
    if isinstance(e, ValueError) and "do not match" in str(e):  # empty nodes: Orbax compares them
      raise _mismatch(kind, step_dir, [str(e).split("\nIf this mismatch")[0]]) from e
    raise CorruptCheckpointError(
        f"The {kind} checkpoint {step_dir} could not be read by Orbax ({type(e).__name__}: "
        f"{str(e)[:300]}): files are missing, truncated or altered. "
        f"{delete_advice(kind, step_dir)}") from e
  _verify(tree, saved, partial, kind, step_dir)
  return (tree if like is None else _place(tree, like, saved)), body["metadata"]
