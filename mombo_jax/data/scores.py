"""D4RL-normalised scores: 100 * (R - R_random) / (R_expert - R_random), with the reference returns
of the dataset's own metadata, else D4RL's for its environment (docs/spec.md section 6).
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from mombo_jax.data import minari_io, names
from mombo_jax.data.names import ENVS

# D4RL's reference returns (random, expert), D4RL d4rl/infos.py (docs/spec.md section 6); used
# when a dataset has none.
D4RL_REF_SCORES = {
    "halfcheetah": (-280.178953, 12135.0),
    "hopper": (-20.272305, 3234.3),
    "walker2d": (1.629008, 4592.3),
}


def ref_scores(name: str) -> Tuple[float, float, str]:
  """(R_random, R_expert, source) for a short name, env name or dataset id.

  The dataset's own ref_min_score/ref_max_score when it is local and has them; else the D4RL
  reference returns of its environment (docs/spec.md section 6). `source` says which.
  """
  if name not in ENVS:
    dataset_id = names.resolve(name)
    meta = minari_io.local_metadata(dataset_id)
    if meta and meta.get("ref_min_score") is not None and meta.get("ref_max_score") is not None:
      return (float(meta["ref_min_score"]), float(meta["ref_max_score"]),
              f"metadata of {dataset_id}")
  env = minari_io.env_name(name)
  low, high = D4RL_REF_SCORES[env]
  return low, high, f"D4RL reference returns for {env} (no reference scores in dataset metadata)"


def normalized_score(name: str, returns) -> np.ndarray:
  """100 * (R - R_random) / (R_expert - R_random), elementwise over `returns` (any shape)."""
  low, high, _ = ref_scores(name)
  return 100.0 * (np.asarray(returns, np.float64) - low) / (high - low)
