"""Local Minari datasets: where they live, their metadata, loading one, and episodes
(mombo_jax.recording) written as datasets (write_dataset, with their reference returns, provenance
and dataset card) and read back (read_episodes).

Local first: datasets are read from MINARI_DATASETS_PATH (default ~/.minari/datasets). Only a
missing dataset with `download=True` contacts Minari's server, after a quick reachability check,
so an offline machine gets `DatasetNotFoundError` within seconds instead of ~25 s of retries.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import warnings
from typing import List, Optional, Sequence

import numpy as np

from mombo_jax import names
from mombo_jax.errors import DatasetNotFoundError, UserError

AUTHOR = "mombo_jax experiments/collect.py"
# Minari metadata key of the datasets built or imported here: a JSON string of {"recipe", "steps",
# "recipe_steps", "command"} (mombo_jax.recipes.provenance_for; read by provenance.provenance).
PROVENANCE_KEY = "mombo_provenance"
# Seconds the reachability check may take before a download attempt is declared hopeless.
_REACH_TIMEOUT_S = 3.0
_REMOTE_HOSTS = {"hf": "huggingface.co", "gcp": "storage.googleapis.com"}


# ------------------------------------------------------------------------------- local storage

def datasets_root() -> str:
  """MINARI_DATASETS_PATH, or Minari's default ~/.minari/datasets."""
  return os.environ.get("MINARI_DATASETS_PATH",
                        os.path.join(os.path.expanduser("~"), ".minari", "datasets"))


def data_path(dataset_id: str) -> str:
  """The folder of a dataset's files (<root>/<id>/data), whether or not it exists."""
  return os.path.join(datasets_root(), dataset_id, "data")


def exists_locally(name: str) -> bool:
  """True if the dataset (short name or id) is in the local Minari root."""
  return os.path.isdir(data_path(names.resolve(name)))


def local_metadata(dataset_id: str) -> Optional[dict]:
  """Raw metadata.json of a local dataset (no h5 access), or None when it is not local."""
  from minari.dataset.minari_storage import MinariStorage
  path = data_path(dataset_id)
  if not os.path.isdir(path):
    return None
  try:
    return MinariStorage.read_raw_metadata(path)
  except ValueError:
    return None


def spec_id(spec_json: str) -> str:
  """The env id in a stored EnvSpec JSON (plain JSON parsing works across gymnasium versions)."""
  return str(json.loads(spec_json).get("id", ""))


# ------------------------------------------------------------------------------------ loading

def _reachable(timeout: float = _REACH_TIMEOUT_S) -> bool:
  """Can Minari's remote be reached within `timeout` s? DNS lookups ignore socket timeouts, so the
  check runs in a daemon thread and is abandoned when it takes too long."""
  remote = os.environ.get("MINARI_REMOTE", "hf://farama-minari").split("://")[0]
  host = _REMOTE_HOSTS.get(remote)
  if host is None:
    return True  # an unfamiliar remote: let Minari try
  result = []

  def probe():
    try:
      with socket.create_connection((host, 443), timeout=timeout):
        result.append(True)
    except Exception:  # any failure to connect means: not reachable
      pass

  thread = threading.Thread(target=probe, daemon=True)
  thread.start()
  thread.join(timeout)
  return bool(result)


def _offline() -> bool:
  return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _not_found(dataset_id: str, reason: str) -> DatasetNotFoundError:
  import minari
  command = names.collector_command(dataset_id)
  lines = [f"Dataset {dataset_id!r} is not in the local Minari root {datasets_root()} "
           f"(set MINARI_DATASETS_PATH to use another) and {reason}."]
  if command:
    kind = "Build it" if names.short_name(dataset_id) else "Build the D4RL-recipe equivalent"
    lines.append(f"{kind} locally with:\n  {command}")
  try:
    local = sorted(minari.list_local_datasets())
  except Exception:  # a misconfigured root must not hide the real error
    local = []
  lines.append(f"Local datasets: {', '.join(local) if local else 'none'}.")
  return DatasetNotFoundError("\n".join(lines), dataset_id, command)


def load_dataset(name: str, download: bool = False):
  """The MinariDataset for a short name or id; local first (see module docstring)."""
  import minari
  dataset_id = names.resolve(name)
  if os.path.isdir(data_path(dataset_id)):
    return minari.load_dataset(dataset_id, download=False)
  if not download:
    raise _not_found(dataset_id, "download=False")
  if dataset_id.startswith(names.NAMESPACE + "/"):
    raise _not_found(dataset_id,
                     "datasets of the 'mombo' namespace exist only where they were built")
  if _offline():
    raise _not_found(dataset_id, "HF_HUB_OFFLINE is set, so it cannot be downloaded")
  if not _reachable():
    raise _not_found(dataset_id, "Minari's server cannot be reached (offline?)")
  try:
    return minari.load_dataset(dataset_id, download=True)
  except Exception as e:  # ConnectError and friends are not OSErrors
    raise _not_found(dataset_id, f"downloading it failed ({type(e).__name__}: {e})") from e


# ------------------------------------------------------------------------------------ episodes

def write_dataset(name: str, episodes: Sequence[dict], description: str, algorithm: str,
                  max_episode_steps: Optional[int] = None, overwrite: bool = False, *,
                  provenance: Optional[dict] = None, ref_scores: Optional[tuple] = None,
                  env_name: Optional[str] = None, extra_metadata: Optional[dict] = None,
                  eval_env: Optional[dict] = None):
  """Write episodes as a Minari dataset: `name` is a short name (-> names.minari_id) or a full
  Minari id (used as it is; its env from `env_name`, else from the id). Metadata: the env and its
  eval env (gymnasium v5; `eval_env`, an envs.eval_env_spec dict, makes both and is recorded under
  envs.EVAL_ENV_KEY: an import's D4RL physics), reference returns (`ref_scores` (min, max),
  default D4RL's for the env), `provenance` (see recipes.provenance_for) under PROVENANCE_KEY, and
  `extra_metadata` (JSON-encoded values). episodes: dicts of observations [T+1, S], actions
  [T, A], rewards, terminations, truncations [T]."""
  import minari
  from minari.data_collector import EpisodeBuffer
  # These read datasets through this module, so they are imported here, not at the top.
  from mombo_jax import cards, envs, scores
  dataset_id = name if names.is_dataset_id(name) else names.minari_id(name)
  env_id = env_name or names.env_name(name)
  path = os.path.join(datasets_root(), dataset_id)
  if os.path.exists(path):
    if not overwrite:
      raise UserError(f"Dataset {dataset_id} already exists at {path}; pass overwrite=True to "
                      "rebuild it.", params=("overwrite",))
    shutil.rmtree(path)
  env = envs.make_env(eval_env or env_id, max_episode_steps=max_episode_steps)
  spec, eval_env = eval_env, envs.make_env(eval_env or env_id)
  low, high = ref_scores or scores.D4RL_REF_SCORES[names.env_name(env_id)]
  buffers = [EpisodeBuffer(id=i, observations=ep["observations"], actions=ep["actions"],
                           rewards=ep["rewards"], terminations=ep["terminations"],
                           truncations=ep["truncations"]) for i, ep in enumerate(episodes)]
  try:
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", message=".*is set to None.*")
      minari.create_dataset_from_buffers(
          dataset_id, buffers, env=env, eval_env=eval_env.spec, algorithm_name=algorithm,
          author=AUTHOR, code_permalink="experiments/collect.py", ref_min_score=low,
          ref_max_score=high, description=description)
    extra = {k: json.dumps(v) for k, v in (extra_metadata or {}).items()}
    if spec is not None:
      extra[envs.EVAL_ENV_KEY] = json.dumps(spec)
    if provenance is not None:
      extra[PROVENANCE_KEY] = json.dumps(provenance)
    if extra:
      minari.load_dataset(dataset_id).storage.update_metadata(extra)
    cards.write_card(dataset_id, episodes=episodes)   # dataset_card.md + returns_hist.png
  except BaseException:
    shutil.rmtree(path, ignore_errors=True)  # no half-written dataset blocks the next attempt
    raise
  finally:
    env.close()
    eval_env.close()
  return dataset_id


def read_episodes(name: str) -> List[dict]:
  """The episodes of a local dataset, as recording.rollout records them."""
  ds = load_dataset(name)
  return [dict(observations=np.asarray(ep["observations"]), actions=np.asarray(ep["actions"]),
               rewards=np.asarray(ep["rewards"]), terminations=np.asarray(ep["terminations"]),
               truncations=np.asarray(ep["truncations"]))
          for ep in ds.storage.get_episodes(ds.episode_indices)]
