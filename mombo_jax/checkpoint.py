"""Checkpoints: whole pytrees (TrainStates, optax states, flax.struct dataclasses, PRNG keys,
leading seed axes) saved with Orbax, plus JSON metadata, written atomically and verified on load.

Layout of one checkpoint directory:
  <path>/checkpoint.json   format tag, user metadata, the saved tree's leaves (shape, dtype,
                           typed-key impl), and a (size, crc32) manifest of every file under state/
  <path>/state/            the Orbax PyTree checkpoint of `flax.serialization.to_state_dict(tree)`

Why our own manifest: Orbax/tensorstore do not reliably notice a truncated or overwritten chunk file
(some corruptions decode to wrong numbers silently), and their errors come from deep inside
tensorstore. Checking sizes and CRC32s first gives one clear `CheckpointError` naming the bad file.

Why the temp dir + rename: checkpoint.json is written last, inside a hidden temp dir that is renamed
into place only when complete, so a crash mid-write leaves either the old checkpoint or nothing.

Orbax sees only nested dicts of numpy arrays (Python scalars become 0-d arrays, typed PRNG keys
become their uint32 key data), which keeps it away from custom pytree nodes; the template's own
structure is put back with `flax.serialization.from_state_dict`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import shutil
import uuid
import warnings
import zlib
from typing import Any, Optional

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

FORMAT = "mombo_jax.checkpoint/1"
_META_FILE = "checkpoint.json"
_STATE_DIR = "state"
_ROOT = "tree"
_STEP_RE = re.compile(r"^step_(\d+)$")
_LEFTOVER_RE = re.compile(r"^\.step_\d+\.(tmp|old)-[0-9a-f]+$")
_TMP_TAG = ".tmp-"
_OLD_TAG = ".old-"
_CRC_CHUNK = 1 << 24
_MAX_LISTED = 10          # mismatches listed in an error message before "... and N more"


class CheckpointError(RuntimeError):
  """A checkpoint cannot be written or read; the message names the path and the fix."""


class CorruptCheckpointError(CheckpointError):
  """The files on disk are missing, truncated or altered."""


class TemplateMismatchError(CheckpointError):
  """The checkpoint is intact but does not fit the template (other config, other code version)."""


class CheckpointWarning(UserWarning):
  """RunCheckpointer skipped a corrupt checkpoint."""


# ----------------------------------------------------------------------------------------------
# Tree <-> flat dict of numpy arrays.

def _is_typed_key(x) -> bool:
  dtype = getattr(x, "dtype", None)
  return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _flatten(node, prefix=()):
  """Nested state dict -> ({path tuple: leaf}, [paths of empty dicts], [paths of None])."""
  leaves, empty, nones = {}, [], []
  if isinstance(node, dict):
    if not node:
      empty.append(prefix)
    for key, value in node.items():
      if not isinstance(key, str) or "/" in key:
        raise CheckpointError(f"Checkpoint trees need string dict keys without '/'; got {key!r} "
                              f"at {_fmt(prefix)}. Rename the key before saving.")
      sub = _flatten(value, prefix + (key,))
      leaves.update(sub[0])
      empty += sub[1]
      nones += sub[2]
  elif node is None:
    nones.append(prefix)
  else:
    leaves[prefix] = node
  return leaves, empty, nones


def _state_dict(tree) -> dict:
  # A fixed root key: Orbax wants a non-empty dict at the root, and a bare-array tree gets a path.
  return {_ROOT: flax.serialization.to_state_dict(tree)}


def _is_weak(leaf) -> bool:
  return isinstance(leaf, (bool, int, float)) or bool(getattr(leaf, "weak_type", False))


def _fmt(path) -> str:
  return "/".join(path) if path else "<root>"


def _to_numpy(path, leaf):
  """One leaf -> (numpy array for Orbax, typed-key impl name or None)."""
  if _is_typed_key(leaf):
    return np.asarray(jax.device_get(jax.random.key_data(leaf))), str(jax.random.key_impl(leaf))
  if isinstance(leaf, (jax.Array, np.ndarray, np.generic, bool, int, float)):
    return np.asarray(jax.device_get(leaf)), None
  raise CheckpointError(f"Cannot checkpoint leaf {_fmt(path[1:])} of type "
                        f"{type(leaf).__name__}: only arrays and Python scalars are saved. Mark it "
                        "pytree_node=False or drop it.")


def _nest(flat: dict, empty=(), nones=()) -> dict:
  """{path tuple: value} plus the paths of empty dicts and of Nones -> nested dicts."""
  root: dict = {}
  items = [(p, {}) for p in empty] + [(p, None) for p in nones] + list(flat.items())
  for path, value in items:
    node = root
    for key in path[:-1]:
      node = node.setdefault(key, {})
    if isinstance(value, dict):
      node.setdefault(path[-1], {})
    else:
      node[path[-1]] = value
  return root


def _json_default(obj):
  if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
    return dataclasses.asdict(obj)
  if isinstance(obj, (np.ndarray, np.generic, jax.Array)):
    return np.asarray(obj).tolist()
  raise TypeError(f"{type(obj).__name__} is not JSON serializable")


# ----------------------------------------------------------------------------------------------
# Files.

def _crc32(filename: str) -> int:
  crc = 0
  with open(filename, "rb") as f:
    while chunk := f.read(_CRC_CHUNK):
      crc = zlib.crc32(chunk, crc)
  return crc


def _manifest(root: str) -> dict:
  """{relative path: [size, crc32]} of every file under root/state."""
  out = {}
  for dirpath, _, filenames in os.walk(os.path.join(root, _STATE_DIR)):
    for name in filenames:
      full = os.path.join(dirpath, name)
      out[os.path.relpath(full, root)] = [os.path.getsize(full), _crc32(full)]
  return out


def _fsync_dir(path: str):
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


def _body_crc(body: dict) -> int:
  return zlib.crc32(json.dumps(body, sort_keys=True).encode())


def _read_header(path: str) -> dict:
  """Parse and verify checkpoint.json and the file manifest. Raises CorruptCheckpointError."""
  fix = ("Delete it (or the whole workdir) and re-run, or pass --workdir elsewhere; "
         "RunCheckpointer falls back to an older step automatically.")
  meta_file = os.path.join(path, _META_FILE)
  if not os.path.isdir(path):
    raise CheckpointError(f"No checkpoint at {path}: the directory does not exist. Check the path.")
  if not os.path.isfile(meta_file):
    raise CorruptCheckpointError(f"Checkpoint {path} is incomplete: {_META_FILE} is missing "
                                 "(not written by mombo_jax.checkpoint, or the write was cut off). "
                                 + fix)
  try:
    with open(meta_file) as f:
      header = json.load(f)
    body = header["body"]
    ok = header["crc32"] == _body_crc(body) and body["format"] == FORMAT
  except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
    raise CorruptCheckpointError(f"Checkpoint {path} is corrupt: {meta_file} is unreadable "
                                 f"({type(e).__name__}: {e}). {fix}") from e
  if not ok:
    raise CorruptCheckpointError(f"Checkpoint {path} is corrupt: {meta_file} fails its checksum or "
                                 f"has an unknown format (expected {FORMAT}). {fix}")
  for rel, (size, crc) in body["files"].items():
    full = os.path.join(path, rel)
    if not os.path.isfile(full):
      raise CorruptCheckpointError(f"Checkpoint {path} is corrupt: file {rel} is missing. {fix}")
    actual = os.path.getsize(full)
    if actual != size:
      raise CorruptCheckpointError(f"Checkpoint {path} is corrupt: file {rel} has {actual} bytes, "
                                   f"expected {size} (truncated or overwritten). {fix}")
    if _crc32(full) != crc:
      raise CorruptCheckpointError(f"Checkpoint {path} is corrupt: file {rel} fails its CRC32 "
                                   f"check (contents altered). {fix}")
  return body


def _remove(path: str):
  shutil.rmtree(path, ignore_errors=True)


def _orbax():
  # Imported lazily: Orbax is heavy and only the edges of the program need it.
  import orbax.checkpoint as ocp
  return ocp


# ----------------------------------------------------------------------------------------------
# Public API.

def save_pytree(path: str, tree: Any, metadata: Optional[dict] = None, overwrite: bool = False):
  """Save `tree` (any pytree of arrays / Python scalars, e.g. a TrainState with a leading seed axis)
  and JSON-serialisable `metadata` to the directory `path`, atomically.

  Refuses to replace an existing `path` unless overwrite=True; even then the old checkpoint stays in
  place until the new one is complete.
  """
  path = os.path.abspath(os.fspath(path))
  if os.path.exists(path) and not overwrite:
    raise CheckpointError(f"Checkpoint path {path} already exists. Pass overwrite=True, delete it, "
                          "or choose another path.")
  try:
    meta_json = json.loads(json.dumps(metadata or {}, default=_json_default))
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"Checkpoint metadata for {path} is not JSON-serialisable ({e}). Pass "
                          "plain dicts / lists / numbers / strings (dataclasses and numpy values "
                          "are converted).") from e

  leaves, empty, nones = _flatten(_state_dict(tree))
  arrays, leaf_desc = {}, []
  for p, leaf in leaves.items():
    arr, impl = _to_numpy(p, leaf)
    arrays[p] = arr
    leaf_desc.append([list(p), list(arr.shape), arr.dtype.name, impl, _is_weak(leaf)])

  parent = os.path.dirname(path)
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f".{os.path.basename(path)}{_TMP_TAG}{uuid.uuid4().hex[:12]}")
  try:
    os.makedirs(tmp)
    ocp = _orbax()
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
      ckptr.save(os.path.join(tmp, _STATE_DIR),
                 args=ocp.args.PyTreeSave(_nest(arrays, empty, nones)))
    body = dict(format=FORMAT, metadata=meta_json, leaves=leaf_desc,
                empty=[list(p) for p in empty], nones=[list(p) for p in nones],
                files=_manifest(tmp))
    with open(os.path.join(tmp, _META_FILE), "w") as f:
      json.dump(dict(body=body, crc32=_body_crc(body)), f, indent=1, sort_keys=True)
      f.flush()
      os.fsync(f.fileno())
    _fsync_dir(tmp)
    if os.path.exists(path):
      # Swap: the old checkpoint is moved aside (not deleted) until the new one is in place.
      old = os.path.join(parent, f".{os.path.basename(path)}{_OLD_TAG}{uuid.uuid4().hex[:12]}")
      os.rename(path, old)
      os.rename(tmp, path)
      _remove(old)
    else:
      os.rename(tmp, path)
    _fsync_dir(parent)
  except BaseException as e:
    _remove(tmp)
    if isinstance(e, (CheckpointError, KeyboardInterrupt, SystemExit)):
      raise
    raise CheckpointError(f"Saving checkpoint {path} failed ({type(e).__name__}: {e}). Nothing was "
                          "written there; check free disk space and permissions.") from e


def load_pytree(path: str, template: Any = None):
  """Load a checkpoint written by `save_pytree`. Returns (tree, metadata dict).

  With `template` (a pytree like the one saved: concrete arrays or jax.ShapeDtypeStruct leaves, e.g.
  from jax.eval_shape), the result has the template's structure and node types; jax-array /
  ShapeDtypeStruct leaves come back as jax arrays (on the template's sharding when it has one),
  numpy leaves as numpy, Python scalars as Python scalars, typed PRNG keys as typed keys. Any
  structure, shape or dtype difference -> TemplateMismatchError listing the differences.
  Without a template: nested dicts (flax state-dict form) of numpy arrays; typed PRNG keys come back
  as typed jax key arrays.
  Missing, truncated or altered files -> CorruptCheckpointError naming the file.
  """
  path = os.path.abspath(os.fspath(path))
  body = _read_header(path)
  saved = {tuple(p): (tuple(shape), dtype, impl, weak)
           for p, shape, dtype, impl, weak in body["leaves"]}
  empty = [tuple(p) for p in body["empty"]]
  nones = [tuple(p) for p in body["nones"]]

  if template is not None:
    template_sd = _state_dict(template)
    t_leaves = _flatten(template_sd)[0]
    _check_template(path, saved, t_leaves)

  flat = _restore_arrays(path, saved, empty, nones)
  for p, (_, _, impl, _) in saved.items():
    if impl is not None:
      flat[p] = jax.random.wrap_key_data(jnp.asarray(flat[p]), impl=impl)

  if template is None:
    return _nest(flat, empty, nones)[_ROOT], body["metadata"]
  out = {p: _like(leaf, flat[p], _template_desc(leaf)[1]) for p, leaf in t_leaves.items()}
  try:
    tree = flax.serialization.from_state_dict(template, _fill(template_sd, out)[_ROOT])
  except (ValueError, KeyError, TypeError) as e:
    raise TemplateMismatchError(f"Checkpoint {path} does not fit the template ({e}). It was "
                                "written by a different config or code version: delete the workdir "
                                "or pass --workdir elsewhere.") from e
  return tree, body["metadata"]


def _fill(template_sd, out, prefix=()):
  """The template's state dict with each leaf replaced by out[path]."""
  if isinstance(template_sd, dict):
    return {k: _fill(v, out, prefix + (k,)) for k, v in template_sd.items()}
  if template_sd is None:
    return None
  return out[prefix]


def _template_desc(leaf):
  """(shape, dtype name (None for typed keys), is typed key, is weakly typed) of a template leaf."""
  if isinstance(leaf, (bool, int, float)):
    return (), np.asarray(leaf).dtype.name, False, True
  if _is_typed_key(leaf):
    return tuple(leaf.shape), None, True, False
  if hasattr(leaf, "shape") and hasattr(leaf, "dtype"):
    return tuple(leaf.shape), np.dtype(leaf.dtype).name, False, _is_weak(leaf)
  raise TemplateMismatchError(f"Template leaf of type {type(leaf).__name__} is not an array, "
                              "ShapeDtypeStruct or Python scalar; build the template with the same "
                              "init function as the saved state (jax.eval_shape works).")


def _check_template(path, saved, t_leaves):
  problems = []
  problems += [f"template leaf {_fmt(p[1:])} is not in the checkpoint"
               for p in sorted(set(t_leaves) - set(saved))]
  problems += [f"checkpoint leaf {_fmt(p[1:])} is not in the template"
               for p in sorted(set(saved) - set(t_leaves))]
  for p in sorted(set(t_leaves) & set(saved)):
    shape, dtype, is_key, weak = _template_desc(t_leaves[p])
    s_shape, s_dtype, s_impl, s_weak = saved[p]
    if is_key != (s_impl is not None):
      where = "template" if is_key else "checkpoint"
      problems.append(f"{_fmt(p[1:])}: typed PRNG key in the {where} only (use the same key "
                      "style, jax.random.key or PRNGKey, in both)")
      continue
    if is_key:
      s_shape = s_shape[:-1]          # key data has a trailing axis of key words
    if shape != s_shape:
      problems.append(f"{_fmt(p[1:])}: shape {s_shape} in checkpoint, {shape} in template")
    elif not is_key and dtype != s_dtype:
      # Weakly typed leaves (Python scalars such as TrainState.create's step=0, which eval_shape
      # turns into int32) may change width, not kind; the template's dtype wins.
      if not ((weak or s_weak) and np.dtype(s_dtype).kind == np.dtype(dtype).kind):
        problems.append(f"{_fmt(p[1:])}: dtype {s_dtype} in checkpoint, {dtype} in template")
  if problems:
    shown = problems[:_MAX_LISTED]
    more = f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
    raise TemplateMismatchError(
        f"Checkpoint {path} does not match the template ({len(problems)} difference(s)):\n  "
        + "\n  ".join(shown) + more + "\nIt was written by a different config (seeds, network "
        "sizes, env) or code version. Delete the workdir or pass --workdir elsewhere.")


def _restore_arrays(path, saved, empty, nones) -> dict:
  """Read every leaf as numpy: {path tuple: np.ndarray}."""
  ocp = _orbax()
  args = {p: ocp.RestoreArgs(restore_type=np.ndarray) for p in saved}
  try:
    with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as ckptr:
      restored = ckptr.restore(os.path.join(path, _STATE_DIR),
                               args=ocp.args.PyTreeRestore(restore_args=_nest(args, empty, nones)))
  except Exception as e:  # tensorstore raises many types; one clear message for all of them
    raise CorruptCheckpointError(
        f"Checkpoint {path} could not be read by Orbax ({type(e).__name__}: {str(e)[:500]}). Its "
        "files pass their checksums, so it may come from an incompatible Orbax version. Delete it "
        "(or the workdir) and re-run, or pass --workdir elsewhere.") from e
  flat = _flatten(restored)[0]
  for p, (shape, dtype, _, _) in saved.items():
    arr = flat.get(p)
    got = None if arr is None else (tuple(np.shape(arr)), np.asarray(arr).dtype.name)
    if got != (shape, dtype):
      raise CorruptCheckpointError(f"Checkpoint {path} is inconsistent: leaf {_fmt(p[1:])} came "
                                   f"back as {got}, expected {(shape, dtype)}. Delete it and "
                                   "re-run.")
  return {p: np.asarray(flat[p]) for p in saved}


def _like(template_leaf, value, dtype):
  """The restored value in the template leaf's kind (jax array, numpy, Python scalar, typed key)
  and dtype (None for typed keys)."""
  if isinstance(template_leaf, (bool, int, float)):
    return type(template_leaf)(value.item())
  if dtype is not None:
    value = np.asarray(value, dtype=dtype)
  if isinstance(template_leaf, (np.ndarray, np.generic)):
    return value
  sharding = getattr(template_leaf, "sharding", None)
  if sharding is not None:
    return jax.device_put(value, sharding)
  return value if _is_typed_key(value) else jnp.asarray(value)


class RunCheckpointer:
  """Numbered checkpoints of one run: `<directory>/step_<NNNNNNNNN>` (e.g. <workdir>/checkpoints).

  save(step, state, metadata) writes atomically and then keeps the newest `keep` (always including
  the one just written); restore(template) loads the newest valid one, skipping corrupt ones with a
  CheckpointWarning. The restored metadata carries "step", the step actually restored.
  """

  def __init__(self, directory: str, keep: Optional[int] = 3):
    if keep is not None and keep < 1:
      raise ValueError(f"keep must be >= 1 or None (keep all), got {keep}.")
    self.directory = os.path.abspath(os.fspath(directory))
    self.keep = keep
    os.makedirs(self.directory, exist_ok=True)
    # Leftovers of writes killed mid-way: never valid, so safe to drop.
    for name in os.listdir(self.directory):
      if _LEFTOVER_RE.match(name):
        logging.info("Removing unfinished checkpoint write %s", name)
        _remove(os.path.join(self.directory, name))

  def path(self, step: int) -> str:
    return os.path.join(self.directory, f"step_{int(step):09d}")

  def steps(self) -> list:
    """Committed steps (checkpoint.json present), ascending. Not checksum-verified."""
    out = []
    for name in os.listdir(self.directory):
      m = _STEP_RE.match(name)
      if m and os.path.isfile(os.path.join(self.directory, name, _META_FILE)):
        out.append(int(m.group(1)))
    return sorted(out)

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
    if "step" in metadata and metadata["step"] != step:
      raise ValueError(f"metadata['step'] = {metadata['step']} disagrees with step = {step}.")
    metadata["step"] = step
    save_pytree(self.path(step), state, metadata, overwrite=True)
    if self.keep is not None:
      others = [s for s in self.steps() if s != step]
      for old in others[:max(len(others) - (self.keep - 1), 0)]:
        _remove(self.path(old))

  def restore(self, template: Any = None, step: Optional[int] = None):
    """(state, metadata) of `step`, or of the newest valid step when step is None."""
    if step is not None:
      return load_pytree(self.path(step), template)
    steps = self.steps()
    if not steps:
      raise CheckpointError(f"No checkpoint in {self.directory}. Start the run without resuming, "
                            "or point --workdir at the run to resume.")
    skipped = []
    for s in reversed(steps):
      try:
        state, meta = load_pytree(self.path(s), template)
      except CorruptCheckpointError as e:
        skipped.append(s)
        warnings.warn(f"Skipping corrupt checkpoint at step {s}: {e}", CheckpointWarning,
                      stacklevel=2)
        continue
      if skipped:
        warnings.warn(f"Fell back to checkpoint step {s} because newer step(s) {skipped} are "
                      "corrupt.", CheckpointWarning, stacklevel=2)
      return state, meta
    raise CheckpointError(f"Every checkpoint in {self.directory} is corrupt (steps {steps}). "
                          "Delete the workdir and start again, or pass --workdir elsewhere.")
