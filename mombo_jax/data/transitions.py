"""Transitions: the (s, a, r, s', terminal) rows training reads, flattened from a dataset's episodes
(short name or Minari id: mombo_jax.data.names; local Minari storage: mombo_jax.data.minari_io) and
cached beside the dataset.
"""
from __future__ import annotations

import hashlib
import os
import warnings
from typing import NamedTuple, Optional

import numpy as np

from mombo_jax.data import minari_io, names


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


def episode_returns(t: Transitions) -> np.ndarray:
  """Returns [E] (float64) of the episodes whose flattened rows `t` holds, in order: an episode
  ends at a terminal row, where the next row does not start from this row's s' (a truncation,
  then a reset), and at the last row. What the dataset's card reports (cards.episode_stats),
  from the arrays already loaded instead of reading every episode back (seconds for 100k rows)."""
  n = len(t.rewards)
  if n == 0:
    return np.zeros((0,), np.float64)
  ends = np.asarray(t.terminals).reshape(-1)[:-1] > 0
  ends |= np.any(np.asarray(t.next_observations)[:-1] != np.asarray(t.observations)[1:], axis=1)
  starts = np.concatenate([[0], np.flatnonzero(ends) + 1])
  return np.add.reduceat(np.asarray(t.rewards, np.float64).reshape(-1), starts)


def load_transitions(name: str, download: bool = False, *, cache: bool = True) -> Transitions:
  """All transitions of a dataset (short name or Minari id) as float32 numpy rows.

  Raises ValueError for an unknown short name (listing the valid ones, no I/O) and
  DatasetNotFoundError (a FileNotFoundError) naming the collector command for a missing dataset.

  Reading episode by episode costs about 1 ms per episode in h5py (a minute for the ~45k short
  episodes of a 1M-step random dataset), so with `cache` the flattened arrays are also kept in
  <Minari root>/.mombo_cache/<id>/ (a hidden folder Minari ignores), keyed by a fingerprint of
  the dataset's files: a rebuilt dataset is read afresh.
  """
  dataset = minari_io.load_dataset(name, download=download)
  dataset_id = names.resolve(name)
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
  data_dir = minari_io.data_path(dataset_id)
  digest = hashlib.sha1(dataset_id.encode())
  try:
    for entry in sorted(os.scandir(data_dir), key=lambda e: e.name):
      stat = entry.stat()
      digest.update(f"{entry.name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
  except OSError:
    return None
  return os.path.join(minari_io.datasets_root(), _CACHE_DIR, dataset_id,
                      f"transitions-{digest.hexdigest()[:16]}.npz")


def _write_cache(path: str, transitions: Transitions):
  """Atomic write; stale caches of the same dataset go. Failures only cost speed."""
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
