"""Datasets: Minari loading, flattening to transitions, normalised scores, evaluation envs.

Names. A short name `<env>-<quality>` (config.valid_names(), e.g. `walker2d-medium-replay`,
`hopper-random-expert-5pct`) maps to the local Minari id that `experiments/collect.py` writes:
`mombo/<env>/<quality>-v0` (`minari_id`). Any Minari dataset id (`mujoco/hopper/medium-v0`,
`test/hopper/tiny-v0`) is used as it is.

Local first: datasets are read from MINARI_DATASETS_PATH (default ~/.minari/datasets). Only a
missing dataset with `download=True` contacts Minari's server, after a quick reachability check,
so an offline machine gets `DatasetNotFoundError` within seconds instead of ~25 s of retries.
"""
from __future__ import annotations

import os
import socket
import threading
from typing import NamedTuple, Optional, Tuple

import numpy as np

from mombo_jax.config import ENVS, parse_name, valid_names


class Transitions(NamedTuple):
  """One row per transition, float32 numpy arrays.

  observations [N, S], actions [N, A], rewards [N], next_observations [N, S],
  terminals [N] (1.0 where the episode terminated; truncations are 0 and bootstrap).
  """
  observations: np.ndarray
  actions: np.ndarray
  rewards: np.ndarray
  next_observations: np.ndarray
  terminals: np.ndarray


class DatasetNotFoundError(FileNotFoundError):
  """A dataset is neither local nor downloadable. `command` (or None) builds it locally."""

  def __init__(self, message: str, dataset_id: str, command: Optional[str] = None):
    super().__init__(message)
    self.dataset_id = dataset_id
    self.command = command


NAMESPACE = "mombo"
VERSION = 0
GYM_IDS = {"halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5", "walker2d": "Walker2d-v5"}
# D4RL reference returns (random, expert), SPEC.md section 6; used when a dataset has none.
D4RL_REF_SCORES = {
    "halfcheetah": (-280.178953, 12135.0),
    "hopper": (-20.272305, 3234.3),
    "walker2d": (1.629008, 4592.3),
}
# Minari metadata key of the datasets built or imported here: a JSON string of {"recipe", "steps",
# "recipe_steps", "command"} (mombo_jax.recipes.provenance_for).
PROVENANCE_KEY = "mombo_provenance"
# Seconds the reachability check may take before a download attempt is declared hopeless.
_REACH_TIMEOUT_S = 3.0
_REMOTE_HOSTS = {"hf": "huggingface.co", "gcp": "storage.googleapis.com"}


# --------------------------------------------------------------------------------------- names

def minari_id(name: str) -> str:
  """'hopper-random-medium-5pct' -> 'mombo/hopper/random-medium-5pct-v0'. ValueError if unknown."""
  env, quality = parse_name(name)
  return f"{NAMESPACE}/{env}/{quality}-v{VERSION}"


def short_name(dataset_id: str) -> Optional[str]:
  """Inverse of `minari_id` for our own namespace ('mombo/hopper/random-v0' -> 'hopper-random'),
  None for any other id."""
  parts = dataset_id.split("/")
  if len(parts) != 3 or parts[0] != NAMESPACE:
    return None
  quality, _, _ = parts[2].rpartition("-v")
  name = f"{parts[1]}-{quality}"
  return name if name in valid_names() else None


def _is_dataset_id(name: str) -> bool:
  return "/" in name


def _resolve(name: str) -> str:
  """Minari dataset id for a short name or an id. Unknown short names raise ValueError at once."""
  if not isinstance(name, str) or not name:
    raise ValueError(f"Dataset name must be a non-empty string, got {name!r}. Valid names: "
                     f"{', '.join(valid_names())} "
                     "(or a Minari id such as mujoco/hopper/medium-v0).")
  if _is_dataset_id(name):
    from minari.dataset.minari_dataset import parse_dataset_id
    try:
      parse_dataset_id(name)
    except Exception as e:  # minari raises several types for malformed ids
      raise ValueError(f"Malformed Minari dataset id {name!r} ({e}); expected "
                       "namespace/env/name-vN, e.g. mujoco/hopper/medium-v0.") from e
    return name
  return minari_id(name)


def _env_from_text(text: str) -> Optional[str]:
  """'hopper' for 'Hopper-v5', 'mujoco/hopper/medium-v0', 'hopper-random', ...; None if absent."""
  low = text.lower()
  for env in ENVS:
    # 'hopper', 'Hopper-v5', 'hopper-random', '.../hopper/...'
    if low == env or low.startswith(env + "-") or f"/{env}/" in f"/{low}/":
      return env
  return None


def env_name(name: str) -> str:
  """The environment (halfcheetah | hopper | walker2d) of a short name, env name or dataset id."""
  if name in ENVS:
    return name
  if not _is_dataset_id(name):
    return parse_name(name)[0]
  meta = _local_metadata(name)
  for key in ("eval_env_spec", "env_spec"):
    if meta and meta.get(key):
      env = _env_from_text(_spec_id(meta[key]))
      if env:
        return env
  env = _env_from_text(name)
  if env is None:
    raise ValueError(f"Cannot tell the environment of dataset {name!r}: its id names none of "
                     f"{', '.join(ENVS)} and it has no env spec in its metadata.")
  return env


# ------------------------------------------------------------------------------- local storage

def datasets_root() -> str:
  """MINARI_DATASETS_PATH, or Minari's default ~/.minari/datasets."""
  return os.environ.get("MINARI_DATASETS_PATH",
                        os.path.join(os.path.expanduser("~"), ".minari", "datasets"))


def _data_path(dataset_id: str) -> str:
  return os.path.join(datasets_root(), dataset_id, "data")


def exists_locally(name: str) -> bool:
  """True if the dataset (short name or id) is in the local Minari root."""
  return os.path.isdir(_data_path(_resolve(name)))


def _local_metadata(dataset_id: str) -> Optional[dict]:
  """Raw metadata.json of a local dataset (no h5 access), or None when it is not local."""
  from minari.dataset.minari_storage import MinariStorage
  path = _data_path(dataset_id)
  if not os.path.isdir(path):
    return None
  try:
    return MinariStorage.read_raw_metadata(path)
  except ValueError:
    return None


def _spec_id(spec_json: str) -> str:
  """The env id in a stored EnvSpec JSON (plain JSON parsing works across gymnasium versions)."""
  import json
  return str(json.loads(spec_json).get("id", ""))


def _collect_command(dataset_id: str) -> Optional[str]:
  """The collector command that builds this dataset (or its D4RL-recipe twin), if there is one."""
  name = short_name(dataset_id)
  if name is None:
    parts = dataset_id.split("/")
    env = _env_from_text(dataset_id)
    quality = parts[-1].rpartition("-v")[0] if parts else ""
    candidate = f"{env}-{quality}"
    name = candidate if env and candidate in valid_names() else None
  return None if name is None else f"python -m experiments.collect --env={name}"


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
  command = _collect_command(dataset_id)
  lines = [f"Dataset {dataset_id!r} is not in the local Minari root {datasets_root()} "
           f"(set MINARI_DATASETS_PATH to use another) and {reason}."]
  if command:
    kind = "Build it" if short_name(dataset_id) else "Build the D4RL-recipe equivalent"
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
  dataset_id = _resolve(name)
  if os.path.isdir(_data_path(dataset_id)):
    return minari.load_dataset(dataset_id, download=False)
  if not download:
    raise _not_found(dataset_id, "download=False")
  if dataset_id.startswith(NAMESPACE + "/"):
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


# ------------------------------------------------------------------------------------ loading

def flatten_episodes(episodes) -> Transitions:
  """Episodes (dicts or EpisodeData with observations [T+1, S], actions [T, A], rewards,
  terminations, truncations [T]) -> Transitions: s = obs[:-1], s' = obs[1:], terminal = terminated
  (a truncated step keeps terminal 0 and bootstraps)."""
  cols = {k: [] for k in Transitions._fields}
  for ep in episodes:
    get = (lambda k: ep[k]) if isinstance(ep, dict) else (lambda k: getattr(ep, k))
    obs = np.asarray(get("observations"))
    actions = np.asarray(get("actions"))
    if obs.ndim != 2 or obs.shape[0] != actions.shape[0] + 1:
      raise ValueError("Episodes need observations [T+1, S] (a flat Box observation space) and "
                       f"actions [T, A]; got {obs.shape} and {actions.shape}.")
    cols["observations"].append(obs[:-1])
    cols["next_observations"].append(obs[1:])
    cols["actions"].append(actions.reshape(actions.shape[0], -1))
    cols["rewards"].append(np.asarray(get("rewards")).reshape(-1))
    cols["terminals"].append(np.asarray(get("terminations")).reshape(-1))
  if not cols["rewards"]:
    raise ValueError("The dataset holds no episodes.")
  return Transitions(**{k: np.concatenate(v).astype(np.float32) for k, v in cols.items()})


def load_transitions(name: str, download: bool = False, *, cache: bool = True) -> Transitions:
  """All transitions of a dataset (short name or Minari id) as float32 numpy rows.

  Raises ValueError for an unknown short name (listing the valid ones, no I/O) and
  DatasetNotFoundError (a FileNotFoundError) naming the collector command for a missing dataset.

  Reading episode by episode costs about 1 ms per episode in h5py (a minute for the ~45k short
  episodes of a 1M-step random dataset), so with `cache` the flattened arrays are also kept in
  <Minari root>/.mombo_cache/<id>/ (a hidden folder Minari ignores), keyed by a fingerprint of
  the dataset's files: a rebuilt dataset is read afresh.
  """
  dataset = load_dataset(name, download=download)
  dataset_id = _resolve(name)
  path = _cache_path(dataset_id) if cache else None
  if path is not None and os.path.exists(path):
    try:
      with np.load(path) as arrays:
        return Transitions(**{k: arrays[k] for k in Transitions._fields})
    except (OSError, ValueError, KeyError):
      pass  # unreadable cache: rebuild it below
  # The storage's raw episode dicts skip Minari's per-episode EpisodeData wrapping.
  transitions = flatten_episodes(dataset.storage.get_episodes(dataset.episode_indices))
  if path is not None:
    _write_cache(path, transitions)
  return transitions


_CACHE_DIR = ".mombo_cache"


def _cache_path(dataset_id: str) -> Optional[str]:
  """Cache file named by a fingerprint of the dataset's files (names, sizes, mtimes)."""
  import hashlib
  data_dir = _data_path(dataset_id)
  digest = hashlib.sha1(dataset_id.encode())
  try:
    for entry in sorted(os.scandir(data_dir), key=lambda e: e.name):
      stat = entry.stat()
      digest.update(f"{entry.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
  except OSError:
    return None
  return os.path.join(datasets_root(), _CACHE_DIR, dataset_id,
                      f"transitions-{digest.hexdigest()[:16]}.npz")


def _write_cache(path: str, transitions: Transitions):
  """Atomic write; stale caches of the same dataset go. Failures only cost speed."""
  import warnings
  folder = os.path.dirname(path)
  tmp = f"{path}.tmp-{os.getpid()}.npz"
  try:
    os.makedirs(folder, exist_ok=True)
    np.savez(tmp, **transitions._asdict())
    os.replace(tmp, path)
    for entry in os.scandir(folder):
      if entry.name.startswith("transitions-") and entry.path != path and \
          entry.name.endswith(".npz") and ".tmp-" not in entry.name:
        os.remove(entry.path)
  except OSError as e:
    warnings.warn(f"Could not cache the transitions of this dataset at {path} ({e}); loading "
                  "will be slower next time.")
    if os.path.exists(tmp):
      os.remove(tmp)


# ---------------------------------------------------------------------------------- identity

def provenance(name: str) -> Optional[dict]:
  """How a local dataset was built ({"recipe", "steps", "recipe_steps", "command"}), from its
  metadata; None when it is not local or records none (e.g. a downloaded Minari dataset)."""
  import json
  meta = _local_metadata(_resolve(name))
  raw = meta.get(PROVENANCE_KEY) if meta else None
  if not raw:
    return None
  try:
    out = json.loads(raw) if isinstance(raw, str) else dict(raw)
  except (TypeError, ValueError):
    return None
  return out if isinstance(out, dict) else None


def smaller_than_recipe(name: str) -> Optional[str]:
  """A sentence saying that a local dataset is a reduced build of its recipe (fewer transitions
  than the recipe's size), with the command that rebuilds it; None when it is full size or
  records no recipe."""
  prov = provenance(name)
  if not prov or not prov.get("recipe_steps") or prov.get("steps") is None:
    return None
  if int(prov["steps"]) >= int(prov["recipe_steps"]):
    return None
  return (f"{_resolve(name)} is a reduced build: {int(prov['steps'])} transitions where its "
          f"recipe ({prov.get('recipe')}) has {int(prov['recipe_steps'])}. Rebuild it at full "
          f"size with `{prov.get('command')}`, or pass --allow_small_dataset to train on it anyway.")


def dataset_env(name: str) -> Optional[str]:
  """The environment a dataset belongs to, from its short name, or for an id from its local
  metadata (eval env spec, env spec) or the id itself; None when nothing tells."""
  try:
    return env_name(name)
  except ValueError:
    return None


def dataset_identity(name: str, transitions: Transitions) -> dict:
  """What identifies the data a model was trained on: the Minari id, the number of transitions and
  the fingerprint of the arrays (saved dynamics are reused only when all three match)."""
  return {"dataset": _resolve(name), "num_transitions": int(len(transitions.rewards)),
          "fingerprint": fingerprint(transitions)}


def fingerprint(transitions: Transitions, samples: int = 4096) -> str:
  """A cheap, process-independent fingerprint of a dataset's arrays: CRC32 over the shapes and a
  fixed strided subsample (<= `samples` rows) of every field. Tells datasets apart (another env,
  size, recipe or rebuild) without hashing gigabytes."""
  import zlib
  crc = 0
  for field in transitions:
    arr = np.ascontiguousarray(np.asarray(field, np.float32))
    crc = zlib.crc32(repr(arr.shape).encode(), crc)
    step = max(1, arr.shape[0] // samples)
    crc = zlib.crc32(np.ascontiguousarray(arr[::step]).tobytes(), crc)
  return f"{crc:08x}"


# ------------------------------------------------------------------------------------- scores

def ref_scores(name: str) -> Tuple[float, float, str]:
  """(R_random, R_expert, source) for a short name, env name or dataset id.

  The dataset's own ref_min_score/ref_max_score when it is local and has them; else the D4RL
  reference returns of its environment (SPEC.md section 6). `source` says which.
  """
  if name not in ENVS:
    dataset_id = _resolve(name)
    meta = _local_metadata(dataset_id)
    if meta and meta.get("ref_min_score") is not None and meta.get("ref_max_score") is not None:
      return (float(meta["ref_min_score"]), float(meta["ref_max_score"]),
              f"metadata of {dataset_id}")
  env = env_name(name)
  low, high = D4RL_REF_SCORES[env]
  return low, high, f"D4RL reference returns for {env} (no reference scores in dataset metadata)"


def normalized_score(name: str, returns) -> np.ndarray:
  """100 * (R - R_random) / (R_expert - R_random), elementwise over `returns` (any shape)."""
  low, high, _ = ref_scores(name)
  return 100.0 * (np.asarray(returns, np.float64) - low) / (high - low)


# ---------------------------------------------------------------------------------------- envs

def make_env(name: str, **kwargs):
  """The gymnasium v5 environment of a short name / env name, or of a dataset id (its eval env
  spec, else its env spec, when the dataset is local and stores one). kwargs go to gym.make."""
  import gymnasium as gym
  if _is_dataset_id(name):
    meta = _local_metadata(_resolve(name))
    if meta and (meta.get("eval_env_spec") or meta.get("env_spec")):
      # Minari's own recovery also patches specs written by older gymnasium versions.
      return load_dataset(name).recover_environment(eval_env=True, **kwargs)
  return gym.make(GYM_IDS[env_name(name)], **kwargs)
