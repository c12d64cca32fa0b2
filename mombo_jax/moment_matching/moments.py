"""Moment matching of diagonal Gaussians through affine maps and ReLU (paper Alg. 1, Lemma 1).

API
  mm_linear(mean, var, kernel, bias) -> (mean, var)     diagonal Gaussian through x @ kernel + bias
  mm_relu(mean, var) -> (m, v)                          moments of relu(X), X ~ N(mean, var)
  mm_leaky_relu(mean, var, negative_slope) -> (m, v)    the same for leaky_relu (via mm_relu)
  ACTIVATION_MOMENTS                                    name -> moment function
(Their Monte Carlo reference, mc_moments: moment_matching/monte_carlo.py.)

For X ~ N(mu, s^2) with a = mu / s, Lemma 1 (i) gives the moments of Y = max(0, X) as

  E[Y]   = s * h(a),    h(a) = a Phi(a) + phi(a),
  Var[Y] = s^2 * g(a),  g(a) = (a^2 + 1) Phi(a) + a phi(a) - h(a)^2.

Evaluated as written this cancels catastrophically: for a << 0 the terms of h are O(1) while
h ~ phi(a) / a^2 and those of g are O(|a|) while g ~ 2 phi(a) / |a|^3; for a >> 0 Var[Y] = s^2
minus tiny corrections comes out of E[Y^2] - E[Y]^2 with E[Y]^2 ~ mu^2 >> s^2. Here every
quantity is a product or a sum of positive terms:

* t = |a|. Laplace's continued fraction for the Mills ratio R(t) = Q(t) / phi(t) (Q = 1 - Phi),
  R = 1 / (t + c1), c_k = k / (t + c_{k+1}), gives exactly
    A := 1 - t R = c1 R = 1 / (t (t + c2) + 1),   (t^2 + 1) R - t = c1 c2 R,
    h(-t) = phi(t) A,                             g(-t) = phi(t) A (c2 - h(-t)),
  where c2 - h(-t) is no cancellation (h(-t) <= 0.32 c2). c2(t) itself comes from a table, no
  erf/erfc is needed: float64 uses a Chebyshev series in t / (t + 4) on [0, 64] (31 terms, 1e-16),
  interpolated with mpmath by `_c2_chebyshev_coefficients`; float32 a rational P5(t) / Q6(t)
  with positive coefficients (5e-10 on [0, 24], beyond which every float32 tail term underflows),
  fitted by `_c2_rational_coefficients`, so that A = Q / D and c2 A = P / D share one division,
  D = t (t Q + P) + Q. Tests re-derive both tables.
* mu <= 0: E[Y] = s h(-t), Var[Y] = s^2 g(-t).
* mu > 0: Y = X + max(0, -X) gives h(a) = a + h(-a) and g(a) = 1 - T with the tail
    T = h(-t) (c2 + h(-t) + 2 t)      (positive terms; T <= 1 - g(0) = 0.66),
  so E[Y] = mu + s h(-t) and Var[Y] = s^2 (1 - T): the small correction is computed directly.
  Both sides: E[Y] = max(mu, 0) + s h(-t).
* phi(t) is computed as exp(SHIFT - t^2/2) * exp(-SHIFT) beyond t = sqrt(2 SHIFT), SHIFT =
  -log(tiny)/2, so no intermediate underflows while the result is a normal number (s = 1e19,
  t = 15 in float32). |a| is clipped at 64, where every tail term has underflowed in both dtypes.

Accuracy (benchmarks/bench_moments.py; mpmath at 80 digits evaluated at the exact floating-point
inputs; 32,923 points: a = mu/s in {0, +-logspace(-4, 4, 401)} x var in logspace(-30, 10, 41)).
Worst relative error where the true value is a normal number, by |a| band:

              float32 (eps 1.2e-7)                          float64 (eps 2.2e-16)
  |a|         E[Y] a<=0  E[Y] a>0  Var a<=0  Var a>0         E[Y] a<=0  E[Y] a>0  Var a<=0  Var a>0
  [0, 1)      3.5e-7     2.7e-7    3.0e-7    4.7e-7          6.2e-16    6.2e-16   8.8e-16   1.1e-15
  [1, 4)      1.4e-6     7.2e-8    1.5e-6    1.1e-7          2.3e-15    2.1e-16   2.5e-15   2.2e-16
  [4, 10)     9.9e-6     5.1e-8    1.0e-5    8.3e-8          1.3e-14    0         1.3e-14   2.2e-16
  [10, 40)    1.2e-5     0         1.2e-5    0               2.3e-13    0         2.3e-13   0
  [40, 1e4]   (underflow) 0        (underflow) 0             (underflow) 0        (underflow) 0

Overall: rel. error <= 0.85 (16 + a^2) eps. The a^2 eps part is not the method: a = mu / s is
rounded (relative error ~eps) and phi(a) moves by a relative a^2 times that, so any evaluation
from the rounded a has it; it is largest just before the true value leaves the normal range
(|a| ~ 13-16 in float32, ~37-46 in float64, depending on var). Where the true value is subnormal
or underflows, the result is within 0.95 (float32) / 0.42 (float64) smallest-normal units of it
(0 or a subnormal; XLA:CPU flushes subnormals to zero). Lemma 1 (ii) m >= max(mu, 0) and
(iii) 0 <= v <= var hold exactly in floating point on every backend: (ii) by construction (a
non-negative term added to relu(mu)) and (iii) nearly so, and both by clamps at the end that the
math makes no-ops (on a GPU, which keeps subnormal inputs, v <= var needed it). Subnormal inputs
count as 0, as in every XLA:CPU op.

var == 0 returns exactly (relu(mean), 0), bit for bit, so a moment-matched network at zero input
variance is the plain ReLU network. Negative var is treated as 0 (it is not a variance); a NaN
var gives a NaN variance.

Gradients (custom_jvp, closed form, finite for every finite input; checked against mpmath):
  dm/dmu = Phi(a), dm/dvar = phi(a) / (2 s), dv/dmu = 2 m Phi(-a), dv/dvar = g(a) - a h(a) Phi(-a).
At var == 0 they are the limits var -> 0+: dm/dmu = relu'(mu) (jax's convention, 0 at mu = 0),
dm/dvar = 0 (the true derivative is +inf at mu == 0 only), dv/dmu = 0, dv/dvar = 1 for mu > 0,
0 for mu < 0 and g(0) = (pi - 1) / (2 pi) at mu == 0. So gradients of a moment-matched critic at
zero input variance equal the plain critic's. Forward and reverse mode use the same rule but may
differ in the last bit (XLA:CPU fuses a * b + c into one FMA where both land in one loop).

Cost (benchmarks/bench_moments.txt, 2-core CPU, XLA:CPU): mm_relu costs less than the textbook
formula (0.19 vs 0.24 ms on [256, 256]); a moment-matched [256, 256] critic forward at batch 256
costs 2.1x a plain forward (the variance matmuls double the matmul cost), vs 1.7x for 2 Monte
Carlo samples and 6x for 10. A MOMBO lcb training step costs 1.34x a SAC step, of which 1.21x
would remain with a free mm_relu (the variance matmuls of the target and of the actor loss, and
the actor gradient through the variance path). What the float32 cost is made of: XLA:CPU neither
merges loop fusions nor computes several outputs in one loop, so a division, sqrt or exp whose
result several outputs use is written to memory once and read back by each; the float32 path has
four of those (s, t, 1 / D, phi), and the cheap rest (Horner, products, selects) is recomputed in
each output's loop.
"""
import math
import numbers

import chex
import jax
import jax.numpy as jnp
import numpy as np

# float64: c2(t) (see the module docstring) is a Chebyshev series in x = t / (t + _CHEB_BETA) on
# [0, _T_MAX]: F(x) = c2(t) (t + _CHEB_BETA) / 2 is smooth and in [1, 2.51] there. Interpolated at
# 31 Chebyshev nodes with 50-digit mpmath by `_c2_chebyshev_coefficients()` (a test checks this
# table against it); |error| <= 1.1e-16 relative over the interval.
_CHEB_BETA = 4.0
_CHEB_C2 = (
    1.7874814393937943, -0.7568628416478094, -0.0005726626513682525, 0.03646005872604545,
    -0.003031916155298023, -0.002187420818103348, 0.00032567894608380703,
    0.00014765878563312453, -2.9090144972555503e-05, -1.080403674365e-05,
    2.433245187787801e-06, 8.385032167993441e-07, -1.950537659245627e-07,
    -6.774534398473072e-08, 1.501512442321348e-08, 5.594156490307625e-09,
    -1.1034979472855739e-09, -4.6410450424427966e-10, 7.660853449692193e-11,
    3.8120330974632255e-11, -4.946900172789272e-12, -3.0650635913041337e-12,
    2.9039046469010194e-13, 2.394527857918954e-13, -1.4914753084231017e-14,
    -1.8123111248305132e-14, 6.182446210489748e-16, 1.3326309441369216e-15,
    -1.5510947567219584e-17, -9.56637033253096e-17, -4.9451230123468225e-19)
# float32: c2(t) = P(t) / Q(t) with deg P = 5, deg Q = 6 (c2 ~ 2 / t at large t), the
# relative-error minimax fit on [0, _C2_RATIONAL_T_MAX] made by `_c2_rational_coefficients()` (a
# test re-fits it and checks this table against mpmath): |error| <= 5.3e-10 relative, 0.004 of a
# float32 ulp. Every coefficient is positive, so Horner's rule in t >= 0 adds no cancellation.
# Beyond t = 24 every float32 tail term has underflowed (phi(24) e^43 < 1e-106), so the fit's
# range ends there; past it P / Q stays positive and finite, and only multiplies zeros.
# One rational of this size costs ~12 multiply-adds and a division, a third of the 17-term
# Clenshaw recurrence it replaces (the float32 mm_relu is ~2x cheaper for it).
_C2_RATIONAL_T_MAX = 24.0
_C2_P32 = (1.253314136655064, 0.8578294489420426, 0.31038686565574874, 0.06806645173816277,
           0.00898560084031303, 0.000587260224040492)
_C2_Q32 = (1.0, 1.0269038240831498, 0.5285252343737636, 0.16860690049671906, 0.03491677238273854,
           0.004492737479182622, 0.0002936307604228458)
# Beyond this |a| every tail term has underflowed in both dtypes (phi(64) ~ 1e-890), so |a| is
# clipped there; the series covers exactly [0, _T_MAX].
_T_MAX = 64.0
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_G0 = (math.pi - 1.0) / (2.0 * math.pi)   # g(0) = Var[max(0, Z)], Z ~ N(0, 1)


def mm_linear(mean, var, kernel, bias, product=None):
  """Diagonal Gaussian N(mean, var) through y = x @ kernel + bias.

  Args:
    mean, var: [..., I] input mean and variance.
    kernel: [I, O]; bias: [O].
    product: product(x [..., I], kernel) -> [..., O] for the mean (default x @ kernel): pass the
      plain layer's own product (e.g. critics.matmul) so that zero variance reproduces it, its
      gradients included.
  Returns:
    (mean [..., O], var [..., O]); mean is computed as in the plain layer (same ops), so zero
    variance reproduces the plain output bit for bit.
  """
  chex.assert_equal_shape([mean, var])
  chex.assert_rank(kernel, 2)
  chex.assert_shape(bias, (kernel.shape[1],))
  mean_out = mean @ kernel if product is None else product(mean, kernel)
  return mean_out + bias, var @ (kernel * kernel)


def _compute_dtype(dtype):
  """float32/float64 compute as themselves; half precision is computed in float32."""
  return np.dtype(np.float64) if dtype == np.float64 else np.dtype(np.float32)


def _c2_chebyshev_coefficients(num_terms=len(_CHEB_C2), dps=50):
  """Re-derive _CHEB_C2 (needs mpmath; used by the tests, never at run time).

  Interpolates F(x) = c2(t) (t + beta) / 2, x = t / (t + beta), at num_terms Chebyshev nodes of
  [0, x(_T_MAX)], with c2 from mpmath's ncdf (t < 5) or a 600-term continued fraction (t >= 5).
  """
  import mpmath as mp  # not an install dependency: tests only
  with mp.workdps(dps):
    beta = mp.mpf(_CHEB_BETA)
    x_max = mp.mpf(_T_MAX) / (_T_MAX + beta)

    def c2_of(t):
      if t < 5:
        c1 = mp.npdf(t) / mp.ncdf(-t) - t
        return 1 / c1 - t
      c = mp.mpf(0)
      for k in range(600, 1, -1):
        c = k / (t + c)
      return c

    nodes = [(j + mp.mpf(1) / 2) * mp.pi / num_terms for j in range(num_terms)]
    values = []
    for theta in nodes:
      x = (mp.cos(theta) + 1) / 2 * x_max
      t = beta * x / (1 - x)
      values.append(c2_of(t) * (t + beta) / 2)
    coef = [2 * mp.fsum(f * mp.cos(k * th) for f, th in zip(values, nodes)) / num_terms
            for k in range(num_terms)]
    coef[0] /= 2
    return [float(c) for c in coef]


def _c2_chebyshev(t):
  """c2(t) for 0 <= t <= _T_MAX from the float64 Chebyshev series, in numpy (no jax)."""
  t = np.asarray(t, np.float64)
  y = (2.0 * (_T_MAX + _CHEB_BETA) / _T_MAX) * (t / (t + _CHEB_BETA)) - 1.0
  return 2.0 * np.polynomial.chebyshev.chebval(y, np.asarray(_CHEB_C2)) / (t + _CHEB_BETA)


def _c2_rational_coefficients(num_degree=5, den_degree=6, t_max=_C2_RATIONAL_T_MAX,
                              iterations=100, points=4000):
  """Re-derive (_C2_P32, _C2_Q32) (numpy only; used by the tests, never at run time).

  Minimises max |P / (Q c2) - 1| on `points` Chebyshev nodes of [0, t_max] by Lawson's
  iteratively reweighted linear least squares on P - c2 Q (weights 1 / (c2 Q_previous)), with
  the float64 series as the reference c2. Returns (p, q, max relative error on the nodes); p and q
  are monomial coefficients in t, lowest degree first, normalised to q[0] = 1.
  """
  x = 0.5 - 0.5 * np.cos(np.linspace(0.0, np.pi, points))
  c2 = _c2_chebyshev(x * t_max)
  vander_p = np.polynomial.chebyshev.chebvander(2.0 * x - 1.0, num_degree)
  vander_q = np.polynomial.chebyshev.chebvander(2.0 * x - 1.0, den_degree)
  weights, q_prev, best = np.ones_like(x), np.ones_like(x), None
  for _ in range(iterations):
    lhs = np.hstack([vander_p, -c2[:, None] * vander_q[:, 1:]]) / (c2 * q_prev)[:, None]
    rhs = vander_q[:, 0] / q_prev
    root = np.sqrt(weights)
    sol = np.linalg.lstsq(lhs * root[:, None], rhs * root, rcond=None)[0]
    cp, cq = sol[:num_degree + 1], np.concatenate([[1.0], sol[num_degree + 1:]])
    q_prev = vander_q @ cq
    err = (vander_p @ cp) / (q_prev * c2) - 1.0
    if best is None or np.max(np.abs(err)) < best[0]:
      best = (np.max(np.abs(err)), cp, cq)
    weights = weights * np.abs(err)
    weights /= weights.sum()
  max_err, cp, cq = best
  to_monomial = lambda c: np.polynomial.Chebyshev(c, domain=[0.0, t_max]).convert(  # noqa: E731
      kind=np.polynomial.Polynomial).coef
  p, q = to_monomial(cp), to_monomial(cq)
  return p / q[0], q / q[0], float(max_err)


def _horner(coef, t):
  """sum_k coef[k] t^k (coef lowest degree first)."""
  acc = jnp.full_like(t, coef[-1])
  for c in coef[-2::-1]:
    acc = acc * t + c
  return acc


def _tail_factors(t, dtype):
  """A = 1 - t R(t) and c2 A (both in (0, 1], see the module docstring) for 0 <= t <= _T_MAX.

  float32: c2 = P / Q, so A = 1 / (t (t + c2) + 1) = Q / D and c2 A = P / D with
  D = t (t Q + P) + Q, a sum of positive terms: one division for both.
  float64: c2 from the Chebyshev series (Clenshaw), then A = 1 / (t (t + c2) + 1).
  """
  if np.dtype(dtype) == np.float32:
    p = _horner(_C2_P32, t)
    q = _horner(_C2_Q32, t)
    inv_d = 1.0 / (t * (t * q + p) + q)
    return q * inv_d, p * inv_d
  inv = 1.0 / (t + _CHEB_BETA)
  y = (2.0 * (_T_MAX + _CHEB_BETA) / _T_MAX) * (t * inv) - 1.0   # x mapped onto [-1, 1]
  b1 = jnp.zeros_like(t)
  b2 = jnp.zeros_like(t)
  for c in _CHEB_C2[:0:-1]:
    b1, b2 = 2.0 * y * b1 - b2 + c, b1
  c2 = 2.0 * (y * b1 - b2 + _CHEB_C2[0]) * inv
  a_tail = 1.0 / (t * (t + c2) + 1.0)
  return a_tail, c2 * a_tail


def _mm_relu_parts(mean, var):
  """Moments and partial derivatives of relu(X), X ~ N(mean, var); same-shape, same-dtype arrays.

  Returns m, v, dm_dmean, dm_dvar, dv_dmean, dv_dvar (all the shape of mean). Under jit only the
  parts that are used get computed (the jvp rule asks for all six; XLA drops the rest).
  """
  dtype = mean.dtype
  finfo = np.finfo(dtype)
  shift = float(np.floor(-0.5 * np.log(finfo.tiny)))   # 43 (float32), 354 (float64)
  t_big = math.sqrt(2.0 * shift)
  unshift = float(np.exp(-shift))                      # a normal number in the dtype

  pos = var > 0
  # var where pos; elsewhere any positive stand-in works (those lanes are selected away below), and
  # a max is one operand fewer than a select, which lets XLA fuse it instead of writing it out.
  var_s = jnp.maximum(var, finfo.tiny)
  s = jnp.sqrt(var_s)
  # s >= sqrt(tiny) > tiny, so the max is a no-op; it stops XLA from rewriting mean / sqrt(var) as
  # mean * rsqrt(var) (when nothing else uses s), which on CPU is ~10x slower and less accurate.
  a = mean / jnp.maximum(s, finfo.tiny)
  right = mean > 0
  # t = |a|, written as a select on the same `right` that picks the branch below: at mean == 0 the
  # left (mu <= 0) formulas run, and their t must then move as -a. jnp.abs's derivative at 0 is +1,
  # which flipped the sign of every second derivative there (the jvp rule is itself differentiated).
  t = jnp.minimum(jnp.where(right, a, -a), _T_MAX)
  a_tail, ca = _tail_factors(t, dtype)               # A and c2 A
  big = t > t_big
  phi_s = jnp.exp(jnp.where(big, shift, 0.0) - 0.5 * t * t) * _INV_SQRT_2PI   # phi(t) / scale
  scale = jnp.where(big, unshift, 1.0).astype(dtype)
  hn = (phi_s * a_tail) * scale                     # h(-t)
  relu = jax.nn.relu(mean)
  zero = jnp.zeros_like(mean)
  # E[Y] = max(mu, 0) + s h(-t) on both sides (mu > 0: Y = X + max(0, -X)); a non-negative term
  # added to relu(mu) gives Lemma 1 (ii) exactly. Products of positive factors, ordered so that
  # nothing underflows before the result does.
  m = jnp.where(pos, relu + ((s * a_tail) * phi_s) * scale, relu)
  # mu <= 0: Var[Y] = var phi A (c2 - h(-t)); mu > 0: var (1 - T), T = h(-t) (c2 + h(-t) + 2 t).
  ad = ca - a_tail * hn                             # A (c2 - h(-t)) > 0
  v_neg = ((var_s * ad) * phi_s) * scale
  g_pos = jnp.maximum(1.0 - (phi_s * (ca + a_tail * (hn + 2.0 * t))) * scale, 0.0)
  v = jnp.where(right, var_s * g_pos, v_neg)
  # Lemma 1 (ii) m >= max(mu, 0) and (iii) 0 <= v <= var, clamped last so that they hold in
  # floating point on every backend by construction: no-ops in exact math, and on this CPU (m is
  # relu(mu) plus a non-negative term, v <= var_s). Against var itself, not var_s: a GPU keeps
  # subnormal inputs (XLA:CPU flushes them to 0, so pos is False there), and var_s = max(var, tiny)
  # then exceeds var; at mu = 1, var = 1e-38 v was tiny > var (the 2026-11-27 H100 record's float32
  # failure). A NaN variance stays visible instead of reading as 0.
  m = jnp.maximum(m, relu)
  v = jnp.where(pos, jnp.clip(v, 0.0, var), jnp.where(jnp.isnan(var), var, zero))

  # Partial derivatives (closed form; see the module docstring).
  q_t = (phi_s * (t * a_tail + ca)) * scale          # Q(t) = phi(t) R(t), R = (t + c2) A
  cdf_a = jnp.where(right, 1.0 - q_t, q_t)           # Phi(a)
  sf_a = jnp.where(right, q_t, 1.0 - q_t)            # Phi(-a)
  dm_dmean = cdf_a
  dm_dvar = (phi_s / (2.0 * s)) * scale
  dv_dmean = (m * sf_a) * 2.0        # not 2 * m first: that overflows for m near the max
  dv_dvar = jnp.where(right, g_pos - t * (t + hn) * q_t,
                      (phi_s * ad) * scale + t * hn * (1.0 - q_t))

  # var == 0 (or negative): exactly the plain ReLU, and the var -> 0+ limits of the derivatives.
  one = jnp.ones_like(mean)
  step = jnp.where(mean > 0, one, zero)
  dm_dmean = jnp.where(pos, dm_dmean, step)
  dm_dvar = jnp.where(pos, dm_dvar, zero)
  dv_dmean = jnp.where(pos, dv_dmean, zero)
  dv_dvar = jnp.where(pos, dv_dvar, jnp.where(mean == 0, jnp.full_like(mean, _G0), step))
  return m, v, dm_dmean, dm_dvar, dv_dmean, dv_dvar


@jax.custom_jvp
def _mm_relu(mean, var):
  return _mm_relu_parts(mean, var)[:2]


@_mm_relu.defjvp
def _mm_relu_jvp(primals, tangents):
  mean, var = primals
  d_mean, d_var = tangents
  m, v, dm_dmean, dm_dvar, dv_dmean, dv_dvar = _mm_relu_parts(mean, var)
  return (m, v), (dm_dmean * d_mean + dm_dvar * d_var, dv_dmean * d_mean + dv_dvar * d_var)


def mm_relu(mean, var):
  """Mean and variance of relu(X), X ~ N(mean, var), elementwise (paper Lemma 1 (i)).

  Args:
    mean, var: arrays (or scalars) that broadcast against each other, like jnp; var >= 0.
  Returns:
    (m, v), both of the broadcast shape and of the inputs' floating dtype (integers promote to
    the default float; float16/bfloat16 are computed in float32). var == 0 gives exactly
    (relu(mean), 0). Works under jit, vmap and grad (closed-form custom_jvp).
  """
  mean = jnp.asarray(mean)
  var = jnp.asarray(var)
  dtype = jnp.result_type(mean, var, float)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"mm_relu takes real inputs, got dtype {dtype}; pass float arrays.")
  mean, var = jnp.broadcast_arrays(mean.astype(dtype), var.astype(dtype))
  work = _compute_dtype(dtype)
  m, v = _mm_relu(mean.astype(work), var.astype(work))
  return m.astype(dtype), v.astype(dtype)


def mm_leaky_relu(mean, var, negative_slope: float = 0.01):
  """Mean and variance of leaky_relu(X) = relu(X) - slope * relu(-X), X ~ N(mean, var).

  relu(X) relu(-X) = 0, so Cov(relu(X), relu(-X)) = -E relu(X) E relu(-X) and
  Var = v(mu) + slope^2 v(-mu) + 2 slope m(mu) m(-mu): a sum of non-negative terms. var == 0
  gives relu(mu) - slope * relu(-mu), equal to jax.nn.leaky_relu except for the sign of zero.
  For a slope in [0, 1] (a Python number) Lemma 1's bounds hold exactly, as mm_relu's: m >=
  leaky_relu(mu) and 0 <= v <= var.
  """
  mean = jnp.asarray(mean)
  mp, vp = mm_relu(mean, var)
  mn, vn = mm_relu(-mean, var)
  m = mp - negative_slope * mn
  # The cross term as 2 slope (mp mn): mp mn <= sqrt(vp vn) <= var (a covariance bound), while
  # (2 slope mp) alone overflows at mu near the float's max and then times mn = 0 made a NaN.
  v = vp + negative_slope**2 * vn + (2.0 * negative_slope) * (mp * mn)
  if isinstance(negative_slope, numbers.Real) and 0.0 <= negative_slope <= 1.0:
    # Such a leaky_relu is convex and 1-Lipschitz: E f(X) >= f(mu) (Jensen) and Var f(X) <= Var X
    # (Var f(X) = E (f(X) - f(X'))^2 / 2 for an independent copy X'). In floating point m - slope
    # mn can round below f(mu) and the three terms' sum above var (vp alone may equal var), so both
    # are clamped last, as in mm_relu: no-ops in exact math. var < 0 counts as 0 (mm_relu's rule);
    # NaN stays NaN.
    relu = jax.nn.relu
    m = jnp.maximum(m, (relu(mean) - negative_slope * relu(-mean)).astype(m.dtype))
    v = jnp.minimum(v, jnp.maximum(jnp.asarray(var, v.dtype), 0.0))
  return m, v


def mm_identity(mean, var):
  """The identity activation: moments pass through."""
  return jnp.asarray(mean), jnp.asarray(var)


# Activation name -> moment function (mean, var) -> (mean, var). ReLU is the one MOMBO uses.
ACTIVATION_MOMENTS = {
    "relu": mm_relu,
    "leaky_relu": mm_leaky_relu,
    "identity": mm_identity,
}
