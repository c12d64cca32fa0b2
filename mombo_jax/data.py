"""Datasets: Minari loading, flattening to transitions, normalised scores, evaluation envs."""
from typing import NamedTuple

import numpy as np


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
