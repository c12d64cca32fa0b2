"""Episodes as the datasets hold them (dicts of observations [T+1, S], actions [T, A], rewards,
terminations, truncations [T]): recorded from a policy in environments stepped side by side
(rollout; the uniform random and SAC policies), cut from a SAC run's replay buffer, mixed (the
paper's random + p% datasets), summarized for the log. mombo_jax.collection.recipes says which of
them each dataset is; mombo_jax.data.minari_io writes and reads them.
"""
from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence

import jax
import numpy as np

from mombo_jax.core import actor_policy
from mombo_jax.env.envs import finish_episode, new_episode, record_step, step
from mombo_jax.errors import Interrupted, InvalidValue


def rollout(make_env: Callable, policy: Callable, num_steps: int, seed: int,
            num_envs: int = 1, should_stop: Optional[Callable[[], bool]] = None) -> List[dict]:
  """Record exactly `num_steps` transitions of `policy` in `num_envs` envs stepped side by side.

  policy(obs [K, S] float32) -> actions [K, A] in [-1, 1].
  Returns episodes: dicts with observations [T+1, S] (float64, as the env gives them),
  actions [T, A] (env dtype), rewards [T], terminations [T], truncations [T]. Episodes still
  running when the budget is spent are cut and marked truncated.
  should_stop: polled every round of env steps; when it fires, errors.Interrupted and nothing is
  kept (a recording is seeded: recording again gives the same episodes).
  """
  if num_steps < 1:
    raise InvalidValue(f"`num_steps` must be >= 1, got {num_steps}.", params=("num_steps",))
  num_envs = max(1, min(num_envs, num_steps))
  envs = [make_env() for _ in range(num_envs)]
  seeds = np.random.SeedSequence(seed).generate_state(num_envs * 2)
  rngs = [np.random.default_rng(int(s)) for s in seeds[num_envs:]]
  episodes = []

  def start(i, reset_seed=None):
    obs, _ = envs[i].reset(seed=reset_seed if reset_seed is not None
                           else int(rngs[i].integers(2**31)))
    return new_episode(obs)

  open_eps = [start(i, int(seeds[i]) % 2**31) for i in range(num_envs)]
  done = 0
  while done < num_steps:
    if should_stop is not None and should_stop():
      for env in envs:
        env.close()
      raise Interrupted(getattr(should_stop, "signum", None), f"recording ({done} of {num_steps} "
                        "steps; recorded again from the start on resume: the same episodes)")
    active = min(num_envs, num_steps - done)
    obs = np.stack([ep["observations"][-1] for ep in open_eps]).astype(np.float32)
    actions = np.asarray(policy(obs))
    for i in range(active):
      out = step(envs[i], actions[i])
      record_step(open_eps[i], out.env_action, out)   # datasets hold the env's own actions
      if out.terminated or out.truncated:
        episodes.append(finish_episode(open_eps[i]))
        open_eps[i] = start(i)
    done += active
  for ep in open_eps:
    if ep["actions"]:
      ep["truncations"][-1] = True  # cut by the budget: the next state would still bootstrap
      episodes.append(finish_episode(ep))
  for env in envs:
    env.close()
  return episodes


def random_policy(action_dim: int, seed: int) -> Callable:
  """Uniform actions in [-1, 1]^A for a batch of observations."""
  rng = np.random.default_rng(seed)
  return lambda obs: rng.uniform(-1.0, 1.0, (obs.shape[0], action_dim)).astype(np.float32)


def sac_policy(actor_params, config, seed: int, deterministic: bool) -> Callable:
  """Batched SAC policy on host arrays: obs [B, obs_dim] -> actions [B, A] (actor_policy's jitted
  functions: compiled once per actor shape and batch size), drawing a fresh key per call from
  `seed`'s stream (a key is split per call even when deterministic, as recordings always did)."""
  fns = actor_policy.actor_functions(actor_policy.ActorShape.from_config(config, actor_params))
  key = [jax.random.key(seed)]

  def policy(obs):
    key[0], k = jax.random.split(key[0])
    return np.asarray(fns.mode(actor_params, obs) if deterministic
                      else fns.sample(actor_params, obs, k))
  return policy


def replay_episodes(replay: dict) -> List[dict]:
  """Replay rows (in collection order) -> episodes; a final unfinished episode is cut."""
  n = replay["reward"].shape[0]
  ends = np.flatnonzero(replay["end"] > 0).tolist()
  if not ends or ends[-1] != n - 1:
    ends.append(n - 1)
  episodes, start = [], 0
  for end in ends:
    sl = slice(start, end + 1)
    obs = np.concatenate([replay["obs"][sl], replay["next_obs"][end:end + 1]]).astype(np.float64)
    terminations = replay["terminated"][sl] > 0
    truncations = ~terminations
    truncations[:-1] = False
    episodes.append(dict(observations=obs, actions=replay["action"][sl].astype(np.float32),
                         rewards=replay["reward"][sl].astype(np.float64),
                         terminations=terminations, truncations=truncations))
    start = end + 1
  return episodes


def mix_episodes(base: Sequence[dict], better: Sequence[dict], fraction: float,
                 seed: int) -> List[dict]:
  """About len(base) transitions: `fraction` of them from whole `better` episodes, the rest whole
  `base` episodes, each drawn in random order (better ones first in the result)."""
  rng = np.random.default_rng(seed)
  total = sum(len(ep["rewards"]) for ep in base)

  def take(episodes, budget):
    out, count = [], 0
    for i in rng.permutation(len(episodes)):
      if count >= budget:
        break
      out.append(episodes[i])
      count += len(episodes[i]["rewards"])
    return out, count

  better_eps, n_better = take(better, math.ceil(fraction * total))
  base_eps, _ = take(base, total - n_better)
  return list(better_eps) + list(base_eps)


def summary(episodes: Sequence[dict]) -> str:
  """Transitions, episodes and episode returns, for the log."""
  steps = sum(len(ep["rewards"]) for ep in episodes)
  returns = [float(np.sum(ep["rewards"])) for ep in episodes]
  return (f"{steps} transitions, {len(episodes)} episodes, episode return mean "
          f"{np.mean(returns):.1f} (min {np.min(returns):.1f}, max {np.max(returns):.1f})")
