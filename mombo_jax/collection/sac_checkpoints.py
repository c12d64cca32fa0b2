"""What a collector's online SAC run (mombo_jax.collection.online_sac) keeps in its checkpoints: the
replay layout, the settings a checkpoint must match to be resumed, the Orbax checkpoints themselves
(SacCheckpoints), the run's result (SacResult, what sac_run.train_sac returns too) and
reading them back without training (restore_sac, for exporting actors).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional

import jax
import numpy as np

from mombo_jax.core import sac
from mombo_jax.errors import UserError
from mombo_jax.storage import checkpoint

REPLAY_FIELDS = ("obs", "action", "reward", "next_obs", "terminated")


@dataclasses.dataclass
class SacResult:
  """What the datasets need from a SAC run. replay_* arrays hold the first `medium_size` rows."""
  config: object
  final_actor: object                 # actor variables at the end of training
  steps_done: int                     # env steps trained (< total steps: stopped at medium)
  medium_actor: Optional[object]      # actor variables at the medium point (None: never reached)
  medium_step: int                    # env step of the medium point (-1: never reached)
  medium_size: int                    # replay rows up to the medium point
  replay: dict                        # host arrays, rows [0, medium_size)
  evals: list                         # [(step, mean return), ...]
  best_eval: tuple                    # (step, mean return)


def empty_replay(capacity: int, obs_dim: int, action_dim: int) -> dict:
  f32 = np.float32
  return dict(obs=np.zeros((capacity, obs_dim), f32), action=np.zeros((capacity, action_dim), f32),
              reward=np.zeros((capacity,), f32), next_obs=np.zeros((capacity, obs_dim), f32),
              terminated=np.zeros((capacity,), f32), end=np.zeros((capacity,), f32))


def run_settings(env, seed: int, start_steps: int) -> dict:
  """What a checkpoint must have been made with to be resumed (besides the network settings)."""
  return dict(seed=seed, start_steps=start_steps, obs_dim=env.observation_space.shape[0],
              action_dim=env.action_space.shape[0],
              max_episode_steps=env.spec.max_episode_steps if env.spec else None)


def restore_sac(make_env: Callable, config, total_steps: int, *, start_steps: int, seed: int,
                workdir: str):
  """The SAC run checkpointed in workdir (SacResult), as train_sac (a SacSchedule of these
  total_steps, start_steps and seed) would resume it, without training or evaluating anything:
  for exporting its actors (`collect --actors_only`). None when workdir holds no checkpoint.
  final_actor is the actor of the checkpoint's step (steps_done); a checkpoint a stop took amid a
  step's gradient steps counts that step as not done (its actor is half-way through them).
  Not beside a process still writing checkpoints there: opening the Orbax manager removes
  unfinished temporary checkpoint folders."""
  if not os.path.isdir(workdir):
    return None   # nothing to read, and nothing created
  env = make_env()
  obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
  settings = run_settings(env, seed, start_steps)
  env.close()
  state, meta = SacCheckpoints(workdir, config, total_steps, settings).restore(obs_dim, action_dim)
  if state is None:
    return None
  evals = [tuple(e) for e in meta["evals"] or []]
  size = meta["medium_size"]
  mid_chunk = (meta.get("loop") or {}).get("phase") == "train"
  return SacResult(config=config, final_actor=state["agent"].actor.params,
                   steps_done=meta["step"] - mid_chunk,
                   medium_actor=state["medium_actor"] if meta["medium_step"] >= 0 else None,
                   medium_step=meta["medium_step"], medium_size=size,
                   replay={k: v[:size] for k, v in state["replay"].items()}, evals=evals,
                   best_eval=max(evals, key=lambda e: e[1]) if evals else (meta["step"],
                                                                           float("nan")))


class SacCheckpoints:
  """The SAC run's checkpoints (mombo_jax.storage.checkpoint.RunCheckpointer, kind "collector"):
  state pytree (agent, replay, key data, medium actor) plus metadata (step, medium point,
  evaluations, the run's settings for a sanity check)."""

  def __init__(self, directory: str, config, total_steps: int, run_settings: dict):
    self.directory = os.path.abspath(directory)
    self.config = config
    self.run_settings = run_settings
    self.total_steps = total_steps
    self._ckpt = checkpoint.RunCheckpointer(self.directory, keep=2, kind="collector")

  def _settings(self):
    c = self.config
    return dict(actor_hidden=list(c.agent.actor_hidden), critic_hidden=list(c.agent.critic_hidden),
                batch_size=c.agent.batch_size, **self.run_settings)

  def save(self, step: int, state: dict, meta: dict):
    meta = dict(meta, settings=self._settings(), capacity=int(state["replay"]["obs"].shape[0]))
    self._ckpt.save(step, state, meta)

  def restore(self, obs_dim: int, action_dim: int):
    """(state, meta) of the latest valid checkpoint, or (None, None) when there is none."""
    try:
      meta = self._ckpt.metadata()
    except checkpoint.CheckpointError as e:
      raise UserError(str(e)) from None
    if meta is None:
      return None, None
    if meta.get("settings") != self._settings():
      raise UserError(f"The SAC checkpoint in {self.directory} was made with {meta.get('settings')}"
                      f", not {self._settings()}; use another `workdir` or the same settings.",
                      params=("workdir",))
    capacity = int(meta["capacity"])
    agent = sac.init_agent(jax.random.key(0), obs_dim, action_dim, self.config, self.total_steps)
    template = dict(agent=agent, key=np.asarray(jax.random.key_data(jax.random.key(0))),
                    replay=empty_replay(capacity, obs_dim, action_dim),
                    medium_actor=jax.tree_util.tree_map(np.asarray, agent.actor.params))
    try:
      state, meta = self._ckpt.restore(template)
    except checkpoint.CheckpointError as e:
      raise UserError(str(e)) from None
    state["replay"] = {k: np.array(v) for k, v in state["replay"].items()}
    if capacity < self.total_steps:  # a longer run continues a finished one
      grown = empty_replay(self.total_steps, obs_dim, action_dim)
      for k, v in state["replay"].items():
        grown[k][:capacity] = v
      state["replay"] = grown
    state["medium_actor"] = jax.tree_util.tree_map(np.asarray, state["medium_actor"])
    meta = {k: meta.get(k) for k in ("step", "medium_step", "medium_size", "evals", "episodes",
                                      "trained", "medium_streak", "loop")}
    meta["medium_streak"] = meta["medium_streak"] or 0
    return state, meta
