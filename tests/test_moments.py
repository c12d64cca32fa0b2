"""mm_relu / mm_linear / mc_moments: exactness at zero variance, Lemma 1, accuracy against an
arbitrary-precision (mpmath) reference, gradients, transformations and broadcasting.

float64 cases run inside `jax.enable_x64(True)` so the rest of the suite keeps float32 defaults.
"""
import functools
import zlib

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp
from jax.test_util import check_grads

import mombo_jax
from mombo_jax.moment_matching import moments
from mombo_jax.moment_matching.moments import ACTIVATION_MOMENTS, mm_leaky_relu, mm_linear, mm_relu
from mombo_jax.moment_matching.monte_carlo import mc_moments

DTYPES = [np.float32, np.float64]
MP_DIGITS = 80   # enough for the reference's own cancellation (~|a|^4 ~ 1e16 at |a| = 1e4)


def _x64(dtype):
  """Context in which `dtype` is available (float64 needs x64; float32 runs unchanged)."""
  return jax.enable_x64(dtype == np.float64)


_MM_JIT = jax.jit(mm_relu)   # one compilation per dtype (the x64 flag is part of the cache key)


# leaky_relu's at a slope in (0, 1) and at the ends of [0, 1], where its bounds hold exactly too.
_LEAKY_JIT = {slope: jax.jit(functools.partial(mm_leaky_relu, negative_slope=slope))
              for slope in (0.0, 0.01, 1.0)}


def _mm(mean, var, fn=_MM_JIT):
  mean = np.asarray(mean)
  with _x64(mean.dtype.type):
    m, v = fn(jnp.asarray(mean), jnp.asarray(var, mean.dtype))
    return np.asarray(m), np.asarray(v)


def _leaky_lower_bound(mean, slope):
  """leaky_relu(mean) as XLA computes it (subnormal inputs flushed to zero on CPU)."""
  flushed = np.where(np.abs(mean) < np.finfo(mean.dtype).tiny, 0, mean)
  return np.maximum(flushed, 0) - mean.dtype.type(slope) * np.maximum(-flushed, 0)


def _assert_lemma1_bounds(mu, var):
  """Lemma 1 (ii) and (iii) exactly, no tolerance: mm_relu and mm_leaky_relu clamp to them last,
  so they hold in floating point on every backend (a GPU keeps subnormal inputs, which XLA:CPU
  flushes; moments.py). The lower bounds are relu / leaky_relu as XLA computes them."""
  m, v = _mm(mu, var)
  assert np.all(np.isfinite(m)) and np.all(np.isfinite(v))
  assert np.all(m >= _relu_lower_bound(mu))                       # Lemma 1 (ii)
  assert np.all((v >= 0) & (v <= var))                            # Lemma 1 (iii)
  for slope, fn in _LEAKY_JIT.items():
    m, v = _mm(mu, var, fn)
    assert np.all(np.isfinite(m)) and np.all(np.isfinite(v)), slope
    assert np.all(m >= _leaky_lower_bound(mu, slope)), slope      # Jensen: convex for slope <= 1
    assert np.all((v >= 0) & (v <= var)), slope                   # 1-Lipschitz for slope <= 1


def _mp_moments(mu, var):
  """Lemma 1 (i) at the exact float inputs, evaluated with MP_DIGITS digits."""
  with mpmath.workdps(MP_DIGITS):
    mu, var = mpmath.mpf(float(mu)), mpmath.mpf(float(var))
    s = mpmath.sqrt(var)
    a = mu / s
    cdf, pdf = mpmath.ncdf(a), mpmath.npdf(a)
    m = mu * cdf + s * pdf
    v = (mu * mu + var) * cdf + mu * s * pdf - m * m
    return float(m), float(v)


EXTREME_MEANS = [0.0, -0.0, 1e-30, -1e-30, 1e-3, -1e-3, 1.0, -1.0, 1e4, -1e4, 1e15, -1e15, 3e38,
                 -3e38]
EXTREME_VARS = [0.0, 1e-38, 1e-30, 1e-10, 1e-3, 1.0, 1e4, 1e10, 3e38]


def _relu_lower_bound(mean):
  """max(mean, 0) as XLA computes it: CPU XLA flushes subnormal inputs to zero (so does the plain
  network's relu), so a subnormal mean acts as 0."""
  return np.where(np.abs(mean) < np.finfo(mean.dtype).tiny, 0, np.maximum(mean, 0))


def _extreme_grid(dtype):
  means, variances = EXTREME_MEANS, EXTREME_VARS
  if dtype == np.float64:
    means = means + [1e300, -1e300, 1e-300, -1e-300]
    variances = variances + [1e-300, 1e300]
  mu, var = np.meshgrid(np.asarray(means, dtype), np.asarray(variances, dtype))
  return mu.ravel(), var.ravel()


def test_package_exports_mm_relu():
  assert mombo_jax.mm_relu is mm_relu
  assert ACTIVATION_MOMENTS["relu"] is mm_relu


@pytest.mark.parametrize("dtype", DTYPES)
def test_zero_variance_is_relu_bit_for_bit(dtype):
  rng = np.random.default_rng(0)
  mean = np.concatenate([np.asarray(EXTREME_MEANS, dtype),
                         (rng.normal(size=50) * 10.0 ** rng.uniform(-20, 20, 50)).astype(dtype)])
  with _x64(dtype):
    relu = np.asarray(jax.nn.relu(jnp.asarray(mean)))
  m, v = _mm(mean, np.zeros_like(mean))
  assert m.dtype == dtype
  np.testing.assert_array_equal(m.view(np.uint8), relu.view(np.uint8))   # bit for bit
  np.testing.assert_array_equal(v.view(np.uint8), np.zeros_like(v).view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_lemma1_bounds_and_finiteness_on_extremes(dtype):
  mu, var = _extreme_grid(dtype)
  assert np.all(_relu_lower_bound(mu) == np.maximum(mu, 0))   # no subnormal mean in the grid
  _assert_lemma1_bounds(mu, var)


_F32 = dict(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=40, deadline=None)
@given(mean=hnp.arrays(np.float32, 64, elements=st.floats(**_F32)),
       var=hnp.arrays(np.float32, 64, elements=st.floats(min_value=0.0, **_F32)),
       log_scale=st.floats(-30, 10))
def test_lemma1_bounds_random(mean, var, log_scale):
  # Half the entries get |a| = |mean|/std in [1e-4, 1e4] at var ~ 10^log_scale.
  rng = np.random.default_rng(zlib.crc32(mean.tobytes() + np.float64(log_scale).tobytes()))
  var2 = np.float32(10.0 ** log_scale) * rng.uniform(0.5, 2.0, 32).astype(np.float32)
  a = rng.choice([-1, 1], 32) * 10.0 ** rng.uniform(-4, 4, 32)
  mean = np.concatenate([mean[:32], (a * np.sqrt(var2)).astype(np.float32)])
  var = np.concatenate([var[:32], var2])
  for dtype in DTYPES:
    _assert_lemma1_bounds(mean.astype(dtype), var.astype(dtype))


def _reference_grid(dtype):
  """a = mean/std in {0, +-logspace(-4, 4)} x var in logspace(-30, 10), rounded to dtype."""
  a_pos = np.logspace(-4, 4, 25)
  a = np.concatenate([-a_pos[::-1], [0.0], a_pos])
  a, var = np.meshgrid(a, np.logspace(-30, 10, 9), indexing="ij")
  return (a * np.sqrt(var)).astype(dtype).ravel(), var.astype(dtype).ravel()


@pytest.mark.parametrize("dtype", DTYPES)
def test_relative_error_against_mpmath(dtype):
  """Tolerance: 2 (16 + t^2) eps, t = |mean|/std.

  16 eps covers the ~30 rounded operations of the evaluation itself (all well conditioned by
  construction); t^2 eps is the conditioning of the problem: a = mean/std rounds with relative
  error <= eps, and phi(a) moves by a relative t^2 times that. The measured worst case on a denser
  grid is 0.84 (16 + t^2) eps (benchmarks/bench_moments.txt); the factor 2 is headroom. The
  textbook formula fails this by orders of magnitude for |a| > ~3. Where the true value is not a
  normal number, the absolute error must stay below the smallest normal (flush or underflow).
  """
  mu, var = _reference_grid(dtype)
  m, v = _mm(mu, var)
  ref = np.array([_mp_moments(x, y) for x, y in zip(mu, var)])
  got = np.stack([m, v], 1).astype(np.float64)
  finfo = np.finfo(dtype)
  t2 = (mu.astype(np.float64) ** 2 / var.astype(np.float64))[:, None]
  normal = ref >= finfo.tiny
  rel = np.abs(got - ref) / np.where(normal, ref, 1.0)
  tol = 2.0 * (16.0 + t2) * finfo.eps
  bad = normal & (rel > tol)
  assert not bad.any(), (mu[bad.any(1)], var[bad.any(1)], rel[bad])
  assert np.all(np.abs(got - ref)[~normal] <= finfo.tiny)
  # The grid really covers the hard regimes: both tails with normal results, and underflow.
  assert normal[t2[:, 0] > 100].any() and (~normal).any()


def _jacobian(mu, var):
  """[N, 2 outputs, 2 inputs] forward- and reverse-mode Jacobians of (m, v) w.r.t. (mean, var)."""
  f = lambda x, y: jnp.stack(mm_relu(x, y))  # noqa: E731
  fwd = jax.vmap(jax.jacfwd(f, argnums=(0, 1)))(mu, var)
  rev = jax.vmap(jax.jacrev(f, argnums=(0, 1)))(mu, var)
  return jnp.stack(fwd, -1), jnp.stack(rev, -1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_finite_everywhere_including_zero_variance(dtype):
  mu, var = _extreme_grid(dtype)
  with _x64(dtype):
    fwd, rev = jax.jit(_jacobian)(jnp.asarray(mu), jnp.asarray(var))
    fwd, rev = np.asarray(fwd), np.asarray(rev)
  assert np.all(np.isfinite(fwd)) and np.all(np.isfinite(rev))
  # Same closed-form rule both ways; XLA:CPU contracts a * b + c into one FMA inside a fusion, and
  # the jacfwd and jacrev programs fuse it differently, so they may differ in the last bit.
  np.testing.assert_allclose(fwd, rev, rtol=4 * np.finfo(dtype).eps, atol=0)
  # At var == 0: the var -> 0+ limits (and relu's own derivative in the mean).
  zero = var == 0
  np.testing.assert_array_equal(fwd[zero, 0, 0], (mu[zero] > 0).astype(dtype))     # dm/dmean
  np.testing.assert_array_equal(fwd[zero, 0, 1], 0)                                # dm/dvar
  np.testing.assert_array_equal(fwd[zero, 1, 0], 0)                                # dv/dmean
  expect = np.where(mu[zero] > 0, 1.0, np.where(mu[zero] < 0, 0.0, (np.pi - 1) / (2 * np.pi)))
  np.testing.assert_allclose(fwd[zero, 1, 1], expect, rtol=1e-6)                  # dv/dvar


def test_gradients_against_mpmath_and_finite_differences():
  """float64: closed-form derivatives vs mpmath's numerical derivatives, and check_grads."""
  points = [(a * np.sqrt(var), var) for a in (-30.0, -8.0, -1.5, -0.2, 0.0, 0.3, 2.0, 9.0)
            for var in (1e-4, 2.0)]
  mu, var = np.array(points).T
  with jax.enable_x64(True):
    fwd, _ = jax.jit(_jacobian)(jnp.asarray(mu), jnp.asarray(var))
    fwd = np.asarray(fwd)
    with mpmath.workdps(40):
      for (x, y), jac in zip(points, fwd):
        def mom(k, xx, yy):
          s = mpmath.sqrt(yy)
          c, p = mpmath.ncdf(xx / s), mpmath.npdf(xx / s)
          m = xx * c + s * p
          return m if k == 0 else (xx * xx + yy) * c + xx * s * p - m * m
        x, y = mpmath.mpf(x), mpmath.mpf(y)
        ref = np.array([[float(mpmath.diff(lambda u: mom(k, u, y), x)),
                         float(mpmath.diff(lambda u: mom(k, x, u), y))] for k in range(2)])
        np.testing.assert_allclose(jac, ref, rtol=1e-11, atol=1e-300)
    # Finite differences (order 2 covers the jvp of the custom jvp rule too).
    loss = jax.jit(lambda x, y: jnp.sum(jnp.stack(mm_relu(x, y)) * jnp.array([[1.0], [0.7]])))
    check_grads(loss, (jnp.array([-1.3, 0.2, 0.0, 2.5]), jnp.array([0.5, 1.0, 2.0, 0.3])), order=1,
                modes=("fwd", "rev"))


def test_float32_agrees_with_float64_on_moderate_inputs():
  rng = np.random.default_rng(1)
  var = (10.0 ** rng.uniform(-3, 3, 200)).astype(np.float32)
  mu = (rng.uniform(-8, 8, 200) * np.sqrt(var)).astype(np.float32)
  m32, v32 = _mm(mu, var)
  m64, v64 = _mm(mu.astype(np.float64), var.astype(np.float64))
  tol = 2.0 * (16.0 + mu.astype(np.float64) ** 2 / var) * np.finfo(np.float32).eps
  assert np.all(np.abs(m32 - m64) <= tol * m64)
  assert np.all(np.abs(v32 - v64) <= tol * v64)


def test_jit_vmap_grad_and_broadcasting():
  rng = np.random.default_rng(2)
  mean = jnp.asarray(rng.normal(size=(3, 1)), jnp.float32)
  var = jnp.asarray(rng.uniform(0.0, 2.0, size=(4,)), jnp.float32).at[0].set(0.0)
  mb, vb = jnp.broadcast_arrays(mean, var)
  loss = lambda x, y: jnp.sum(mm_relu(x, y)[0] + 0.5 * mm_relu(x, y)[1])  # noqa: E731

  @jax.jit
  def everything(mean, var, mb, vb):
    return (mm_relu(mean, var), mm_relu(mb, vb),
            jax.vmap(mm_relu, in_axes=(None, 0))(mean[:, 0], var),         # [4, 3]
            jax.grad(loss, argnums=(0, 1))(mean, var), jax.grad(loss, argnums=(0, 1))(mb, vb))

  (m, v), (m_ref, v_ref), (vm, vv), (g_mean, g_var), (gb_mean, gb_var) = everything(mean, var,
                                                                                    mb, vb)
  assert m.shape == v.shape == (3, 4) and m.dtype == jnp.float32
  np.testing.assert_array_equal(m, m_ref)
  np.testing.assert_array_equal(v, v_ref)
  # (vmapped code may be fused differently, hence not bit for bit)
  np.testing.assert_allclose(vm.T, m, rtol=1e-6)
  np.testing.assert_allclose(vv.T, v, rtol=1e-6)
  # Gradients w.r.t. a broadcast input are summed over the broadcast axes.
  np.testing.assert_allclose(g_mean, gb_mean.sum(1, keepdims=True), rtol=1e-6)
  np.testing.assert_allclose(g_var, gb_var.sum(0), rtol=1e-6)
  assert np.all(np.isfinite(g_var))
  # Eager (no jit) gives the same numbers.
  em, ev = mm_relu(mean[:2], var[:2])
  np.testing.assert_allclose(em, m[:2, :2], rtol=1e-6)
  np.testing.assert_allclose(ev, v[:2, :2], rtol=1e-6)
  # Scalars, Python numbers and integers promote like jnp.
  ms, vs = jax.jit(mm_relu)(1, 2.0)
  assert ms.shape == () and ms.dtype == jnp.float32
  np.testing.assert_allclose([ms, vs], [float(x) for x in _mp_moments(1.0, 2.0)], rtol=1e-6)
  with pytest.raises(TypeError, match="real inputs"):
    mm_relu(jnp.ones(2, jnp.complex64), jnp.ones(2))


def test_mm_linear_is_exact_for_a_linear_map():
  rng = np.random.default_rng(3)
  mean = rng.normal(size=(5, 7)).astype(np.float32)
  var = rng.uniform(0, 2, size=(5, 7)).astype(np.float32)
  kernel = rng.normal(size=(7, 3)).astype(np.float32)
  bias = rng.normal(size=3).astype(np.float32)
  m, v = mm_linear(jnp.asarray(mean), jnp.asarray(var), jnp.asarray(kernel), jnp.asarray(bias))
  k64 = kernel.astype(np.float64)
  cov = np.einsum("io,bi,ip->bop", k64, var.astype(np.float64), k64)   # K^T diag(var) K
  np.testing.assert_allclose(m, mean.astype(np.float64) @ k64 + bias, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(v, np.diagonal(cov, axis1=1, axis2=2), rtol=1e-5)
  # The mean is computed exactly as the plain layer, so zero variance reproduces it bit for bit.
  np.testing.assert_array_equal(m, jnp.asarray(mean) @ jnp.asarray(kernel) + jnp.asarray(bias))
  with pytest.raises(AssertionError):
    mm_linear(jnp.asarray(mean), jnp.asarray(var[:, :3]), jnp.asarray(kernel), jnp.asarray(bias))


def test_mc_moments_combines_chunks_exactly():
  """n not a multiple of the chunk: the Chan combination equals the moments of the same samples."""
  key = jax.random.PRNGKey(4)
  mean, var = jnp.array([0.5, -1.0]), jnp.array([2.0, 0.1])
  fn = lambda x: jnp.stack([jax.nn.relu(x[0]), x[0] * x[1]])  # noqa: E731
  n, chunk = 10, 4
  mu, var_out = mc_moments(fn, mean, var, key, n, chunk_size=chunk)
  draw = lambda i: jax.random.normal(jax.random.fold_in(key, i), (chunk, 2))  # noqa: E731
  xs = mean + jnp.sqrt(var) * jax.jit(jax.vmap(draw))(jnp.arange(3)).reshape(-1, 2)
  ys = jax.vmap(fn)(xs[:n])
  np.testing.assert_allclose(mu, ys.mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(var_out, ys.var(0), rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="n >= 1"):
    mc_moments(fn, mean, var, key, 0)


def test_mc_moments_million_samples_matches_mm_relu():
  """1e6 samples of relu(X) (default chunking): within 6 standard errors of the exact moments."""
  n = 1_000_000
  mean = jnp.array([-2.0, -0.3, 0.0, 0.4, 3.0])
  var = jnp.array([1.0, 0.5, 2.0, 0.1, 4.0])
  m, v = jax.jit(mm_relu)(mean, var)
  fn = lambda x: (jax.nn.relu(x), (jax.nn.relu(x) - m) ** 2)  # noqa: E731
  (mc_m, mc_z), (mc_v, mc_zv) = mc_moments(fn, mean, var, jax.random.PRNGKey(5), n)
  mc_var = mc_z - (mc_m - m) ** 2
  assert np.all(np.abs(mc_m - m) <= 6 * np.sqrt(mc_v / n))
  assert np.all(np.abs(mc_var - v) <= 6 * np.sqrt(mc_zv / n))
  np.testing.assert_allclose(mc_v, mc_var, rtol=1e-4)


def test_leaky_relu_moments():
  slope = 0.1
  mean = jnp.array([-3.0, -0.5, 0.0, 0.5, 3.0])
  leaky = jax.jit(functools.partial(mm_leaky_relu, negative_slope=slope))
  m0, v0 = leaky(mean, jnp.zeros(5))
  np.testing.assert_array_equal(m0, jax.nn.leaky_relu(mean, slope))
  np.testing.assert_array_equal(v0, 0.0)
  var = jnp.array([1.0, 2.0, 0.5, 0.3, 1.5])
  m, v = leaky(mean, var)
  n = 200_000
  fn = lambda x: jax.nn.leaky_relu(x, slope)  # noqa: E731
  mc_m, mc_v = mc_moments(fn, mean, var, jax.random.PRNGKey(6), n)
  assert np.all(np.abs(mc_m - m) <= 6 * np.sqrt(mc_v / n))
  # Var of the sample variance <= E[(Y - mu)^4] / n; (Y - mu)^4 <= (X - mu')^4 bounds give
  # 3 var^2 for a Gaussian, an upper bound for this 1-Lipschitz map.
  assert np.all(np.abs(mc_v - v) <= 6 * np.sqrt(3 * var**2 / n))


def test_chebyshev_table_reproduces():
  np.testing.assert_allclose(moments._c2_chebyshev_coefficients(), moments._CHEB_C2, rtol=0,
                             atol=1e-17)


def _c2_mpmath(ts):
  with mpmath.workdps(60):   # c1 = phi/Q - t and c2 = 1/c1 - t each cancel ~t^2: 60 digits spare
    out = []
    for t in ts:
      t = mpmath.mpf(float(t))
      c1 = mpmath.npdf(t) / mpmath.ncdf(-t) - t
      out.append(float(1 / c1 - t))
  return np.asarray(out)


def test_float32_rational_c2_table_is_positive_and_matches_mpmath():
  """The float32 c2 = P / Q as STORED: every coefficient is positive (Horner in t >= 0 then has no
  cancellation), and it agrees with c2 from mpmath far below float32's resolution on the fitted
  range. The refit is ill-conditioned (its coefficients differ between CPUs/BLAS builds by ~1e-4
  relative while fitting equally well), so the test checks what the fit achieves, never its
  digits."""
  assert min(moments._C2_P32) > 0 and min(moments._C2_Q32) > 0
  ts = np.linspace(0.0, moments._C2_RATIONAL_T_MAX, 121)
  ref = _c2_mpmath(ts)
  got = (np.polynomial.polynomial.polyval(ts, moments._C2_P32)
         / np.polynomial.polynomial.polyval(ts, moments._C2_Q32))
  np.testing.assert_allclose(got, ref, rtol=1e-9)
  # The fitting procedure itself still works on this machine: a refit is as accurate (bound well
  # below float32's eps ~1.2e-7, loose enough for any BLAS), whatever coefficients it picks.
  p, q, fit_error = moments._c2_rational_coefficients()
  assert fit_error < 1e-8
  refit = (np.polynomial.polynomial.polyval(ts, p) / np.polynomial.polynomial.polyval(ts, q))
  np.testing.assert_allclose(refit, ref, rtol=1e-8)


@pytest.mark.parametrize("output", [0, 1])
def test_mm_relu_hessian_matches_finite_differences(output):
  """Second derivatives (w.r.t. mean and var, of m and of v) agree with central differences of the
  gradient, at mean == 0 (where jnp.abs's derivative once flipped their sign) and elsewhere."""
  with jax.enable_x64(True):
    def f(x):
      return mm_relu(x[0], x[1])[output]

    hess, grad = jax.jit(jax.hessian(f)), jax.jit(jax.grad(f))
    h = 1e-5
    for point in [(0.0, 1.0), (0.0, 0.3), (1e-9, 2.0), (0.5, 1.0), (-0.7, 0.2), (2.5, 0.5),
                  (-4.0, 0.5), (30.0, 1.0), (-30.0, 1.0)]:
      x = jnp.asarray(point, jnp.float64)
      got = np.asarray(hess(x))
      fd = np.stack([(np.asarray(grad(x + h * e)) - np.asarray(grad(x - h * e))) / (2 * h)
                     for e in np.eye(2)])
      np.testing.assert_allclose(got, fd, rtol=1e-5, atol=1e-7, err_msg=f"at {point}")
      assert np.all(np.isfinite(got))
    # At mean == 0, var == 1: d2m/dmean2 = phi(0) > 0 (Phi's slope), not -phi(0).
    if output == 0:
      assert float(hess(jnp.asarray([0.0, 1.0]))[0, 0]) == pytest.approx(0.3989423, rel=1e-6)
