"""What one compiled training epoch computes with (EpochSettings), projected from a run's Config.

Core, like the epoch: it reads a Config by attribute names only (config.py builds on it, not the
other way round), so the compiled core never imports the run's settings layer; the groups it holds
are the Config's own (settings/groups.py), taken whole.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Tuple

from mombo_jax.core import algorithms


@dataclasses.dataclass(frozen=True)
class EpochSettings:
  """What one compiled training epoch (train.make_epoch) computes with: the run's algorithm, beta
  and schedule, and the settings groups it reads whole (the agent's networks, optimisers and
  update; the rollout and its ring; the dynamics ensemble's shape: those that shape the state it
  steps live in the state's static fields), and the precision of its matmuls. Hashable: the
  compiled program is keyed by it, so two Configs with equal EpochSettings share one program
  (seeds, evaluation, naming, the reference source and the dynamics' training are not in it).

  Built by epoch_settings(config, per_cell). The settings the cells of a program carry
  themselves (train.Cell: beta, and those of per_cell but rollout_length) are None: the program
  never reads them from here. Same attribute names as Config's, so the core reads either.
  """
  algorithm: algorithms.Algorithm
  env_name: str                       # picks the termination function
  beta: Optional[float]
  steps_per_epoch: int
  schedule_steps: int                 # gradient steps the actor's cosine schedule spans
  agent: Any                          # settings.groups.AgentConfig
  rollout: Any                        # settings.groups.RolloutConfig (rollout_length: a program
                                      # over cells: the longest cell's)
  dynamics: Any                       # settings.groups.DynamicsConfig
  matmul_precision: str               # Config.matmul_precision: what the epoch's dots compute at

  @property
  def moments_mode(self):
    """(kind, rank) of agent.moments, as Config.moments_mode: what MOMBO's targets read."""
    return algorithms.parse_moments(self.agent.moments)


def epoch_settings(config, per_cell: Optional[Tuple[str, ...]] = None) -> EpochSettings:
  """config's EpochSettings. per_cell None: a plain program (every setting config's, beta too);
  a tuple (train.CELL_SETTINGS names, maybe empty): a program over train.Cell values, whose beta
  and per_cell settings (but rollout_length: the program's is the longest) are None."""
  agent, rollout = config.agent, config.rollout
  beta = config.beta
  if per_cell is not None:
    beta = None
    # Each per-cell setting is None in whichever group holds it.
    none = lambda group: {f.name: None for f in dataclasses.fields(group)   # noqa: E731
                          if f.name in per_cell and f.name != "rollout_length"}
    agent = dataclasses.replace(agent, **none(agent))
    rollout = dataclasses.replace(rollout, **none(rollout))
  return EpochSettings(algorithm=config.algorithm, env_name=config.env_name, beta=beta,
                       steps_per_epoch=config.steps_per_epoch,
                       schedule_steps=config.schedule_steps, agent=agent, rollout=rollout,
                       dynamics=config.dynamics, matmul_precision=config.matmul_precision)
