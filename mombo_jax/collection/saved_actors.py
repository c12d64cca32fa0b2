"""Saved behaviour actors: the SAC actors the medium / expert datasets are recorded from, as small
files anyone can record those datasets from again (collect --from_actors) without the SAC run.

mombo_jax.collection.recipes.Builder writes the SAC run's medium actor once the run has its medium
point, and its final ("expert") actor once it reaches `sac_steps`, including when it finds them in
an existing checkpoint, to `<workdir>/<env>/actors/`:
  medium.msgpack, expert.msgpack   flax.serialization.to_bytes of the actor variables
  medium.json, expert.json         env, gym id, obs / action dims, actor_hidden, log-std bounds
                                   (actor_config rebuilds the Config sac_policy needs), SAC step,
                                   the evaluations that qualified it, the medium threshold and
                                   medium_consecutive, seed, version, git commit, the weights'
                                   sha256 and the collect command that retrains them.
load_actor checks the weights against their sidecar (sha256, network shapes) before any episode
is recorded from them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
from typing import Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from mombo_jax.collection.online_sac import online_config
from mombo_jax.core import sac
from mombo_jax.env.envs import GYM_IDS
from mombo_jax.errors import UserError
from mombo_jax.storage import atomic

ACTOR_FORMAT = "mombo_jax-actor-v1"
ACTOR_QUALITIES = ("medium", "expert")
# The actors each SAC quality's dataset is recorded from (medium-replay: the run that made it).
ACTORS_OF = {"medium": ("medium",), "medium-replay": ("medium",), "expert": ("expert",),
             "medium-expert": ("medium", "expert")}


@dataclasses.dataclass
class SavedActor:
  """An actor saved by save_actor, loaded back (load_actor)."""
  params: dict        # the actor variables {"params": {"Dense_0": ...}}, numpy arrays
  config: object      # the settings sac_policy needs (online_config + the saved log-std bounds)
  info: dict          # the JSON sidecar
  path: str           # the .msgpack file
  sha256: str         # of the .msgpack file


def actor_paths(directory: str, quality: str) -> tuple:
  """(<directory>/<quality>.msgpack, <directory>/<quality>.json)."""
  return (os.path.join(directory, f"{quality}.msgpack"), os.path.join(directory, f"{quality}.json"))


def _canonical(tree):
  """Nested dicts with sorted keys and numpy leaves: the same weights give the same bytes, whether
  they come from the live run or from its Orbax checkpoint."""
  if isinstance(tree, Mapping):
    return {str(k): _canonical(tree[k]) for k in sorted(tree)}
  return np.asarray(tree)


def actor_bytes(actor_params) -> bytes:
  """flax.serialization.to_bytes of the actor variables (canonical order, host arrays)."""
  return serialization.to_bytes(_canonical(jax.device_get(actor_params)))


def network_info(env: str, config, actor_params) -> dict:
  """The sidecar fields actor_config reads back (and the gym id), from a live run's actor."""
  return dict(env=env, gym_id=GYM_IDS[env],
              obs_dim=int(np.shape(sac.actor_layers(actor_params)[0][0][0])[0]),
              action_dim=sac.actor_action_dim(actor_params),
              actor_hidden=[int(h) for h in config.agent.actor_hidden],
              log_std_min=float(config.agent.log_std_min),
              log_std_max=float(config.agent.log_std_max),
              batch_size=int(config.agent.batch_size))


def git_commit() -> Optional[str]:
  """The commit of this checkout, recorded in sidecars (None outside a git checkout)."""
  try:
    out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                         cwd=os.path.dirname(os.path.abspath(__file__)))
  except (OSError, subprocess.SubprocessError):
    return None
  if out.returncode != 0:
    return None
  return out.stdout.strip() or None


def save_actor(directory: str, quality: str, actor_params, info: dict) -> dict:
  """Writes <directory>/<quality>.msgpack (the actor variables) and <quality>.json (`info` plus the
  weights' file name, size and sha256); returns the sidecar. info must hold what actor_config
  reads: env, obs_dim, action_dim, actor_hidden, log_std_min, log_std_max (batch_size)."""
  os.makedirs(directory, exist_ok=True)
  blob = actor_bytes(actor_params)
  weights, sidecar_path = actor_paths(directory, quality)
  sidecar = dict(format=ACTOR_FORMAT, quality=quality, **info,
                 weights=os.path.basename(weights), bytes=len(blob),
                 sha256=hashlib.sha256(blob).hexdigest())
  atomic.atomic_write(weights, lambda f: f.write(blob), binary=True)
  atomic.write_text(sidecar_path, json.dumps(sidecar, indent=2) + "\n")
  return sidecar


def actor_config(info: dict):
  """The online-SAC settings an actor sidecar describes (what make_actor / sac_policy read)."""
  config = online_config(info["env"], tuple(int(h) for h in info["actor_hidden"]),
                         int(info.get("batch_size", 256)))
  agent = dataclasses.replace(config.agent, log_std_min=float(info["log_std_min"]),
                              log_std_max=float(info["log_std_max"]))
  return dataclasses.replace(config, agent=agent)


def check_saved(directory: str, quality: str, env: str, needed_by: str):
  """UserError, before anything runs, when directory lacks the `quality` actor of env (files
  missing, or a sidecar of another env); the message says how to export it."""
  for path in actor_paths(directory, quality):
    if not os.path.isfile(path):
      raise UserError(f"no saved actor file {path} (needed by {needed_by}); export the {quality} "
                      f"actor with `python -m experiments.collect --env={env}-{quality} "
                      "--actors_only --workdir=<the SAC build's workdir>` and copy <workdir>/"
                      f"{env}/actors/{quality}.msgpack and {quality}.json there.")
  sidecar_path = actor_paths(directory, quality)[1]
  with open(sidecar_path) as f:
    try:
      saved_env = json.load(f).get("env")
    except ValueError as e:
      raise UserError(f"{sidecar_path} is not valid JSON: {e}")
  if saved_env != env:
    raise UserError(f"{sidecar_path} is an actor for {saved_env}, not {env} (needed by "
                    f"{needed_by}).")


def load_actor(directory: str, quality: str) -> SavedActor:
  """The actor save_actor wrote into directory, checked against its sidecar (sha256, network
  shapes). UserError naming the file when one is missing or does not match."""
  weights, sidecar_path = actor_paths(directory, quality)
  for path in (weights, sidecar_path):
    if not os.path.isfile(path):
      raise UserError(f"no saved actor file {path}")
  with open(sidecar_path) as f:
    try:
      info = json.load(f)
    except ValueError as e:
      raise UserError(f"{sidecar_path} is not valid JSON: {e}") from None
  with open(weights, "rb") as f:
    blob = f.read()
  sha = hashlib.sha256(blob).hexdigest()
  if info.get("sha256") != sha:
    raise UserError(f"{weights} (sha256 {sha[:12]}...) is not the file its sidecar {sidecar_path} "
                    f"describes (sha256 {str(info.get('sha256'))[:12]}...)")
  missing = [k for k in ("env", "obs_dim", "action_dim", "actor_hidden", "log_std_min",
                         "log_std_max") if k not in info]
  if missing:
    raise UserError(f"{sidecar_path} lacks {', '.join(missing)}")
  config = actor_config(info)
  params = serialization.msgpack_restore(blob)
  actor = sac.make_actor(config, int(info["action_dim"]))
  want = jax.eval_shape(lambda: actor.init(jax.random.key(0),
                                           jnp.zeros((1, int(info["obs_dim"])), jnp.float32)))
  def shapes(tree):
    return {jax.tree_util.keystr(path): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}
  if shapes(params) != shapes(want):
    raise UserError(f"{weights} does not hold the actor {sidecar_path} describes (hidden "
                    f"{info['actor_hidden']}, obs {info['obs_dim']}, actions {info['action_dim']})")
  return SavedActor(params=params, config=config, info=info, path=weights, sha256=sha)
