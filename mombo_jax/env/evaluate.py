"""Evaluation in the real environment: the deterministic policy tanh(mean) of every seed's actor,
all seeds x episodes environments stepped together (over worker processes: env_pool), one jitted
policy call per time step for all of them. A launch builds its envs once (Evaluator) and reuses
them for every evaluation; all its cells are evaluated in one pass (run/evaluation.returns_all).

Returns are undiscounted sums of the environment's rewards up to termination or the time limit;
`scores.normalized_score` turns them into D4RL-normalised scores and `aulc` averages those over a
run.
"""
from __future__ import annotations

from typing import Any, Optional

import chex
import jax
import numpy as np

from mombo_jax import signals
from mombo_jax.core import actor_policy
from mombo_jax.env import env_pool, envs
from mombo_jax.settings.config import Config


def _num_seeds(actor_params) -> int:
  leaves = jax.tree.leaves(actor_params)
  if not leaves:
    raise ValueError("actor_params has no arrays; pass the actor's variables (agent.actor.params).")
  sizes = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in leaves}
  if len(sizes) != 1 or None in sizes:
    raise ValueError("actor_params needs one leading seed axis S on every leaf (shape [S, ...]); "
                     f"got leading sizes {sorted(sizes, key=str)}. For one seed, add an axis with "
                     "jax.tree.map(lambda x: x[None], params).")
  return sizes.pop()


def env_seeds(seed: int, num_seeds: int, episodes: int) -> np.ndarray:
  """Reset seeds [S, episodes] (distinct, reproducible) for the S x episodes evaluation envs."""
  return np.random.SeedSequence(int(seed)).generate_state(num_seeds * episodes).reshape(
      num_seeds, episodes)


class Evaluator:
  """The S x episodes evaluation envs of a run (or of a launch's cells), built once and reused by
  every evaluation.

  Every evaluation resets each env with its own seed (env_seeds), which restores the whole MuJoCo
  state and the env's RNG, so a reused set gives the returns a fresh one would. Close it when done
  (or use it as a context manager).

  config: for the actor's shape; env_name: short env ('hopper'), dataset name ('hopper-random',
  a Minari id: its envs.eval_env_spec) or an envs.eval_env_spec dict; num_seeds S (policies, e.g.
  every cell of a launch) and episodes: the shape of every evaluation; max_episode_steps: time
  limit override (tests), None keeps the env's own (1000 for MuJoCo); workers: processes stepping
  the envs (env_pool.EnvPool: 1 steps them in this process; 0 picks
  env_pool.auto_workers(S x episodes)). The returns do not depend on `workers`.
  """

  def __init__(self, config: Config, env_name, num_seeds: int, episodes: int,
               max_episode_steps: Optional[int] = None, workers: int = 1):
    if episodes < 1:
      raise ValueError(f"episodes must be >= 1, got {episodes}.")
    if max_episode_steps is not None and max_episode_steps < 1:
      raise ValueError(f"max_episode_steps must be >= 1 or None, got {max_episode_steps}.")
    if workers < 0:
      raise ValueError(f"workers must be >= 0 (0: auto), got {workers}.")
    self.num_seeds, self.episodes = int(num_seeds), int(episodes)
    num_envs = self.num_seeds * self.episodes
    first = envs.make_env(env_name, max_episode_steps=max_episode_steps)
    self.horizon = max_episode_steps or first.spec.max_episode_steps
    if self.horizon is None:
      first.close()
      raise ValueError(f"{env_name}: the env has no time limit; pass max_episode_steps.")
    # The rest are clones of the first from its spec (cheap even when the first came from a
    # dataset), stepped in this process or in worker processes; the spec's kwargs carry the
    # model file (an imported D4RL walker's xml_file), so every clone has the first's physics.
    self.pool = env_pool.EnvPool(first, num_envs, workers or env_pool.auto_workers(num_envs))
    space = self.pool.action_space
    self._action_shape = space.shape
    # jit(vmap over seeds) of obs [S, E, obs_dim] -> tanh(mean) [S, E, A], cached per actor
    # shape so that every evaluation of a run (and every Evaluator) reuses one compilation.
    self._policy = actor_policy.actor_functions(actor_policy.ActorShape.of(
        config.agent.actor_hidden, int(np.prod(space.shape)), config.agent.log_std_min,
        config.agent.log_std_max)).mode_per_seed

  @property
  def workers(self) -> int:
    return self.pool.workers

  def run(self, actor_params: Any, seed, should_stop=None) -> np.ndarray:
    """Undiscounted returns [S, episodes] (float64) of the deterministic policy of every seed.

    actor_params: the actor's variables ({"params": ...}, as in agent.actor.params) or its bare
      params, every leaf with a leading seed axis S.
    seed: an int: env (s, e) is reset with env_seeds(seed, S, episodes)[s, e]; or those reset
      seeds themselves, int [S, episodes] (several runs evaluated together, each with its own
      seeds: run/evaluation.returns_all). Same seeds, same returns.
    Episodes end at termination or truncation; a finished env is not stepped again.
    should_stop: polled before every time step; when it fires, errors.Interrupted (between two
    steps: the envs stay usable, the next run resets them).
    """
    num_seeds = _num_seeds(actor_params)
    if num_seeds != self.num_seeds:
      raise ValueError(f"This Evaluator holds envs for {self.num_seeds} seed(s); actor_params has "
                       f"{num_seeds}. Build an Evaluator per seed count.")
    episodes, num_envs = self.episodes, self.num_seeds * self.episodes
    if np.ndim(seed) == 0:
      reset_seeds = env_seeds(seed, num_seeds, episodes)
    else:
      reset_seeds = np.asarray(seed)
      if reset_seeds.shape != (num_seeds, episodes):
        raise ValueError(f"reset seeds must have shape [S, episodes] = {(num_seeds, episodes)}, "
                         f"got {reset_seeds.shape}.")
    variables = actor_params if "params" in actor_params else {"params": actor_params}
    # The policy runs on the host's CPU: the launch evaluates while the accelerator trains the next
    # epochs (Launch.train_epochs), and a policy call there would queue behind that device call.
    # On a CPU-only machine this is the device training uses, as before.
    cpu = jax.devices("cpu")[0]
    variables = jax.device_put(variables, cpu)
    space = self.pool.action_space
    obs = self.pool.reset(reset_seeds.ravel())
    returns = np.zeros(num_envs, np.float64)
    alive = np.ones(num_envs, bool)
    for _ in range(self.horizon):
      signals.check(should_stop, "an evaluation")
      obs_in = jax.device_put(np.asarray(obs.reshape(num_seeds, episodes, -1), np.float32), cpu)
      action = np.asarray(self._policy(variables, obs_in)).reshape(num_envs, *self._action_shape)
      obs, reward, terminated, truncated = self.pool.step(envs.to_env_action(action, space), alive)
      returns += np.where(alive, reward, 0.0)
      alive &= ~(terminated | truncated)
      if not alive.any():
        break
    out = returns.reshape(num_seeds, episodes)
    chex.assert_shape(out, (num_seeds, episodes))
    return out

  def close(self):
    """Closes the envs (ends the worker processes). Safe to call twice."""
    self.pool.close()

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def run(actor_params: Any, config: Config, env_name, episodes: int, seed: int,
        max_episode_steps: Optional[int] = None, workers: int = 1) -> np.ndarray:
  """Undiscounted returns [S, episodes] (float64) of the deterministic policy of every seed, in
  envs built for this call alone (a run's repeated evaluations reuse an Evaluator instead).

  See Evaluator for the arguments; actor_params carries the leading seed axis S.
  """
  if episodes < 1:
    raise ValueError(f"episodes must be >= 1, got {episodes}.")
  num_seeds = _num_seeds(actor_params)
  with Evaluator(config, env_name, num_seeds, episodes, max_episode_steps, workers) as evaluator:
    return evaluator.run(actor_params, seed)


def aulc(scores) -> np.ndarray:
  """Area under the learning curve [S]: the mean normalised score over all T evaluation points.

  scores: [T, S] normalised scores (evaluation point x seed).
  """
  scores = np.asarray(scores, np.float64)
  if scores.ndim != 2 or scores.shape[0] == 0:
    raise ValueError(f"aulc needs scores of shape [T, S] with T >= 1, got shape {scores.shape}.")
  return scores.mean(axis=0)
