"""An actor's variables as a callable policy, written once: the jitted actor functions, cached per
actor shape (evaluation, exported policies and the collector's recordings compile each once), and
the actor in plain numpy for the online loop's one-state steps.

Every function takes the actor's variables {"params": ...} (critics.TanhGaussianActor's) and
returns actions in [-1, 1]: tanh(mean) (`mode`) or tanh(mean + std * eps) (`sample`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax.core import sac
from mombo_jax.core.critics import TanhGaussianActor, deterministic_action, sample_tanh_gaussian


@dataclasses.dataclass(frozen=True)
class ActorShape:
  """What fixes the actor's program: its hidden widths, action width and log-std clamp."""
  hidden_dims: Tuple[int, ...]
  action_dim: int
  log_std_min: float
  log_std_max: float

  @classmethod
  def of(cls, hidden_dims, action_dim, log_std_min, log_std_max) -> "ActorShape":
    """Normalised to hashable Python numbers, so equal shapes share one cache entry."""
    return cls(tuple(int(h) for h in hidden_dims), int(action_dim), float(log_std_min),
               float(log_std_max))

  @classmethod
  def from_config(cls, config, actor_params) -> "ActorShape":
    """The shape of config's actor whose variables are actor_params (they give the action width)."""
    agent = config.agent
    return cls.of(agent.actor_hidden, sac.actor_action_dim(actor_params), agent.log_std_min,
                  agent.log_std_max)


class ActorFunctions(NamedTuple):
  """The jitted policy functions of one actor shape.

  mode(variables, obs [B, obs_dim]) -> tanh(mean) [B, A]
  sample(variables, obs [B, obs_dim], key) -> tanh(mean + std * eps) [B, A]
  mode_per_seed(variables [S, ...], obs [S, E, obs_dim]) -> tanh(mean) [S, E, A] (vmap over seeds)
  init_shapes(obs_dim) -> the variables' shapes (jax.eval_shape of init)
  """
  mode: Callable
  sample: Callable
  mode_per_seed: Callable
  init_shapes: Callable


@functools.lru_cache(maxsize=16)
def actor_functions(shape: ActorShape) -> ActorFunctions:
  """The one cache of jitted actor functions, per actor shape (jit compiles each once per input
  shape on first call)."""
  actor = TanhGaussianActor(shape.hidden_dims, shape.action_dim, shape.log_std_min,
                            shape.log_std_max)

  def mode(variables, obs):
    mean, _ = actor.apply(variables, obs)
    return deterministic_action(mean)

  def sample(variables, obs, key):
    mean, log_std = actor.apply(variables, obs)
    return sample_tanh_gaussian(mean, log_std, key)[0]

  def init_shapes(obs_dim: int):
    return jax.eval_shape(actor.init, jax.random.PRNGKey(0), jnp.zeros((1, obs_dim), jnp.float32))

  return ActorFunctions(jax.jit(mode), jax.jit(sample), jax.jit(jax.vmap(mode)), init_shapes)


def numpy_actor(actor_params, log_std_min: float, log_std_max: float) -> Callable:
  """The actor as a numpy function on one observation: f(obs [obs_dim], rng or None) -> action [A]
  (a sample when rng is a numpy Generator, tanh(mean) when None). A [256, 256] MLP on one state
  costs tens of microseconds in numpy, several times less than a jitted call's dispatch, and the
  online loop acts once per environment step."""
  hidden, (mean_w, mean_b), (std_w, std_b) = jax.tree.map(
      np.asarray, sac.actor_layers(jax.device_get(actor_params)))

  def f(obs, rng=None):
    x = np.asarray(obs, np.float32)
    for w, b in hidden:
      x = np.maximum(x @ w + b, 0.0)
    mean = x @ mean_w + mean_b
    if rng is None:
      return np.tanh(mean)
    log_std = np.clip(x @ std_w + std_b, log_std_min, log_std_max)
    return np.tanh(mean + np.exp(log_std) * rng.standard_normal(mean.shape, np.float32))
  return f
