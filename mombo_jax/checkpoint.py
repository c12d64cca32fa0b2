"""Checkpoints: whole pytrees (TrainStates, optax states, flax.struct dataclasses, PRNG keys,
leading seed axes) through Orbax's CheckpointManager, plus JSON metadata, verified on load.

One mechanism for everything that is saved: run checkpoints (`RunCheckpointer`, keep-N numbered
steps), the dynamics ensembles and their unfinished training, and the collector's SAC state. Each is
a CheckpointManager directory `<dir>/<step>/` with two items:
  state/   the Orbax PyTree of `flax.serialization.to_state_dict(tree)` as numpy arrays
  meta/    JSON: format tag, kind, user metadata, the saved leaves (shape, dtype, typed-key impl)
           and a CRC32 of every leaf's bytes
Orbax gives the atomic commit (a step is written to a temporary folder and renamed into place; a
killed write leaves no step behind), keep-N and the latest step.

Why the per-leaf CRC32s: Orbax does not notice every corruption. A byte flipped inside a stored
chunk restores silently as wrong numbers (tests/test_checkpoint.py shows it with Orbax alone);
truncated or zeroed chunks do raise, deep inside tensorstore. Checking the restored values against
the CRCs turns both into one clear `CorruptCheckpointError` naming the step and the leaf.

Orbax sees only nested dicts of numpy arrays (Python scalars become 0-d arrays, typed PRNG keys
become their uint32 key data), which keeps it away from custom pytree nodes; the template's own
structure is put back with `flax.serialization.from_state_dict`.
"""
from __future__ import annotations

import dataclasses
import json
import os
import warnings
import zlib
from typing import Any, Optional

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np

FORMAT = "mombo_jax.checkpoint/2"
_ROOT = "tree"
_ITEMS = ("state", "meta")
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
# Orbax storage.

def _orbax():
  # Imported lazily: Orbax is heavy and only the edges of the program need it.
  import orbax.checkpoint as ocp
  return ocp


def _manager(directory: str, keep: Optional[int], create: bool = True):
  ocp = _orbax()
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=create,
                                         enable_async_checkpointing=False,
                                         cleanup_tmp_directories=True)
  return ocp.CheckpointManager(directory, options=options, item_names=_ITEMS)


def _leaf_crc(arr: np.ndarray) -> int:
  return zlib.crc32(np.ascontiguousarray(arr).tobytes())


def _encode(tree: Any, metadata: Optional[dict], kind: str, where: str):
  """-> (nested numpy dict for Orbax, JSON body for the meta item)."""
  try:
    meta_json = json.loads(json.dumps(metadata or {}, default=_json_default))
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"Checkpoint metadata for {where} is not JSON-serialisable ({e}). Pass "
                          "plain dicts / lists / numbers / strings (dataclasses and numpy values "
                          "are converted).") from e
  leaves, empty, nones = _flatten(_state_dict(tree))
  arrays, leaf_desc = {}, []
  for p, leaf in leaves.items():
    arr, impl = _to_numpy(p, leaf)
    arrays[p] = arr
    leaf_desc.append([list(p), list(arr.shape), arr.dtype.name, impl, _is_weak(leaf),
                      _leaf_crc(arr)])
  body = dict(format=FORMAT, kind=kind, metadata=meta_json, leaves=leaf_desc,
              empty=[list(p) for p in empty], nones=[list(p) for p in nones])
  return _nest(arrays, empty, nones), body


def _save_step(mngr, step: int, tree: Any, metadata: Optional[dict], kind: str):
  ocp = _orbax()
  where = os.path.join(str(mngr.directory), str(step))
  state, body = _encode(tree, metadata, kind, where)
  try:
    saved = mngr.save(step, args=ocp.args.Composite(state=ocp.args.PyTreeSave(state),
                                                    meta=ocp.args.JsonSave(body)), force=True)
    mngr.wait_until_finished()
  except (KeyboardInterrupt, SystemExit):
    raise
  except Exception as e:  # Orbax / tensorstore / OS errors: one clear message
    raise CheckpointError(f"Saving the {kind} checkpoint {where} failed ({type(e).__name__}: {e}). "
                          "Nothing was committed there; check free disk space and "
                          "permissions.") from e
  if not saved:
    raise CheckpointError(f"Orbax declined to save the {kind} checkpoint {where} (a step at or "
                          "after it exists).")


def _fix(kind: str, step_dir: str) -> str:
  if kind == "run":
    return (f"Runs fall back to the previous checkpoint by themselves; to drop this one, delete "
            f"{step_dir} only.")
  if kind == "dynamics":
    return f"Delete {os.path.dirname(step_dir)} and the dynamics ensembles are trained again."
  return f"Delete {step_dir} (only that folder) and run again."


def _read_step(mngr, step: int, template: Any, kind: str):
  """(tree, user metadata) of one step, verified; see load_pytree for the template rules."""
  ocp = _orbax()
  step_dir = os.path.join(str(mngr.directory), str(step))
  fix = _fix(kind, step_dir)
  try:
    body = mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    saved = {tuple(p): (tuple(shape), dtype, impl, weak, crc)
             for p, shape, dtype, impl, weak, crc in body["leaves"]}
    empty = [tuple(p) for p in body["empty"]]
    nones = [tuple(p) for p in body["nones"]]
    ok = body.get("format") == FORMAT
  except (KeyboardInterrupt, SystemExit):
    raise
  except Exception as e:
    raise CorruptCheckpointError(f"The {kind} checkpoint {step_dir} is corrupt: its meta item is "
                                 f"unreadable ({type(e).__name__}: {str(e)[:300]}). {fix}") from e
  if not ok:
    raise CorruptCheckpointError(f"The {kind} checkpoint {step_dir} has an unknown format "
                                 f"{body.get('format')!r} (expected {FORMAT}). {fix}")

  if template is not None:
    template_sd = _state_dict(template)
    t_leaves = _flatten(template_sd)[0]
    _check_template(step_dir, kind, saved, t_leaves)

  args = {p: ocp.RestoreArgs(restore_type=np.ndarray) for p in saved}
  try:
    restored = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(restore_args=_nest(args, empty, nones))))["state"]
  except (KeyboardInterrupt, SystemExit):
    raise
  except Exception as e:  # tensorstore raises many types; one clear message for all of them
    raise CorruptCheckpointError(
        f"The {kind} checkpoint {step_dir} could not be read by Orbax ({type(e).__name__}: "
        f"{str(e)[:300]}): files are missing, truncated or altered. {fix}") from e
  flat = _flatten(restored)[0]
  for p, (shape, dtype, _, _, crc) in saved.items():
    arr = flat.get(p)
    got = None if arr is None else (tuple(np.shape(arr)), np.asarray(arr).dtype.name)
    if got != (shape, dtype):
      raise CorruptCheckpointError(f"The {kind} checkpoint {step_dir} is inconsistent: leaf "
                                   f"{_fmt(p[1:])} came back as {got}, expected {(shape, dtype)}. "
                                   + fix)
    if _leaf_crc(np.asarray(arr)) != crc:
      raise CorruptCheckpointError(f"The {kind} checkpoint {step_dir} is corrupt: leaf "
                                   f"{_fmt(p[1:])} fails its CRC32 check (its stored bytes were "
                                   f"altered). {fix}")
  flat = {p: np.asarray(flat[p]) for p in saved}
  for p, (_, _, impl, _, _) in saved.items():
    if impl is not None:
      flat[p] = jax.random.wrap_key_data(jnp.asarray(flat[p]), impl=impl)

  if template is None:
    return _nest(flat, empty, nones)[_ROOT], body["metadata"]
  out = {p: _like(leaf, flat[p], _template_desc(leaf)[1]) for p, leaf in t_leaves.items()}
  try:
    tree = flax.serialization.from_state_dict(template, _fill(template_sd, out)[_ROOT])
  except (ValueError, KeyError, TypeError) as e:
    raise TemplateMismatchError(f"The {kind} checkpoint {step_dir} does not fit the template "
                                f"({e}): it was written by a different config or code "
                                "version.") from e
  return tree, body["metadata"]


# ----------------------------------------------------------------------------------------------
# Public API.

def save_pytree(path: str, tree: Any, metadata: Optional[dict] = None, overwrite: bool = False,
                kind: str = "saved"):
  """Save `tree` (any pytree of arrays / Python scalars, e.g. a TrainState with a leading seed axis)
  and JSON-serialisable `metadata` as the CheckpointManager directory `path` (one step kept).

  Refuses an existing checkpoint at `path` unless overwrite=True; even then the old step stays in
  place until the new one is committed. `kind` names the checkpoint in error messages ("run",
  "dynamics", "collector", ...).
  """
  path = os.path.abspath(os.fspath(path))
  if os.path.exists(path) and not os.path.isdir(path):
    raise CheckpointError(f"Checkpoint path {path} is a file; choose another path.")
  exists = os.path.isdir(path) and bool(os.listdir(path))
  if exists and not overwrite:
    raise CheckpointError(f"Checkpoint path {path} already exists. Pass overwrite=True, delete it, "
                          "or choose another path.")
  _encode(tree, metadata, kind, path)      # bad metadata fails before anything touches the disk
  mngr = _manager(path, keep=1)
  try:
    latest = mngr.latest_step()
    _save_step(mngr, 0 if latest is None else latest + 1, tree, metadata, kind)
  finally:
    mngr.close()


def load_pytree(path: str, template: Any = None, kind: str = "saved"):
  """Load a checkpoint written by `save_pytree`. Returns (tree, metadata dict).

  With `template` (a pytree like the one saved: concrete arrays or jax.ShapeDtypeStruct leaves, e.g.
  from jax.eval_shape), the result has the template's structure and node types; jax-array /
  ShapeDtypeStruct leaves come back as jax arrays (on the template's sharding when it has one),
  numpy leaves as numpy, Python scalars as Python scalars, typed PRNG keys as typed keys. Any
  structure, shape or dtype difference -> TemplateMismatchError listing the differences, before
  any array is read.
  Without a template: nested dicts (flax state-dict form) of numpy arrays; typed PRNG keys come back
  as typed jax key arrays.
  Missing, truncated or altered data -> CorruptCheckpointError naming the step and the fix.
  """
  path = os.path.abspath(os.fspath(path))
  if not os.path.isdir(path):
    raise CheckpointError(f"No {kind} checkpoint at {path}: the directory does not exist. Check "
                          "the path.")
  mngr = _manager(path, keep=None, create=False)
  try:
    step = mngr.latest_step()
    if step is None:
      raise CorruptCheckpointError(f"The {kind} checkpoint {path} holds no committed step (the "
                                   f"write was cut off, or it is not a checkpoint). Delete {path} "
                                   "and run again.")
    return _read_step(mngr, step, template, kind)
  finally:
    mngr.close()


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


def _check_template(path, kind, saved, t_leaves):
  problems = []
  problems += [f"template leaf {_fmt(p[1:])} is not in the checkpoint"
               for p in sorted(set(t_leaves) - set(saved))]
  problems += [f"checkpoint leaf {_fmt(p[1:])} is not in the template"
               for p in sorted(set(saved) - set(t_leaves))]
  for p in sorted(set(t_leaves) & set(saved)):
    shape, dtype, is_key, weak = _template_desc(t_leaves[p])
    s_shape, s_dtype, s_impl, s_weak = saved[p][:4]
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
        f"The {kind} checkpoint {path} does not match the template ({len(problems)} "
        "difference(s)):\n  " + "\n  ".join(shown) + more + "\nIt was written by a different "
        "config (seeds, network sizes, env) or code version: pass another --workdir (or "
        "--dynamics_dir) for this config.")


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
  """Numbered checkpoints of one run in `directory` (e.g. <workdir>/checkpoints), one Orbax
  CheckpointManager step each.

  save(step, state, metadata) commits atomically and keeps the newest `keep` (always including
  the one just written; steps after it, left by a timeline that was abandoned when an older step was
  restored, are removed first). restore(template) loads the newest valid one, skipping corrupt ones
  with a CheckpointWarning. The restored metadata carries "step", the step actually restored.
  `kind` names the checkpoints in messages ("run", "dynamics training", "collector").
  """

  def __init__(self, directory: str, keep: Optional[int] = 3, kind: str = "run"):
    if keep is not None and keep < 1:
      raise ValueError(f"keep must be >= 1 or None (keep all), got {keep}.")
    self.directory = os.path.abspath(os.fspath(directory))
    self.keep = keep
    self.kind = kind
    if os.path.exists(self.directory) and not os.path.isdir(self.directory):
      raise CheckpointError(f"{self.directory} is a file, not a checkpoint folder.")
    self._mngr = _manager(self.directory, keep)

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
    if "step" in metadata and metadata["step"] != step:
      raise ValueError(f"metadata['step'] = {metadata['step']} disagrees with step = {step}.")
    metadata["step"] = step
    _encode(state, metadata, self.kind, self.path(step))   # bad metadata: nothing is touched
    for stale in [s for s in self.steps() if s >= step]:
      self._mngr.delete(stale)
    _save_step(self._mngr, step, state, metadata, self.kind)

  def metadata(self, step: Optional[int] = None) -> Optional[dict]:
    """The user metadata of `step` (default: the latest) without reading any array, e.g. to
    build the template; None when there is no checkpoint."""
    step = self.latest_step() if step is None else int(step)
    if step is None:
      return None
    ocp = _orbax()
    try:
      body = self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
      return dict(body["metadata"])
    except (KeyboardInterrupt, SystemExit):
      raise
    except Exception as e:
      raise CorruptCheckpointError(f"The {self.kind} checkpoint {self.path(step)} is corrupt: its "
                                   f"meta item is unreadable ({type(e).__name__}). "
                                   + _fix(self.kind, self.path(step))) from e

  def restore(self, template: Any = None, step: Optional[int] = None):
    """(state, metadata) of `step`, or of the newest valid step when step is None."""
    if step is not None:
      return _read_step(self._mngr, int(step), template, self.kind)
    steps = self.steps()
    if not steps:
      raise CheckpointError(f"No {self.kind} checkpoint in {self.directory}.")
    skipped = []
    for s in reversed(steps):
      try:
        state, meta = _read_step(self._mngr, s, template, self.kind)
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
