"""Networks: a critic whose one set of parameters runs plain or moment-matching, the critic
ensemble (nn.vmap over a leading member axis) and the tanh-Gaussian actor.

Knows moments, nothing of RL losses.
"""
from typing import Optional, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from mombo_jax.moments import mm_linear, mm_relu


class MMDense(nn.Module):
  """Dense layer that maps either an array or a diagonal Gaussian (mean, var)."""
  features: int
  kernel_init: nn.initializers.Initializer = nn.initializers.lecun_normal()

  @nn.compact
  def __call__(self, x, var=None):
    kernel = self.param("kernel", self.kernel_init, (x.shape[-1], self.features), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros_init(), (self.features,), jnp.float32)
    if var is None:
      return x @ kernel + bias, None
    # The mean path is the plain path verbatim, so zero variance reproduces it bit for bit.
    mean, var_out = mm_linear(x, var, kernel, bias)
    return mean, var_out


class MMCritic(nn.Module):
  """Q(s, a) as a ReLU MLP with a linear scalar head.

  __call__(obs [..., S], action [..., A]) -> q [...]
  __call__(obs, action, obs_var [..., S]) -> (mean [...], var [...]): moment-matched through the
  same parameters; the action enters with zero variance.
  """
  hidden_dims: Sequence[int] = (256, 256)

  @nn.compact
  def __call__(self, obs, action, obs_var: Optional[jax.Array] = None):
    chex.assert_equal_shape_prefix([obs, action], obs.ndim - 1)
    x = jnp.concatenate([obs, action], axis=-1)
    var = None
    if obs_var is not None:
      chex.assert_equal_shape([obs, obs_var])
      var = jnp.concatenate([obs_var, jnp.zeros_like(action)], axis=-1)
    for width in self.hidden_dims:
      x, var = MMDense(width)(x, var)
      if var is None:
        x = nn.relu(x)
      else:
        x, var = mm_relu(x, var)
    x, var = MMDense(1)(x, var)
    if var is None:
      return x[..., 0]
    return x[..., 0], var[..., 0]


class CriticEnsemble(nn.Module):
  """`num_critics` MMCritics with a leading parameter axis.

  Returns q [E, ...] (plain) or (mean [E, ...], var [E, ...]) (moment matching).
  """
  hidden_dims: Sequence[int] = (256, 256)
  num_critics: int = 2

  @nn.compact
  def __call__(self, obs, action, obs_var=None):
    ensemble = nn.vmap(MMCritic, variable_axes={"params": 0}, split_rngs={"params": True},
                       in_axes=None, out_axes=0, axis_size=self.num_critics)
    return ensemble(self.hidden_dims, name="members")(obs, action, obs_var)


class TanhGaussianActor(nn.Module):
  """pi(a | s): ReLU MLP -> (mean [..., A], log_std [..., A]) of the pre-tanh Gaussian.

  log_std is clamped to [log_std_min, log_std_max].
  """
  hidden_dims: Sequence[int]
  action_dim: int
  log_std_min: float = -5.0
  log_std_max: float = 2.0

  @nn.compact
  def __call__(self, obs):
    x = obs
    for width in self.hidden_dims:
      x = nn.relu(nn.Dense(width)(x))
    mean = nn.Dense(self.action_dim)(x)
    log_std = jnp.clip(nn.Dense(self.action_dim)(x), self.log_std_min, self.log_std_max)
    return mean, log_std


def sample_tanh_gaussian(mean, log_std, key):
  """Reparameterised a = tanh(mean + std * eps) and log pi(a|s) [...] with the tanh correction."""
  eps = jax.random.normal(key, mean.shape, mean.dtype)
  pre = mean + jnp.exp(log_std) * eps
  action = jnp.tanh(pre)
  log_prob = jnp.sum(-0.5 * eps**2 - log_std - 0.5 * jnp.log(2 * jnp.pi), axis=-1)
  log_prob -= jnp.sum(jnp.log(1.0 - action**2 + 1e-6), axis=-1)
  return action, log_prob


def deterministic_action(mean):
  """The evaluation action tanh(mean)."""
  return jnp.tanh(mean)
