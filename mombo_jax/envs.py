"""The real environments: building one (make_env), stepping it with a policy's action (step: the
only place a [-1, 1] action is mapped to the env's bounds), and recording its episodes
(run_episodes; recording.rollout steps many side by side). Evaluation (evaluate.Evaluator:
to_env_action here, the envs stepped by env_pool.EnvPool), the online SAC loop and its
evaluations, the dataset collector and the uncertainty experiment's real transitions step through
`step`.

Episodes are dicts of observations [T+1, S], actions [T, A], rewards [T] (float64),
terminations [T], truncations [T] (bool), as the datasets hold them.
"""
from __future__ import annotations

from typing import Any, Callable, List, NamedTuple

import numpy as np

from mombo_jax import minari_io, names

GYM_IDS = {"halfcheetah": "HalfCheetah-v5", "hopper": "Hopper-v5", "walker2d": "Walker2d-v5"}
OBS_DIM = {"hopper": 11, "walker2d": 17, "halfcheetah": 17}
ACTION_DIM = {"hopper": 3, "walker2d": 6, "halfcheetah": 6}


def make_env(name: str, **kwargs):
  """The gymnasium v5 environment of a short name / env name, or of a dataset id (its eval env
  spec, else its env spec, when the dataset is local and stores one). kwargs go to gym.make
  (max_episode_steps=None keeps the env's own time limit)."""
  import gymnasium as gym
  if names.is_dataset_id(name):
    meta = minari_io.local_metadata(names.resolve(name))
    if meta and (meta.get("eval_env_spec") or meta.get("env_spec")):
      # Minari's own recovery also patches specs written by older gymnasium versions.
      return minari_io.load_dataset(name).recover_environment(eval_env=True, **kwargs)
  return gym.make(GYM_IDS[names.env_name(name)], **kwargs)


def to_env_action(action, space) -> np.ndarray:
  """Policy actions [..., A] in [-1, 1] -> the Box `space`'s bounds, in its dtype: low + (a + 1) / 2
  * (high - low), computed in float64. For [-1, 1] bounds (the MuJoCo tasks) that is exactly the
  identity, so it is skipped there."""
  action = np.asarray(action, np.float64)
  low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
  if not (np.all(low == -1.0) and np.all(high == 1.0)):
    action = low + 0.5 * (action + 1.0) * (high - low)
  return action.astype(space.dtype)


class EnvStep(NamedTuple):
  """What one env step returns. For a vector env every field has a leading env axis [N]."""
  next_obs: np.ndarray     # [S]
  reward: Any              # float
  terminated: Any          # bool
  truncated: Any           # bool
  env_action: np.ndarray   # [A]: the action the env got (in its bounds and dtype)


def step(env, action) -> EnvStep:
  """Steps `env` (a gymnasium env, or a vector env with actions [N, A]) with the policy's action
  in [-1, 1] (to_env_action maps it to the env's bounds)."""
  env_action = to_env_action(action, env.action_space)
  next_obs, reward, terminated, truncated, _ = env.step(env_action)
  return EnvStep(next_obs, reward, terminated, truncated, env_action)


def new_episode(obs) -> dict:
  """An episode being recorded, from its first observation [S] (lists; finish_episode stacks)."""
  return dict(observations=[obs], actions=[], rewards=[], terminations=[], truncations=[])


def record_step(episode: dict, action, out: EnvStep):
  """Appends one step to an episode being recorded: `action` [A] as it should be stored."""
  episode["observations"].append(out.next_obs)
  episode["actions"].append(action)
  episode["rewards"].append(float(out.reward))
  episode["terminations"].append(bool(out.terminated))
  episode["truncations"].append(bool(out.truncated))


def finish_episode(episode: dict) -> dict:
  """A recorded episode as arrays: observations [T+1, S] (as the env gives them), actions [T, A],
  rewards [T] float64, terminations / truncations [T] bool."""
  return dict(observations=np.stack(episode["observations"]),
              actions=np.stack(episode["actions"]),
              rewards=np.asarray(episode["rewards"], np.float64),
              terminations=np.asarray(episode["terminations"], bool),
              truncations=np.asarray(episode["truncations"], bool))


def run_episodes(make_env: Callable, policy: Callable, episodes: int, seed: int) -> List[dict]:
  """`episodes` whole episodes of policy(obs [S] float32) -> action [A] in [-1, 1] in one env from
  make_env(), episode i reset with seed + i, each run to termination or the time limit. Returns
  them as episodes (module docstring) holding the policy's actions (before to_env_action)."""
  env = make_env()
  out = []
  try:
    for i in range(episodes):
      obs, _ = env.reset(seed=seed + i)
      episode = new_episode(obs)
      while True:
        action = np.asarray(policy(np.asarray(obs, np.float32)))
        result = step(env, action)
        record_step(episode, action, result)
        obs = result.next_obs
        if result.terminated or result.truncated:
          break
      out.append(finish_episode(episode))
  finally:
    env.close()
  return out

