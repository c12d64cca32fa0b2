"""The reuse key: which saved dynamics ensemble a run may reuse, without JAX (a sweep's plan reads
it before any training).

The rule: a saved ensemble is reused only by a run that would have trained the same one. Its
folder name carries the training settings (dynamics_path: seed<s>x<S>-<settings_tag>, the tag a
readable epoch cap + hash), so runs of other settings never meet it and train their own beside
it; the reuse key (reuse_key: data, seeds and every training setting), stored with the ensemble
(saved_dynamics) and with an unfinished training (dynamics_training), is checked again on every
reuse or resume (reuse_mismatch). A save written before the key held the training settings
("legacy": no TRAINING_CODE_FIELD in its key, or a folder without the tag: legacy_dynamics_path)
cannot be shown to match and is never reused (dynamics_store refuses it, naming the fix).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Optional

from mombo_jax.settings import groups
from mombo_jax.settings.config import Config

# The metadata field the reuse key is stored under (of a saved ensemble and of an unfinished
# training): its on-disk name, kept for old saves.
REUSE_KEY_FIELD = "identity"

# What changes what dynamics training makes of the same data and keys: the ensemble's shape
# (Config.dynamics, core/dynamics.py) and its training recipe (Config.dynamics_training,
# dynamics_training.py: optimiser, loss, split, early stopping, elites). Every setting of both
# groups is in the reuse key and, through settings_tag, in the ensemble's folder name: a setting
# added to either group joins them; one that does not change the ensemble belongs to neither.
TRAINING_FIELDS = (groups.fields(groups.DynamicsConfig)
                   + groups.fields(groups.DynamicsTrainingConfig))
# The version of the training code the key records. Raise it when a change to core/dynamics.py,
# dynamics_training.py or validation.py trains another ensemble from the same settings, data and
# keys (initialisation, loss, split, elites): ensembles of the earlier code are then no longer
# reused. Its presence in a saved key also marks a save that records the training settings.
TRAINING_CODE = 2             # 2: the references' initialisation (inits.py)
TRAINING_CODE_FIELD = "dyn_training_code"
# Settings outside the two groups that change the trained ensemble, each with the value every
# ensemble saved before it joined the key was trained at: in the key only when another value is
# set, so those ensembles keep their key and folder name (settings_tag), and read as that value
# when compared (reuse_mismatch). matmul_precision: on a GPU, an ensemble trained with TF32 inputs
# is not the float32 one (on a CPU they are the same ensemble, but the key names the setting, not
# the backend). Saved before: float32 on the CPU they all but the device records' trained on.
KEYED_UNLESS_DEFAULT = {"matmul_precision": "float32"}


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


def dynamics_path(dynamics_dir: str, config) -> str:
  """<dynamics_dir>/seed<seed>x<num_seeds>-<tag>: the ensembles of config's seeds trained with
  config's dynamics settings (tag: settings_tag, e.g. "cap30-1a2b3c4d"). Runs whose settings
  differ get different folders, so one dynamics_dir may hold several; runs whose settings agree
  (a --betas grid, a sweep's algorithms) share one."""
  return f"{legacy_dynamics_path(dynamics_dir, config)}-{settings_tag(config)}"


def legacy_dynamics_path(dynamics_dir: str, config) -> str:
  """<dynamics_dir>/seed<seed>x<num_seeds>: where mombo_jax saved the ensembles before their
  folder named the training settings (see dynamics_store.check_legacy_dynamics)."""
  return os.path.join(dynamics_dir, f"seed{config.seed}x{config.num_seeds}")


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


@dataclasses.dataclass(frozen=True)
class Shelf:
  """config's seeds' place in a dynamics_dir under the rule above, worked out once: what the
  store's get-or-train (dynamics_store.get_dynamics) reads, with no second trip here but to
  compare a saved key (mismatch_line).

  path: dynamics_path (seed<s>x<S>-<tag>); partial: its unfinished training; legacy:
  legacy_dynamics_path (a save from before the tag); settings: describe_settings (the training
  settings not at their default); key: reuse_key with the data's identity (None when the shelf
  was looked up without data: check_legacy_dynamics)."""
  path: str
  legacy: str
  settings: str
  key: Optional[dict] = None

  @property
  def partial(self) -> str:
    return self.path + ".partial"

  def mismatch_line(self, meta: dict) -> str:
    """"" when the saved metadata's reuse key fits self.key, else what differs as one line
    (format_mismatch)."""
    return format_mismatch(reuse_mismatch(meta, self.key))


def shelf(dynamics_dir: str, config, transitions=None, identity: Optional[dict] = None) -> Shelf:
  """config's seeds' Shelf in dynamics_dir; with `transitions` (and `identity`,
  provenance.dataset_identity), its reuse key too."""
  return Shelf(path=dynamics_path(dynamics_dir, config),
               legacy=legacy_dynamics_path(dynamics_dir, config),
               settings=describe_settings(config),
               key=None if transitions is None else reuse_key(config, transitions, identity))
