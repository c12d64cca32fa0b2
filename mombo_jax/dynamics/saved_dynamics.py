"""Saved dynamics ensembles: writing a trained ensemble (one seed or a leading seed axis) to disk,
loading it back as a dynamics.DynamicsState, and the reuse key that decides whether saved ensembles
fit a run (env, dims, seeds, dataset and every setting that changes the trained ensemble:
the Config's dynamics and dynamics_training groups, and its matmul_precision unless float32).

The rule: a saved ensemble is reused only by a run that would have trained the same one. Its
folder name carries the training settings (settings_tag: readable epoch cap + hash), so runs of
other settings never meet it and train their own beside it; the reuse key, stored with the
ensemble and with an unfinished training (dynamics_training), is checked again on every reuse or
resume. A save written before the key held the training settings ("legacy": no
TRAINING_CODE_FIELD in its key) cannot be shown to match and is never reused (workdir refuses it,
naming the fix).

On disk (checkpoint.save_pytree, kind "dynamics"): the DynamicsState's arrays {params,
input_mean, input_std, elites}, and metadata holding the dyn_* fields that rebuild the module
(config_overrides), obs_dim, action_dim, num_seeds (None: one seed, no seed axis), env, kind
"mombo_jax.dynamics" and the reuse key under "identity". Those names predate this module and stay,
so earlier saves still load.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import types
from typing import Optional

import jax

from mombo_jax.core import dynamics
from mombo_jax.settings import groups
from mombo_jax.settings.config import Config
from mombo_jax.storage import checkpoint

# Metadata tag of a saved ensemble, and the field the reuse key is stored under (also in the
# metadata of unfinished trainings, dynamics_training): their on-disk names, kept for old saves.
KIND = "mombo_jax.dynamics"
REUSE_KEY_FIELD = "identity"

# What changes what dynamics training makes of the same data and keys: the ensemble's shape
# (Config.dynamics, dynamics.py) and its training recipe (Config.dynamics_training,
# dynamics_training.py: optimiser, loss, split, early stopping, elites). Every setting of both
# groups is in the reuse key and, through settings_tag, in the ensemble's folder name: a setting
# added to either group joins them; one that does not change the ensemble belongs to neither.
TRAINING_FIELDS = (groups.fields(groups.DynamicsConfig)
                   + groups.fields(groups.DynamicsTrainingConfig))
# The version of the training code the key records. Raise it when a change to dynamics.py or
# dynamics_training.py trains another ensemble from the same settings, data and keys
# (initialisation, loss, split, elites): ensembles of the earlier code are then no longer reused.
# Its presence in a saved key also marks a save that records the training settings.
TRAINING_CODE = 2             # 2: the references' initialisation (inits.py)
TRAINING_CODE_FIELD = "dyn_training_code"
# Settings outside the two groups that change the trained ensemble, each with the value every
# ensemble saved before it joined the key was trained at: in the key only when another value is
# set, so those ensembles keep their key and folder name (settings_tag), and read as that value
# when compared (reuse_mismatch). matmul_precision: on a GPU, an ensemble trained with TF32 inputs
# is not the float32 one (on a CPU they are the same ensemble, but the key names the setting, not
# the backend). Saved before: float32 on the CPU they all but the device records' trained on.
KEYED_UNLESS_DEFAULT = {"matmul_precision": "float32"}

# Metadata beside the shape: the weight decays, one per layer, so that config_overrides gives a
# Config whose dyn_weight_decay fits the saved dyn_hidden.
_META_EXTRA = ("dyn_weight_decay",)
_TEMPLATE_FIELDS = groups.fields(groups.DynamicsConfig) + ("obs_dim", "action_dim", "num_seeds")


def training_settings(config) -> dict:
  """{setting: value} of config's two dynamics groups (dynamics, dynamics_training) in JSON types,
  normalised so that equal settings give equal dicts however they were written (groups.to_json),
  the TRAINING_CODE, and each KEYED_UNLESS_DEFAULT setting whose value is not its default."""
  out = dict(groups.to_json(config.dynamics), **groups.to_json(config.dynamics_training))
  out[TRAINING_CODE_FIELD] = TRAINING_CODE
  for name, default in KEYED_UNLESS_DEFAULT.items():
    if getattr(config, name) != default:
      out[name] = getattr(config, name)
  return out


def settings_tag(config) -> str:
  """The part of an ensemble's folder name that its training settings decide: the epoch cap
  readable ("cap30", "nocap": early stopping alone) then 8 hex digits of the SHA-256 of
  training_settings, e.g. "cap30-1a2b3c4d". Equal settings give equal tags on every machine."""
  settings = training_settings(config)
  digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:8]
  cap = settings["dyn_max_epochs"]
  return f"{'nocap' if cap is None else f'cap{cap}'}-{digest}"


def describe_settings(config, fields=None) -> str:
  """"field=value, ..." of `fields` (default: the training fields whose value is not Config's
  default), or "Config defaults" when there are none."""
  settings, values = training_settings(config), config.settings()
  if fields is None:
    defaults = training_settings(Config())
    fields = [f for f in settings if f in values and settings[f] != defaults.get(f)]
  return ", ".join(f"{f}={values[f]!r}" for f in fields) or "Config defaults"


def reuse_key(config, transitions, extra: Optional[dict] = None) -> dict:
  """What must match for saved dynamics to be reused: the env, the obs/action dims, the seeds,
  every training setting (training_settings: TRAINING_FIELDS and TRAINING_CODE) plus the caller's
  `extra` (provenance.dataset_identity: dataset id, size, fingerprint). JSON-friendly values
  only."""
  out = dict(env=config.env_name, obs_dim=int(transitions.observations.shape[1]),
             action_dim=int(transitions.actions.shape[1]), num_seeds=config.num_seeds,
             seed=config.seed)
  out.update(training_settings(config))
  out.update(extra or {})
  return out


def is_legacy(meta: dict) -> bool:
  """The saved metadata (of an ensemble or an unfinished training) holds a reuse key written
  before keys recorded the training settings: it cannot be shown to fit any run."""
  return TRAINING_CODE_FIELD not in ((meta or {}).get(REUSE_KEY_FIELD) or {})


def reuse_mismatch(meta: dict, expected: dict) -> dict:
  """{key: (saved, expected)} for every key of `expected` whose saved value (in the reuse key
  stored in meta) differs or is missing; empty when the saved dynamics fit."""
  saved = (meta or {}).get(REUSE_KEY_FIELD) or {}
  if TRAINING_CODE_FIELD in expected:
    # A whole key (reuse_key's): a KEYED_UNLESS_DEFAULT setting missing on either side holds its
    # default, so a float32 run never takes a TF32-trained ensemble, nor the reverse.
    saved = dict(KEYED_UNLESS_DEFAULT, **saved)
    expected = dict(KEYED_UNLESS_DEFAULT, **expected)
  return {k: (saved.get(k, "<not recorded>"), v) for k, v in expected.items()
          if saved.get(k, "<not recorded>") != v}


def format_mismatch(differs: dict) -> str:
  """reuse_mismatch's result as one line: "key: saved a, now b; ..."."""
  return "; ".join(f"{k}: saved {a!r}, now {b!r}" for k, (a, b) in sorted(differs.items()))


def save(path: str, dyn: dynamics.DynamicsState, config, overwrite: bool = False,
         reuse_key: Optional[dict] = None) -> None:
  """Writes dyn (one seed or a leading seed axis) with Orbax; metadata rebuilds the module and
  records `reuse_key` (see the function reuse_key) for reuse checks."""
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
