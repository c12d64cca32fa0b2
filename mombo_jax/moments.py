"""Moment matching of diagonal Gaussians through affine maps and ReLU (paper Alg. 1, Lemma 1).

PLACEHOLDER numerics (textbook formula): being replaced by the stable implementation.
"""
import jax
import jax.numpy as jnp


def mm_linear(mean, var, kernel, bias):
  """Diagonal Gaussian N(mean, var) [..., I] through x @ kernel[I, O] + bias[O] -> (mean, var) [..., O]."""
  return mean @ kernel + bias, var @ (kernel * kernel)


def mm_relu(mean, var):
  """Mean and variance of relu(X), X ~ N(mean, var) elementwise."""
  pos = var > 0
  s = jnp.sqrt(jnp.where(pos, var, 1.0))
  a = mean / s
  cdf = jax.scipy.stats.norm.cdf(a)
  pdf = jax.scipy.stats.norm.pdf(a)
  m = mean * cdf + s * pdf
  v = (mean**2 + var) * cdf + mean * s * pdf - m**2
  v = jnp.clip(v, 0.0, var)
  return jnp.where(pos, m, jax.nn.relu(mean)), jnp.where(pos, v, 0.0)


def mc_moments(fn, mean, var, key, n):
  """Monte Carlo mean and variance of fn(X), X ~ N(mean, var), from n samples."""
  x = mean + jnp.sqrt(var) * jax.random.normal(key, (n,) + jnp.shape(mean), jnp.result_type(mean))
  y = jax.vmap(fn)(x)
  return y.mean(0), y.var(0)
