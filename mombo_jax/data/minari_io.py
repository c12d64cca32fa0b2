"""Local Minari datasets, the read side: where they live, their metadata (and the environment it
records: env_name), loading one, and a dataset's episodes (read_episodes). The write side, episodes
written as datasets with their reference returns, provenance and card, is
mombo_jax.collection.dataset_writer.

Local first: datasets are read from MINARI_DATASETS_PATH (default ~/.minari/datasets). Only a
missing dataset with `download=True` contacts Minari's server, after a quick reachability check,
so an offline machine gets `DatasetNotFoundError` within seconds instead of ~25 s of retries.
"""
from __future__ import annotations

import json
import os
import socket
import threading
from typing import List, Optional

import numpy as np

from mombo_jax.data import names
from mombo_jax.errors import DatasetNotFoundError

# Minari metadata key of the datasets built or imported here: a JSON string of {"recipe", "steps",
# "recipe_steps", "command"} (mombo_jax.collection.recipes.provenance_for; read by
# provenance.provenance).
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
  # minari only when a dataset is read: the report imports data/ without it
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


def env_name(name: str) -> str:
  """The environment (halfcheetah | hopper | walker2d) of a short name, env name or dataset id: an
  id's from the env spec in its local metadata (eval env first), else from the id itself
  (names.env_of)."""
  meta = local_metadata(name) if names.is_dataset_id(name) else None
  spec_ids = [spec_id(meta[key]) for key in ("eval_env_spec", "env_spec")
              if meta and meta.get(key)]
  return names.env_of(name, spec_ids)


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
  # minari only when a dataset is read: the report imports data/ without it
  import minari
  command = names.collector_command(dataset_id)
  lines = [f"Dataset {dataset_id!r} is not in the local Minari root {datasets_root()} "
           f"(set MINARI_DATASETS_PATH to use another) and {reason}."]
  if command:
    kind = "Build it" if names.short_name(dataset_id) else "Build the D4RL-recipe equivalent"
    lines.append(f"{kind} locally with:\n  {command}")
  if not os.path.isdir(datasets_root()):
    # Minari's listing would create the folder: a refused launch leaves nothing behind.
    lines.append(f"Local datasets: none ({datasets_root()} does not exist).")
    return DatasetNotFoundError("\n".join(lines), dataset_id, command)
  try:
    local = sorted(minari.list_local_datasets())
  except Exception:  # a misconfigured root must not hide the real error
    local = []
  lines.append(f"Local datasets: {', '.join(local) if local else 'none'}.")
  return DatasetNotFoundError("\n".join(lines), dataset_id, command)


def load_dataset(name: str, download: bool = False):
  """The MinariDataset for a short name or id; local first (see module docstring)."""
  # minari only when a dataset is read: the report imports data/ without it
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

def read_episodes(name: str) -> List[dict]:
  """The episodes of a local dataset, as recording.rollout records them."""
  ds = load_dataset(name)
  return [dict(observations=np.asarray(ep["observations"]), actions=np.asarray(ep["actions"]),
               rewards=np.asarray(ep["rewards"]), terminations=np.asarray(ep["terminations"]),
               truncations=np.asarray(ep["truncations"]))
          for ep in ds.storage.get_episodes(ds.episode_indices)]
