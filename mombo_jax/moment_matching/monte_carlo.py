"""Monte Carlo moments of fn(X), X ~ N(mean, diag var): the reference the moment-matched ones
(moment_matching/moments.py) are checked against (tests, Figure 1, benchmarks).

  mc_moments(fn, mean, var, key, n, chunk_size=None)    Monte Carlo moments of fn(X), chunked
"""
import functools
from typing import Callable, Optional

import chex
import jax
import jax.numpy as jnp

# Elements (samples x output size) materialised at once by mc_moments.
_MC_CHUNK_ELEMENTS = 1 << 22


def mc_moments(fn: Callable, mean, var, key, n: int, chunk_size: Optional[int] = None):
  """Monte Carlo mean and variance of fn(X), X ~ N(mean, diag var), from n samples.

  Args:
    fn: maps one sample (an array shaped like mean) to an array or a pytree of arrays; it must be
      hashable (it is a static argument of the jitted sampler).
    mean, var: arrays of the same shape.
    key: PRNG key. n: number of samples (a Python int).
    chunk_size: samples drawn per step of a lax.scan; the default keeps ~4M sample elements in
      memory at once, so n = 1e6 works for small arrays. Chunks are combined with Chan's parallel
      update, so the variance does not suffer from the cancellation of E[Y^2] - E[Y]^2.
  Returns:
    (mean, var) of fn(X), each shaped like fn's output (population variance, ddof=0).
  """
  mean = jnp.asarray(mean)
  var = jnp.asarray(var)
  chex.assert_equal_shape([mean, var])
  n = int(n)
  if n < 1:
    raise ValueError(f"mc_moments needs n >= 1 samples, got n={n}.")
  if chunk_size is None:
    chunk_size = max(1, _MC_CHUNK_ELEMENTS // max(1, mean.size))
  return _mc_moments(fn, mean, var, key, n, int(min(chunk_size, n)))


@functools.partial(jax.jit, static_argnums=(0, 4, 5))
def _mc_moments(fn, mean, var, key, n, chunk_size):
  num_chunks = -(-n // chunk_size)
  std = jnp.sqrt(var)
  dtype = jnp.result_type(mean, float)

  def combine(carry, i):
    cnt_a, mu_a, m2_a = carry
    x = mean + std * jax.random.normal(jax.random.fold_in(key, i), (chunk_size,) + mean.shape,
                                       dtype)
    y = jax.vmap(fn)(x)
    # The last chunk may run past n: those samples get weight 0.
    w = (i * chunk_size + jnp.arange(chunk_size) < n).astype(dtype)
    cnt_b = jnp.sum(w)
    weight = lambda leaf: w.reshape((-1,) + (1,) * (leaf.ndim - 1))  # noqa: E731
    mu_b = jax.tree.map(lambda leaf: jnp.sum(weight(leaf) * leaf, 0) / cnt_b, y)
    m2_b = jax.tree.map(lambda leaf, c: jnp.sum(weight(leaf) * (leaf - c) ** 2, 0), y, mu_b)
    # Chan et al.'s pairwise update; cnt_a == 0 on the first chunk makes it a copy.
    tot = cnt_a + cnt_b
    delta = jax.tree.map(lambda a, b: b - a, mu_a, mu_b)
    mu = jax.tree.map(lambda a, dl: a + dl * (cnt_b / tot), mu_a, delta)
    m2 = jax.tree.map(lambda a, b, dl: a + b + dl**2 * (cnt_a * cnt_b / tot), m2_a, m2_b, delta)
    return (tot, mu, m2), None

  out = jax.eval_shape(fn, jax.ShapeDtypeStruct(mean.shape, dtype))
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), out)
  init = (jnp.zeros((), dtype), zeros, zeros)
  (cnt, mu, m2), _ = jax.lax.scan(combine, init, jnp.arange(num_chunks))
  return mu, jax.tree.map(lambda leaf: leaf / cnt, m2)
