"""Episodes (mombo_jax.collection.recording, D4RL imports) written as local Minari datasets, with
their reference returns, provenance and dataset card (write_dataset; what a dataset says of
itself: DatasetMetadata): the write side of mombo_jax.data.minari_io, which reads them back."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings
from typing import Optional, Sequence

from mombo_jax.collection import cards
from mombo_jax.data import names, scores
from mombo_jax.data.minari_io import PROVENANCE_KEY, datasets_root, env_name as dataset_env
from mombo_jax.env import envs
from mombo_jax.errors import UserError

AUTHOR = "mombo_jax experiments/collect.py"


@dataclasses.dataclass(frozen=True)
class DatasetMetadata:
  """What a written dataset says of itself besides its episodes: its description and algorithm
  (Minari's fields); the env it was recorded in (env_name: for a full Minari id, else the id's;
  max_episode_steps: its time limit, None the env's) and its eval env (gymnasium v5; `eval_env`,
  an envs.eval_env_spec dict, makes both and is recorded under envs.EVAL_ENV_KEY: an import's
  D4RL physics); reference returns (`ref_scores` (min, max), default D4RL's for the env);
  `provenance` (see recipes.provenance_for) under PROVENANCE_KEY; `extra` metadata (JSON-encoded
  values)."""
  description: str
  algorithm: str
  max_episode_steps: Optional[int] = None
  env_name: Optional[str] = None
  eval_env: Optional[dict] = None
  ref_scores: Optional[tuple] = None
  provenance: Optional[dict] = None
  extra: Optional[dict] = None

  def extra_metadata(self) -> dict:
    """The metadata written after Minari's own: `extra`, the eval env spec, the provenance."""
    extra = {k: json.dumps(v) for k, v in (self.extra or {}).items()}
    if self.eval_env is not None:
      extra[envs.EVAL_ENV_KEY] = json.dumps(self.eval_env)
    if self.provenance is not None:
      extra[PROVENANCE_KEY] = json.dumps(self.provenance)
    return extra


def write_dataset(name: str, episodes: Sequence[dict], metadata: DatasetMetadata,
                  overwrite: bool = False) -> str:
  """Write episodes as a Minari dataset with `metadata` and its dataset card; returns its id.
  `name` is a short name (-> names.minari_id) or a full Minari id (used as it is). episodes:
  dicts of observations [T+1, S], actions [T, A], rewards, terminations, truncations [T].
  An existing dataset is refused unless overwrite; a failed write leaves none behind."""
  # minari only when writing: experiments.import_d4rl starts without it
  import minari
  from minari.data_collector import EpisodeBuffer
  dataset_id = name if names.is_dataset_id(name) else names.minari_id(name)
  env_id = metadata.env_name or dataset_env(name)
  path = os.path.join(datasets_root(), dataset_id)
  if os.path.exists(path):
    if not overwrite:
      raise UserError(f"Dataset {dataset_id} already exists at {path}; pass overwrite=True to "
                      "rebuild it.", params=("overwrite",))
    shutil.rmtree(path)
  env = envs.make_env(metadata.eval_env or env_id, max_episode_steps=metadata.max_episode_steps)
  eval_env = envs.make_env(metadata.eval_env or env_id)
  low, high = metadata.ref_scores or scores.D4RL_REF_SCORES[dataset_env(env_id)]
  buffers = [EpisodeBuffer(id=i, observations=ep["observations"], actions=ep["actions"],
                           rewards=ep["rewards"], terminations=ep["terminations"],
                           truncations=ep["truncations"]) for i, ep in enumerate(episodes)]
  try:
    with warnings.catch_warnings():
      warnings.filterwarnings("ignore", message=".*is set to None.*")
      minari.create_dataset_from_buffers(
          dataset_id, buffers, env=env, eval_env=eval_env.spec,
          algorithm_name=metadata.algorithm, author=AUTHOR,
          code_permalink="experiments/collect.py", ref_min_score=low, ref_max_score=high,
          description=metadata.description)
    extra = metadata.extra_metadata()
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
