"""A saved dynamics ensemble: save (one seed or a leading seed axis) and load back as a
core.dynamics.DynamicsState, checked against a template of its shapes before any array is read.
Whether a saved ensemble fits a run (its folder and reuse key): reuse.py.

On disk (checkpoint.save_pytree, kind "dynamics"): the DynamicsState's arrays {params,
input_mean, input_std, elites}, and metadata holding the dyn_* fields that rebuild the module
(config_overrides), obs_dim, action_dim, num_seeds (None: one seed, no seed axis), env, kind
"mombo_jax.dynamics" and the reuse key under reuse.REUSE_KEY_FIELD ("identity"). Those names
predate this module and stay, so earlier saves still load.
"""
from __future__ import annotations

import dataclasses
import os
import types
from typing import Optional

import jax

from mombo_jax.core import dynamics
from mombo_jax.dynamics.reuse import REUSE_KEY_FIELD
from mombo_jax.settings import groups
from mombo_jax.storage import checkpoint

# Metadata tag of a saved ensemble: its on-disk name, kept for old saves.
KIND = "mombo_jax.dynamics"

# Metadata beside the shape: the weight decays, one per layer, so that config_overrides gives a
# Config whose dyn_weight_decay fits the saved dyn_hidden.
_META_EXTRA = ("dyn_weight_decay",)
_TEMPLATE_FIELDS = groups.fields(groups.DynamicsConfig) + ("obs_dim", "action_dim", "num_seeds")


def save(path: str, dyn: dynamics.DynamicsState, config, overwrite: bool = False,
         reuse_key: Optional[dict] = None) -> None:
  """Writes dyn (one seed or a leading seed axis) with Orbax; metadata rebuilds the module and
  records `reuse_key` (reuse.reuse_key) for reuse checks."""
  obs_dim = int(dyn.params["max_logvar"].shape[-1]) - 1
  in_dim = int(dyn.input_mean.shape[-1])
  seeds = int(dyn.input_mean.shape[0]) if dyn.input_mean.ndim == 2 else None
  meta = dataclasses.asdict(config.dynamics)
  meta.update({f: getattr(config.dynamics_training, f) for f in _META_EXTRA})
  meta["dyn_hidden"] = list(meta["dyn_hidden"])
  meta["dyn_weight_decay"] = list(meta["dyn_weight_decay"])
  meta.update(obs_dim=obs_dim, action_dim=in_dim - obs_dim, num_seeds=seeds, env=config.env,
              kind=KIND)
  meta[REUSE_KEY_FIELD] = reuse_key or {}
  checkpoint.save_pytree(path, jax.device_get(dyn), meta, overwrite=overwrite, kind="dynamics")


def metadata(path: str) -> dict:
  """The saved metadata, read before any array (it decides load's template); CheckpointError
  when `path` holds no saved ensemble."""
  path = os.path.abspath(os.fspath(path))
  meta = None
  if os.path.isdir(path):           # RunCheckpointer would create a missing folder
    ckpt = checkpoint.RunCheckpointer(path, keep=None, kind="dynamics")
    try:
      meta = ckpt.metadata()
    finally:
      ckpt.close()
  if meta is None:
    raise checkpoint.CheckpointError(f"No dynamics ensemble saved at {path}: the folder does not "
                                     "exist or holds no committed checkpoint. Check the path.")
  if meta.get("kind") != KIND:
    raise checkpoint.CheckpointError(f"{path} does not hold a dynamics ensemble saved by "
                                     "mombo_jax.dynamics.saved_dynamics.save.")
  return meta


def _template(path: str, meta: dict) -> dynamics.DynamicsState:
  """The saved DynamicsState's shapes and dtypes (jax.ShapeDtypeStruct leaves), from its metadata:
  params {"members": [N, M, ...], "max_logvar" [N, S + 1], ...}, input_mean / input_std [N, S + A],
  elites int32 [N, E]; no N axis when num_seeds is None."""
  missing = [f for f in _TEMPLATE_FIELDS if f not in meta]
  if missing:
    raise checkpoint.CheckpointError(
        f"The dynamics ensemble in {path} cannot be loaded: its metadata lacks "
        f"{', '.join(missing)}, which give its arrays' shapes. Delete it and train the ensembles "
        "again.")
  # init_state reads only the shape group; a full Config would also run checks of settings the
  # saved arrays do not depend on (e.g. MOMBO's >= 2 elites), refusing ensembles of other runs.
  shape = {f: meta[f] for f in groups.fields(groups.DynamicsConfig)}
  shape_config = types.SimpleNamespace(
      dynamics=groups.DynamicsConfig(**dict(shape, dyn_hidden=tuple(shape["dyn_hidden"]))))

  def one(key):
    return dynamics.init_state(key, int(meta["obs_dim"]), int(meta["action_dim"]), shape_config)

  key = jax.random.PRNGKey(0)           # only its shape matters: eval_shape computes nothing
  if meta["num_seeds"] is None:
    return jax.eval_shape(one, key)
  return jax.eval_shape(jax.vmap(one), jax.random.split(key, int(meta["num_seeds"])))


def load(path: str):
  """-> (DynamicsState, metadata dict). metadata holds obs_dim, action_dim, num_seeds (None for a
  single seed) and the dyn_* fields the module needs (apply with a Config carrying them:
  config_overrides).

  The arrays are restored against a template built from that metadata (jax.eval_shape of
  dynamics.init_state, vmapped over num_seeds), so shapes and dtypes are checked before any array
  is read (checkpoint.TemplateMismatchError) and the result is a DynamicsState of jax arrays.
  Metadata without those fields -> checkpoint.CheckpointError.
  """
  meta = metadata(path)
  dyn, meta = checkpoint.load_pytree(path, template=_template(path, meta), kind="dynamics")
  return dyn, meta


def config_overrides(meta: dict) -> dict:
  """Config overrides that rebuild the saved module: make_config(..., **config_overrides(meta))."""
  out = {f: meta[f] for f in groups.fields(groups.DynamicsConfig) + _META_EXTRA}
  out["dyn_hidden"] = tuple(out["dyn_hidden"])
  out["dyn_weight_decay"] = tuple(out["dyn_weight_decay"])
  return out
