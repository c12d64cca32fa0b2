"""Episodes (mombo_jax.recording) to and from local Minari datasets: write_dataset writes them with
their reference returns, provenance and dataset card; read_episodes reads them back.
"""
from __future__ import annotations

import json
import os
import shutil
import warnings
from typing import List, Optional, Sequence

import numpy as np

from mombo_jax import cards, data
from mombo_jax.online_sac import UserError

AUTHOR = "mombo_jax experiments/collect.py"


def write_dataset(name: str, episodes: Sequence[dict], description: str, algorithm: str,
                  max_episode_steps: Optional[int] = None, overwrite: bool = False, *,
                  provenance: Optional[dict] = None, ref_scores: Optional[tuple] = None,
                  env_name: Optional[str] = None, extra_metadata: Optional[dict] = None):
  """Write episodes as a Minari dataset: `name` is a short name (-> data.minari_id) or a full
  Minari id (used as it is; its env from `env_name`, else from the id). Metadata: the env and its
  gymnasium v5 eval env, reference returns (`ref_scores` (min, max), default D4RL's for the env),
  `provenance` (see recipes.provenance_for) under data.PROVENANCE_KEY, and `extra_metadata`
  (JSON-encoded values). episodes: dicts of observations [T+1, S], actions [T, A], rewards,
  terminations, truncations [T]."""
  import minari
  from minari.data_collector import EpisodeBuffer
  dataset_id = name if "/" in name else data.minari_id(name)
  env_id = env_name or data.env_name(name)
  path = os.path.join(data.datasets_root(), dataset_id)
  if os.path.exists(path):
    if not overwrite:
      raise UserError(f"Dataset {dataset_id} already exists at {path}; pass --overwrite to "
                      "rebuild it.")
    shutil.rmtree(path)
  env = data.make_env(env_id, max_episode_steps=max_episode_steps)
  eval_env = data.make_env(env_id)
  low, high = ref_scores or data.D4RL_REF_SCORES[data.env_name(env_id)]
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
    if provenance is not None:
      extra[data.PROVENANCE_KEY] = json.dumps(provenance)
    if extra:
      minari.load_dataset(dataset_id).storage.update_metadata(extra)
  except BaseException:
    shutil.rmtree(path, ignore_errors=True)  # no half-written dataset blocks the next attempt
    raise
  finally:
    env.close()
    eval_env.close()
  cards.write_card(dataset_id, episodes=episodes)   # dataset_card.md + returns_hist.png
  return dataset_id


def read_episodes(name: str) -> List[dict]:
  """The episodes of a local dataset, as recording.rollout records them."""
  ds = data.load_dataset(name)
  return [dict(observations=np.asarray(ep["observations"]), actions=np.asarray(ep["actions"]),
               rewards=np.asarray(ep["rewards"]), terminations=np.asarray(ep["terminations"]),
               truncations=np.asarray(ep["truncations"]))
          for ep in ds.storage.get_episodes(ds.episode_indices)]
