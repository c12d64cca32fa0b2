"""Closed-form moments of x ** n and exp(x) for a Gaussian x, the exact rules propagate uses for a
random value raised to a power (x * x, x ** 2, jnp.square, x ** n) or exponentiated.

  power_moments(mean, var, n, plain)  -> (mean, var)   X ~ N(mean, var) elementwise: X ** n, n >= 2
  exp_moments(mean, var, plain_exp)   -> (mean, var)   the lognormal's moments of exp(X)
  square_cov(mean, cov)               -> (mean, cov)   X ~ N(mean [..., d], cov [..., d, d]): X ** 2
  exp_cov(mean, cov)                  -> (mean, cov)   the same for exp(X)

Every formula is a sum of non-negative terms, so none cancels (Var[X^2] = 4 m^2 v + 2 v^2, not
E[X^4] - E[X^2]^2, which loses every digit when v << m^2 in float32). `plain` is the function's own
operation on the mean (m ** n, exp(m)): the variance-free term is computed exactly as the plain
function computes it, so zero variance gives the plain output bit for bit.

Derivations (X = m + s Z, Z ~ N(0, 1), E[Z^k] = (k - 1)!! for even k, 0 for odd k):
  E[X^n]   = sum_{k even} C(n, k) (k - 1)!! m^(n - k) v^(k / 2);
  Var[X^n] = sum_{j, k >= 1} C(n, j) C(n, k) m^(2n - j - k) s^(j + k) Cov(Z^j, Z^k), where
             Cov(Z^j, Z^k) = E[Z^(j+k)] - E[Z^j] E[Z^k] is >= 0, and 0 unless j and k have the same
             parity (then 2n - j - k is even, m's power too): all terms >= 0.
  Cov(X_i^2, X_j^2) = 2 S_ij^2 + 4 m_i m_j S_ij (Isserlis), E[X_i^2] = m_i^2 + S_ii;
  E[e^X_i] = exp(m_i + S_ii / 2), Cov(e^X_i, e^X_j) = E[e^X_i] E[e^X_j] (exp(S_ij) - 1).
"""
import math
from functools import lru_cache

import jax.numpy as jnp


def _double_factorial(k):
  """(k - 1)!! for even k >= 0: E[Z^k]; 0 for odd k."""
  return 0 if k % 2 else math.prod(range(k - 1, 0, -2))


@lru_cache(maxsize=None)
def _power_coefficients(n):
  """Integer coefficients: mean terms [(k, c)] for k = 2, 4, ... (m^(n-k) v^(k/2)), variance
  terms [(p, a_p)] for p = 2, 4, ..., 2n (m^(2n-p) v^(p/2)), every a_p >= 0."""
  mean = [(k, math.comb(n, k) * _double_factorial(k)) for k in range(2, n + 1, 2)]
  var = {}
  for j in range(1, n + 1):
    for k in range(1, n + 1):
      c = _double_factorial(j + k) - _double_factorial(j) * _double_factorial(k)
      if c:
        var[j + k] = var.get(j + k, 0) + math.comb(n, j) * math.comb(n, k) * c
  return tuple(mean), tuple(sorted(var.items()))


def power_moments(mean, var, n, plain):
  """E and Var of X ** n, X ~ N(mean, var) elementwise (n >= 2); plain = mean ** n as fn has it."""
  mean_terms, var_terms = _power_coefficients(int(n))
  m2 = mean * mean
  out_mean = plain
  for k, c in mean_terms:
    out_mean = out_mean + c * mean ** (n - k) * var ** (k // 2)
  if n == 2:      # the common case, written as the docs state it: 4 m^2 v + 2 v^2
    return out_mean, var * (4.0 * m2 + 2.0 * var)
  out_var = jnp.zeros_like(var)
  for p, a in var_terms:
    out_var = out_var + a * m2 ** ((2 * n - p) // 2) * var ** (p // 2)
  return out_mean, out_var


def exp_moments(mean, var, plain_exp):
  """The lognormal's mean exp(m + v / 2) and variance E^2 (exp(v) - 1); plain_exp(m) is fn's
  exp (applied to m + v / 2, so that v = 0 gives fn's exp(m) bit for bit)."""
  out_mean = plain_exp(mean + 0.5 * var)
  return out_mean, out_mean * out_mean * jnp.expm1(var)


def _diag(cov):
  return jnp.diagonal(cov, axis1=-2, axis2=-1)


def square_cov(mean, cov, plain):
  """X ** 2 for X ~ N(mean [..., d], cov [..., d, d]); plain = mean ** 2 as fn has it."""
  mm = mean[..., :, None] * mean[..., None, :]
  return plain + _diag(cov), cov * (2.0 * cov + 4.0 * mm)


def exp_cov(mean, cov, plain_exp):
  """exp(X) for X ~ N(mean [..., d], cov [..., d, d]) (lognormal, exact)."""
  e = plain_exp(mean + 0.5 * _diag(cov))
  return e, e[..., :, None] * e[..., None, :] * jnp.expm1(cov)
