"""Low-rank moment matching: a Gaussian input of low-rank covariance carried through a ReLU MLP
with its correlations, at a small multiple of the diagonal mode's cost (issue #49).

API
  lowrank_input(x [..., I], var [..., K], kernel [I, F], bias [F], rank=None, product=None)
      -> (m [..., F], L [..., r, F], d [..., F])   the first layer's moments in factored form
  lr_linear(m, L, d, kernel, bias, product=None) -> (m, L, d)   an affine layer (exact on L)
  lr_relu(m, L, d) -> (m, L, d)                                  ReLU (Lemma 1 + Stein's lemma)
  mlp_moments(layers, x, var, rank=None, product=None) -> (mean [..., O], var [..., O])
      a ReLU MLP [(kernel [I, F], bias [F]), ...] (ReLU between layers, none after the last)

Representation. After each layer the activations are h = m + L^T z + e with z ~ N(0, I_r) shared
by all units (r <= K, the input's random dimensions), L [r, F] the units' loadings on z and e
independent across units with variance d [F]: the covariance L^T L + diag(d). The input of MOMBO's
critic is [s', a'] with s' ~ N(mu, diag(var_s)) on its K = S state dimensions and a' exact, so its
covariance has rank <= S (11 on hopper, 17 on walker2d; the critics are 256 wide).

  first layer   h = x @ W + b with x = mu + sd * z on the first K inputs: m = mu @ W + b (the
                plain layer on the mean), L[j] = sd_j W[j] (K rows of W scaled, no matmul), d = 0.
                Exact.
  rank < K      keep, per row, the `rank` input dimensions j of largest var_j ||W[j]||^2 (their
                share of the layer's total variance) in L; the others go to d as independent
                terms, d = var_dropped @ W^2 (exact marginal variances, their correlations lost).
  affine        m -> m @ W + b, L -> L @ W, d -> d @ W^2: exact for m and L (z passes through a
                linear map unchanged); d @ W^2 assumes e independent across units (as the diagonal
                mode does for everything).
  ReLU          total variance v_i = ||L[:, i]||^2 + d_i; the output mean and variance are
                Lemma 1's closed form (moments.mm_relu(m, v)), exact for a Gaussian h_i. The
                loadings by Stein's lemma (Stein 1981, Ann. Statist. 9(6), Lemma 1): for jointly
                Gaussian (h_i, z), Cov(relu(h_i), z) = E[relu'(h_i)] Cov(h_i, z)
                = Phi(m_i / s_i) L[:, i], exact (statistical linearisation). So
                L -> L * Phi(m / s), and the rest of the variance,
                d = max(v - ||L_out[:, i]||^2, 0) (>= 0 in exact arithmetic: a best linear
                predictor's variance is at most the total), stays in the diagonal part. The
                cross-unit covariance this implies, Phi(a_i) Phi(a_j) L_i . L_j, is the exact
                ReLU covariance's first-order term in the correlation (Price's theorem), which
                propagate's full mode and deterministic variational inference (Wu et al. 2019,
                ICLR) evaluate whole.

The approximation, named: after a ReLU the residual relu(h) - E[relu(h)] - L_out^T z, uncorrelated
with z by construction, is treated as independent across units (its cross-unit covariance, what
the ReLU's curvature adds, is dropped), and every layer's output as Gaussian (moment matching, as
the diagonal and full modes). Everything the input's correlations do through linear layers and
the ReLUs' linear response is kept: the mean of the next ReLU sees the correct total variance of
each unit, which the diagonal mode gets wrong. Measured on the quick start's trained critic
(benchmarks/bench_lowrank.txt): at full rank, std 0.73-0.94x Monte Carlo's and the mean within
0.047 of its std (the diagonal: 0.08-0.32x and 0.36).

Cost: a linear layer of width F -> F' costs r + 2 of the plain layer's matmuls (mean, r loadings,
d), against the diagonal's 2; the first layer costs the diagonal's (L is K rows of W scaled).
Exactness: zero input variance gives the plain network's mean bit for bit (the mean path is the
plain layer's and mm_relu(m, 0) = (relu(m), 0)) and variance 0; a network without ReLUs is exact
(tests/test_lowrank_moments.py).
"""
from typing import Callable, Optional, Sequence, Tuple

import chex
import jax
import jax.numpy as jnp
from jax.scipy.special import ndtr

from mombo_jax.moment_matching.moments import mm_relu


def _dot(x, kernel):
  return x @ kernel


def lowrank_input(x, var, kernel, bias, rank: Optional[int] = None,
                  product: Optional[Callable] = None, basis: str = "dims"):
  """The first layer x @ kernel + bias of x ~ N(x, diag(var)) on its first K inputs (the others
  exact): (m [..., F], L [..., r, F], d [..., F]), r = min(K, rank) (rank None: K).

  x [..., I], var [..., K] (K <= I), kernel [I, F], bias [F]. product(x, kernel): the mean's
  matmul (default x @ kernel; the critic passes its own, critics.matmul, so that the mean is the
  plain layer's bit for bit). rank < K, basis "dims": keep per row the rank input dimensions of
  largest var_j ||kernel[j]||^2 and put the rest into d (module docstring); basis "pca": keep per
  row the rank leading principal directions of the layer's covariance (eigenvectors of the K x K
  Gram sd_j sd_k kernel[j] . kernel[k]), the best rank-r approximation of it, the rest into d."""
  product = product or _dot
  num_var = var.shape[-1]
  chex.assert_equal_shape_prefix([x, var], x.ndim - 1)
  if num_var > x.shape[-1]:
    raise ValueError(f"lowrank_input got variances for {num_var} inputs but only {x.shape[-1]} "
                     "inputs; pass var [..., K] with K <= the input size.")
  m = product(x, kernel) + bias
  rows = kernel[:num_var]                                   # [K, F]
  sd = jnp.sqrt(jnp.maximum(var, 0.0))                      # negative var is no variance
  if rank is None or rank >= num_var:
    loadings = sd[..., :, None] * rows                      # [..., K, F]
    return m, loadings, jnp.zeros_like(m)
  total = jnp.maximum(var, 0.0) @ (rows * rows)             # each unit's exact variance
  if basis == "pca":
    gram = sd[..., :, None] * (rows @ rows.T) * sd[..., None, :]          # [..., K, K]
    _, vectors = jnp.linalg.eigh(gram)                                     # ascending
    top = vectors[..., :, num_var - rank:] * sd[..., :, None]             # [..., K, r]
    loadings = jnp.swapaxes(top, -1, -2) @ rows                            # [..., r, F]
  elif basis == "dims":
    energy = sd * sd * jnp.sum(rows * rows, axis=-1)        # [..., K]
    _, keep = jax.lax.top_k(energy, rank)                   # [..., r]
    loadings = jnp.take_along_axis(sd, keep, axis=-1)[..., None] * rows[keep]   # [..., r, F]
  else:
    raise ValueError(f"lowrank_input: basis must be 'dims' or 'pca', got {basis!r}.")
  return m, loadings, jnp.maximum(total - total_var(loadings, jnp.zeros_like(total)), 0.0)


def lr_linear(m, loadings, d, kernel, bias, product: Optional[Callable] = None):
  """An affine layer: (m @ kernel + bias [..., F'], loadings @ kernel [..., r, F'],
  d @ kernel^2 [..., F']). m [..., F], loadings [..., r, F], d [..., F], kernel [F, F']."""
  product = product or _dot
  chex.assert_equal_shape([m, d])
  return product(m, kernel) + bias, product(loadings, kernel), d @ (kernel * kernel)


def total_var(loadings, d):
  """Each unit's variance ||loadings[..., :, i]||^2 + d_i [..., F]."""
  return jnp.sum(loadings * loadings, axis=-2) + d


def _gain(m, v):
  """Phi(m / sqrt(v)) [..., F] = P(h > 0) = E[relu'(h)], Stein's lemma's factor. Where v == 0 the
  loadings are 0 and the step relu'(m) serves; the safe divisor keeps 0 / 0 out."""
  return jnp.where(v > 0, ndtr(m / jnp.where(v > 0, jnp.sqrt(v), 1.0)), (m > 0).astype(m.dtype))


def lr_relu(m, loadings, d):
  """ReLU of h = m + loadings^T z + e: (mean, loadings * Phi(m / s), residual variance), s the
  total std; mean and variance by moments.mm_relu (Lemma 1), loadings by Stein's lemma, the
  residual independent across units (the named approximation; module docstring)."""
  v = total_var(loadings, d)
  mean, var = mm_relu(m, v)
  out = loadings * _gain(m, v)[..., None, :]
  return mean, out, jnp.maximum(var - jnp.sum(out * out, axis=-2), 0.0)


def _first_factor(x, var, kernel, bias, rank, product, basis):
  """The first layer in the form mlp_moments carries: (m [..., F], sq [..., F] (each unit's
  variance through the factor, ||L[:, i]||^2), d [..., F], scaled(gain [..., F]) -> L * gain
  [..., r, F]), L (lowrank_input's) never written out: the next layer needs only L * gain."""
  num_var = var.shape[-1]
  m = product(x, kernel) + bias
  rows = kernel[:num_var]                                   # [K, F]
  var = jnp.maximum(var, 0.0)                               # negative var is no variance
  sd, squares = jnp.sqrt(var), rows * rows
  total = var @ squares                                     # each unit's exact variance
  if rank is None or rank >= num_var:
    return m, total, jnp.zeros_like(m), lambda gain: sd[..., :, None] * rows * gain[..., None, :]
  if basis == "dims":
    _, keep = jax.lax.top_k(var * jnp.sum(squares, axis=-1), rank)        # [..., r]
    kept_var = var * jnp.sum(jax.nn.one_hot(keep, num_var, dtype=var.dtype), axis=-2)
    sq = kept_var @ squares
    kept_sd = jnp.take_along_axis(sd, keep, axis=-1)[..., :, None]
    return m, sq, jnp.maximum(total - sq, 0.0), lambda gain: kept_sd * rows[keep] * gain[
        ..., None, :]
  _, loadings, d = lowrank_input(x, var, kernel, bias, rank, product, basis)
  return m, total - d, d, lambda gain: loadings * gain[..., None, :]


def mlp_moments(layers: Sequence[Tuple[jax.Array, jax.Array]], x, var, rank: Optional[int] = None,
                product: Optional[Callable] = None, basis: str = "dims"):
  """(mean [..., O], var [..., O]) of a ReLU MLP's output (ReLU after every layer but the last)
  at x ~ N(x, diag(var)) on its first K inputs, in low-rank form. layers: [(kernel [I, F],
  bias [F]), ...] in call order; x [..., I], var [..., K]; rank, basis: lowrank_input's.

  The same recursion as lowrank_input, lr_relu and lr_linear, written for speed: a ReLU's gain
  scales the loadings only as they enter the next matmul (||L * g||^2 = g^2 ||L||^2 needs no
  pass over them), and the first layer's loadings (K rows of the kernel, scaled) are never
  written out on their own, so each hidden layer reads and writes its [..., r, F] loadings about
  twice (XLA:CPU fuses neither into its dots)."""
  product = product or _dot
  chex.assert_equal_shape_prefix([x, var], x.ndim - 1)
  if var.shape[-1] > x.shape[-1]:
    raise ValueError(f"mlp_moments got variances for {var.shape[-1]} inputs but only "
                     f"{x.shape[-1]} inputs; pass var [..., K] with K <= the input size.")
  m, sq, d, scaled = _first_factor(x, var, *layers[0], rank, product, basis)
  for kernel, bias in layers[1:]:
    mean, var_out = mm_relu(m, sq + d)
    gain = _gain(m, sq + d)
    loadings = product(scaled(gain), kernel)                               # [..., r, F']
    sq_out = gain * gain * sq
    m = product(mean, kernel) + bias
    d = jnp.maximum(var_out - sq_out, 0.0) @ (kernel * kernel)
    sq = jnp.sum(loadings * loadings, axis=-2)
    scaled = lambda gain, loadings=loadings: loadings * gain[..., None, :]  # noqa: E731
  return m, sq + d
