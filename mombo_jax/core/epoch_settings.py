"""What one compiled training epoch computes with (EpochSettings), projected from a run's Config.

Core, like the epoch: it reads a Config by attribute names only (config.py builds on it, not the
other way round), so the compiled core never imports the run's settings layer.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from mombo_jax.core import algorithms


@dataclasses.dataclass(frozen=True)
class EpochSettings:
  """What one compiled training epoch (train.make_epoch) computes with: the Config fields it
  reads, its Algorithm value, and the settings that shape the state it steps (networks, their
  optimisers and the actor's schedule, which live in the state's static fields). Hashable: the
  compiled program is keyed by it, so two Configs with equal EpochSettings share one program
  (seeds, evaluation, naming, the reference source and the dynamics' training are not in it).

  Built by epoch_settings(config, per_cell). The settings the cells of a program carry
  themselves (train.Cell: beta, and those of per_cell but rollout_length) are None: the program
  never reads them from here. Same attribute names as Config's, so the core reads either.
  """
  algorithm: algorithms.Algorithm
  env_name: str                       # picks the termination function
  # SAC update and targets.
  gamma: float
  tau: float
  batch_size: int
  real_ratio: Optional[float]
  auto_alpha: Optional[bool]
  alpha: float
  alpha_max: Optional[float]
  target_entropy: Optional[float]
  deterministic_backup: bool
  clip_target_min: Optional[float]
  beta: Optional[float]
  mobile_num_samples: int
  max_abs_loss: float
  # Epoch and rollout.
  steps_per_epoch: int
  rollout_batch_size: int
  rollout_length: int                 # a program over cells: the longest cell's
  buffer_retain_epochs: int
  rollout_obs_limit: Optional[float]
  # The networks and optimisers of the state it steps.
  actor_hidden: Tuple[int, ...]
  critic_hidden: Tuple[int, ...]
  num_critics: int
  actor_lr: float
  critic_lr: float
  alpha_lr: float
  log_alpha_init: float
  log_std_min: float
  log_std_max: float
  actor_cosine_schedule: bool
  schedule_steps: int
  dyn_members: int
  dyn_elites: int
  dyn_hidden: Tuple[int, ...]
  dyn_max_logvar_init: float
  dyn_min_logvar_init: float


def epoch_settings(config, per_cell: Optional[Tuple[str, ...]] = None) -> EpochSettings:
  """config's EpochSettings. per_cell None: a plain program (every setting config's, beta too);
  a tuple (train.CELL_SETTINGS names, maybe empty): a program over train.Cell values, whose beta
  and per_cell settings (but rollout_length: the program's is the longest) are None."""
  # Fields of Config, or its properties (algorithm, env_name, schedule_steps).
  values = {f.name: getattr(config, f.name) for f in dataclasses.fields(EpochSettings)}
  if per_cell is not None:
    values.update(beta=None, **{f: None for f in per_cell if f != "rollout_length"})
  return EpochSettings(**values)
