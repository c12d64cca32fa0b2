"""Cov(relu X) for X ~ N(mean, cov): the full-covariance mode's ReLU rule (full.py).

For two coordinates, a = m / s, rho = C_ij / (s_i s_j), Price's theorem (dCov/dC_ij =
P(X_i > 0, X_j > 0)) with Sheppard's formula for the bivariate normal CDF integrated over rho gives

  Cov(relu X_i, relu X_j) = s_i s_j [rho Phi(a_i) Phi(a_j) + 1/(2 pi) I],
  I = int_0^{asin rho} (rho - sin t) exp(-E(t)) dt,  E(t) = (a_i^2 - 2 a_i a_j sin t + a_j^2)
                                                            / (2 cos^2 t)

(the route of Wu et al., "Deterministic Variational Inference for Robust Bayesian Neural
Networks", ICLR 2019, Sec. 3 and App. A). The diagonal is moments.mm_relu's variance (closed form).
Two ways to evaluate I, the `method` of relu_cov:

  "quadrature" (the default) I by QUAD_NODES-point Gauss-Legendre in t, the exponent written
      without cancellation (relu_cov's docstring). Error against mpmath: at most 5.7e-7 of s_i s_j
      on tests/test_propagate_mc.py's grid (a in [-4, 4], rho in [-1, 1]; largest at |rho| = 1;
      a denser grid with |a| up to 6 gave the same, float32 and float64 alike; asserted <= 1e-6);
      20 nodes gave 3.2e-8, for 8 more exponentials per pair.
  "dvi"   Wu et al.'s closed form: exp(-E) replaced by exp of E's average under the weight
      (rho - sin t), whose three moments are closed form:
        W = int (rho - sin t) dt = rho asin rho - rho^2 / (1 + rhohat),
        int (rho - sin t) / (2 cos^2 t) dt = rho^2 / (2 (1 + rhohat)),
        int (rho - sin t) sin t / cos^2 t dt = asin rho - rho,   rhohat = sqrt(1 - rho^2);
      I ~ W exp(-(rho^2 (a_i^2 + a_j^2) / (2 (1 + rhohat)) - (asin rho - rho) a_i a_j) / W).
      Exact to second order in rho at rho = 0, and where a_i = a_j = 0 (E constant in t); off by
      up to 1.45e-2 of s_i s_j elsewhere (at |rho| near 1 and |a| near 1; the same grid and test).

Cost: per pair of coordinates, "quadrature" evaluates QUAD_NODES exponentials, "dvi" one. Both are
fused by XLA into one pass over the [..., d, d] pairs (the nodes are a Python loop, so nothing of
shape [..., d, d, nodes] is written), and both use series for asin and sin rather than XLA's,
which on CPU cost several exponentials each (XLA's asin goes through atan2).
"""
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from mombo_jax.moment_matching.moments import mm_relu

QUAD_NODES = 12
_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(QUAD_NODES)
_FRACS, _HALF_WEIGHTS = (_NODES + 1.0) / 2.0, _WEIGHTS / 2.0   # nodes on [0, 1]
METHODS = ("quadrature", "dvi")
# |a| beyond this makes every term underflow in float64 (phi(40) ~ 1e-348); clipping keeps
# inf * 0 out of the exponent for near-deterministic coordinates.
_A_MAX = 40.0


def _terms(dtype, big, small):
  """How many series terms reach the dtype's precision: `big` for float64, `small` otherwise."""
  return big if np.dtype(dtype) == np.float64 else small


def _asin(x):
  """(asin x, asin x - x) for |x| <= 1 [...]: a series, the second without cancellation.

  |x| <= 1/2: asin x = x + x^3 P(x^2) (the Taylor series, ratio <= 1/4 per term); beyond,
  asin |x| = pi/2 - 2 asin y with y = sqrt((1 - |x|) / 2) <= 1/2 (1 - |x| is exact there).
  """
  n = _terms(x.dtype, 28, 12)
  coefs = [math.comb(2 * k, k) / (4.0**k * (2 * k + 1)) for k in range(1, n + 1)]
  ax = jnp.abs(x)
  big = ax > 0.5
  y = jnp.where(big, jnp.sqrt((1.0 - ax) / 2.0), ax)
  z = y * y
  p = coefs[-1]
  for c in coefs[-2::-1]:
    p = p * z + c
  r = y * z * p                                      # asin y - y
  asin_abs = jnp.where(big, math.pi / 2 - 2.0 * (y + r), y + r)
  sign = jnp.where(x < 0, -1.0, 1.0).astype(x.dtype)
  return sign * asin_abs, sign * jnp.where(big, asin_abs - ax, r)


def _sin_at(theta, theta2, frac):
  """sin(frac * theta) for |theta| <= pi/2 [...], frac a constant in [0, 1]: its Taylor series."""
  n = _terms(theta.dtype, 12, 7)   # (pi/2)^(2n+1) / (2n+1)!: 1e-18 for 12 terms, 7e-10 for 7
  coefs = [(-1) ** k * float(frac) ** (2 * k + 1) / math.factorial(2 * k + 1) for k in range(n)]
  p = coefs[-1]
  for c in coefs[-2::-1]:
    p = p * theta2 + c
  return p * theta


def _integral(rho, ai, aj, method):
  """I (module docstring) for each pair [..., d, d].

  Quadrature: with u = sin t, a_i^2 - 2 a_i a_j u + a_j^2 = (a_i - a_j)^2 + 2 a_i a_j (1 - u) and
  cos^2 t = (1 - u)(1 + u); u has rho's sign on the whole interval, so with sigma = sign(rho),
  E = ((a_i - sigma a_j)^2 / 2 + sigma a_i a_j (1 - |u|)) / (1 - u^2): no term that must cancel
  is divided by a vanishing 1 -+ u.
  """
  theta, asin_rem = _asin(rho)
  if method == "dvi":
    rhohat1 = 1.0 + jnp.sqrt(1.0 - rho * rho)
    w = rho * theta - rho * rho / rhohat1
    safe = jnp.where(w > 0, w, 1.0)
    expo = (rho * rho * (ai * ai + aj * aj) / (2.0 * rhohat1) - asin_rem * ai * aj) / safe
    return jnp.where(w > 0, w * jnp.exp(-expo), 0.0)
  sign = jnp.where(rho >= 0, 1.0, -1.0).astype(rho.dtype)
  num = 0.5 * (ai - sign * aj) ** 2
  cross = sign * ai * aj
  theta2 = theta * theta
  total = jnp.zeros_like(rho)
  for frac, weight in zip(_FRACS, _HALF_WEIGHTS):
    u = _sin_at(theta, theta2, frac)
    expo = (num + cross * (1.0 - jnp.abs(u))) / (1.0 - u * u)
    total = total + float(weight) * (rho - u) * jnp.exp(-expo)
  return total * theta


def phi_cdf(a):
  return 0.5 * lax.erfc(-a / math.sqrt(2.0))


def relu_cov(mean, cov, method="quadrature"):
  """Cov(relu(X)) [..., d, d] for X ~ N(mean [..., d], cov [..., d, d]) (module docstring).

  method: "quadrature" (QUAD_NODES-point Gauss-Legendre, error <= 5.7e-7 of s_i s_j) or "dvi"
  (Wu et al.'s closed form, error <= 1.45e-2 of s_i s_j). A coordinate of zero variance has zero
  covariance with every other.
  """
  if method not in METHODS:
    raise ValueError(f"relu_cov: method={method!r} is not one of {METHODS}.")
  var = jnp.diagonal(cov, axis1=-2, axis2=-1)
  pos = var > 0
  s = jnp.sqrt(jnp.where(pos, var, 1.0))
  a = jnp.clip(jnp.where(pos, mean / s, 0.0), -_A_MAX, _A_MAX)
  ss = s[..., :, None] * s[..., None, :]
  eye = jnp.eye(var.shape[-1], dtype=bool)
  # |rho| < 1 keeps the derivatives finite (the diagonal, rho = 1, is mm_relu's below); moving
  # rho by eps moves the covariance by at most eps s_i s_j (its derivative in rho is s_i s_j Phi2).
  one = 1.0 - float(np.finfo(mean.dtype).eps)
  rho = jnp.where(eye, 0.0, jnp.clip(cov / ss, -one, one))
  cdf = phi_cdf(a)
  integral = _integral(rho, a[..., :, None], a[..., None, :], method)
  off = ss * (rho * cdf[..., :, None] * cdf[..., None, :] + integral / (2.0 * math.pi))
  off = jnp.where(pos[..., :, None] & pos[..., None, :], off, 0.0)
  _, v = mm_relu(mean, var)
  return jnp.where(eye, v[..., :, None], off)
