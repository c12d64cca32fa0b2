"""propagate(fn, covariance="full"): Gaussians with a full covariance over each value's last axis.

A random value x of shape [..., d] carries mean [..., d] and cov [..., d, d]: the leading axes are
independent rows (a batch), the last axis the features whose covariance is kept. A value whose
feature axis was summed or squeezed away (a critic's scalar head) is a "scalar": mean [...], cov
[..., 1, 1], and comes back from propagate as (mean, var).

Rules (x ~ N(m, C) over the last axis; c deterministic):
  exact   x @ W (dot_general contracting x's last axis with a 2-D W): C -> W^T C W;
          x + c, x * c, x / c, -x, sum, reshape / broadcast / transpose / slice / squeeze that keep
          the last axis last, concatenation (of independent blocks, see below), float casts;
  relu    the mean and each coordinate's variance from moments.mm_relu (Lemma 1, closed form); the
          covariance of two rectified coordinates by Price's theorem and Sheppard's formula, a
          one-dimensional integral per pair (relu_covariance.py): by 12-point Gauss-Legendre,
          within 5.7e-7 of s_i s_j of mpmath (relu_covariance="quadrature", the default), or by
          the closed-form approximation of Wu et al., ICLR 2019, within 1.45e-2 of s_i s_j
          (relu_covariance="dvi"); the approximation error of the whole network is what remains
          of treating every layer's input as Gaussian (docs/moment_matching.md).
  leaky   Y = (1 - k) relu(X) + k X: Cov = (1 - k)^2 R + k^2 C + k (1 - k) C (Phi(a_i) + Phi(a_j))
          (Stein's lemma gives Cov(relu X_i, X_j) = C_ij Phi(a_i)).
  itself  x * x, x ** 2, jnp.square: mean m^2 + diag C,
          Cov(x_i^2, x_j^2) = 2 C_ij^2 + 4 m_i m_j C_ij; exp(x): Cov = E_i E_j (exp(C_ij) - 1);
          x + x, x - x (closed_forms.py; FullRules.power, exp, scale);
  two     two random values meeting in one operation, as in the diagonal mode (propagate.py):
          x * y exact when they share no random input, refused when they share one; x + y and a
          concatenation taken as independent: a skip connection's correlation is dropped.
Anything else with a random input (a batched dot_general, x @ y of two random values, a select,
an op that moves the last axis) raises interpreter.PropagateError.

Cost: a d x d covariance per row; the matmuls (W^T C W, the floor of any exact full-covariance
method) cost ~d times the diagonal mode's, relu 12 exponentials per pair ("dvi": one);
benchmarks/bench_propagate.txt times both against that floor.
"""
import jax.numpy as jnp
import numpy as np
from jax import lax

from mombo_jax.errors import InvalidArgument
from mombo_jax.moment_matching.closed_forms import exp_cov, exp_moments, power_moments, square_cov
from mombo_jax.moment_matching.interpreter import Unsupported, bind, float_mean
from mombo_jax.moment_matching.moments import mm_leaky_relu, mm_relu
from mombo_jax.moment_matching.relu_covariance import METHODS, phi_cdf, relu_cov

# An ensemble's stacked weights (nn.vmap, a [members, I, O] kernel) reach the full mode as a
# batched matmul; one member's network is plain x @ W, so jax.vmap over the members works.
_MEMBERS_HINT = ("an ensemble with stacked weights (nn.vmap) is a batched matmul, which the full "
                 "mode does not take; propagate one member and jax.vmap over the members' "
                 "parameters instead: jax.vmap(propagate(member.apply, argnums=1, "
                 "covariance='full'), in_axes=(0, None))(stacked_params, (x_mean, x_cov)).")


class FGauss:
  """mean [..., d] and cov [..., d, d] (scalar=True: mean [...], cov [..., 1, 1])."""
  __slots__ = ("mean", "cov", "scalar", "scaled", "slab", "src")

  def __init__(self, mean, cov, scalar=False, scaled=None):
    self.mean, self.cov, self.scalar, self.scaled, self.slab = mean, cov, scalar, scaled, None
    self.src = frozenset()     # the random inputs it depends on (interpreter.interpret)

  def var(self):
    return self.cov[..., 0, 0] if self.scalar else jnp.diagonal(self.cov, axis1=-2, axis2=-1)


def _outer(u, v):
  return u[..., :, None] * v[..., None, :]


class FullRules:
  """Moment rules for FGauss values (see the module docstring)."""
  value_type = FGauss
  caller = "an unknown line"   # where an error points when no user frame is known

  def __init__(self, relu_covariance="quadrature"):
    if relu_covariance not in METHODS:
      raise InvalidArgument(f"propagate: relu_covariance={relu_covariance!r} is not one of "
                            f"{', '.join(map(repr, METHODS))}.", params=["relu_covariance"])
    self.relu_method = relu_covariance   # relu_covariance.relu_cov's method

  def lift(self, mean, var):
    mean = float_mean(mean)
    var = jnp.asarray(var, mean.dtype)
    if mean.ndim == 0 and var.ndim == 0:
      return FGauss(mean, var.reshape(1, 1), scalar=True)
    if var.shape == mean.shape:
      return FGauss(mean, var[..., :, None] * jnp.eye(mean.shape[-1], dtype=mean.dtype))
    if var.shape == mean.shape + mean.shape[-1:]:
      return FGauss(mean, var)
    raise InvalidArgument(f"propagate(covariance='full'): var of shape {var.shape} fits neither "
                          f"mean {mean.shape} (a diagonal) nor {mean.shape + mean.shape[-1:]} "
                          "(a covariance over the last axis).")

  def output(self, g):
    return (g.mean, g.cov[..., 0, 0]) if g.scalar else (g.mean, g.cov)

  def constant(self, x):
    x = jnp.asarray(x)
    if x.ndim == 0:
      return x, jnp.zeros_like(x)
    return x, jnp.zeros(x.shape + x.shape[-1:], x.dtype)

  def mean_of(self, x):
    return x.mean if isinstance(x, FGauss) else x

  def with_mean(self, g, mean):
    return FGauss(mean, g.cov, g.scalar)

  def broadcast(self, g, shape):
    """g as a value of `shape` (rows broadcast; a feature axis of 1 copied: perfectly
    correlated)."""
    shape = tuple(shape)
    if g.mean.shape == shape:
      return g
    if g.scalar:
      raise Unsupported("broadcasting a scalar random value (full covariance)")
    mean = jnp.broadcast_to(g.mean, shape)
    return FGauss(mean, jnp.broadcast_to(g.cov, shape[:-1] + shape[-1:] * 2))

  def relu(self, g):
    m, v = mm_relu(g.mean, g.var())
    if g.scalar:
      return FGauss(m, v[..., None, None], True)
    return FGauss(m, relu_cov(g.mean, g.cov, self.relu_method))

  def leaky_relu(self, g, slope):
    m, v = mm_leaky_relu(g.mean, g.var(), slope)
    if g.scalar:
      return FGauss(m, v[..., None, None], True)
    var = g.var()
    s = jnp.sqrt(jnp.where(var > 0, var, 1.0))
    cdf = jnp.where(var > 0, phi_cdf(g.mean / s), (g.mean > 0).astype(g.mean.dtype))
    cov = ((1.0 - slope) ** 2 * relu_cov(g.mean, g.cov, self.relu_method) + slope**2 * g.cov
           + slope * (1.0 - slope) * g.cov * (cdf[..., :, None] + cdf[..., None, :]))
    eye = jnp.eye(var.shape[-1], dtype=bool)
    return FGauss(m, jnp.where(eye, v[..., :, None], cov))

  def neg(self, g):
    return FGauss(lax.neg(g.mean), g.cov, g.scalar)

  # Exact rules for a value combined with itself (closed_forms.py; interpreter.py calls them).
  def power(self, g, n, plain):
    """g ** 2: Cov(x_i^2, x_j^2) = 2 S_ij^2 + 4 m_i m_j S_ij; other n have no rule here."""
    if n != 2:
      raise Unsupported(f"x ** {n} with covariance='full': only n = 2 has a rule there (the "
                        "diagonal mode has every n >= 2)")
    if g.scalar:
      m, v = power_moments(g.mean, g.cov[..., 0, 0], 2, plain)
      return FGauss(m, v[..., None, None], True)
    return FGauss(*square_cov(g.mean, g.cov, plain))

  def exp(self, g, plain_exp):
    if g.scalar:
      m, v = exp_moments(g.mean, g.cov[..., 0, 0], plain_exp)
      return FGauss(m, v[..., None, None], True)
    return FGauss(*exp_cov(g.mean, g.cov, plain_exp))

  def scale(self, g, c, mean):
    return FGauss(mean, g.cov * (c * c), g.scalar)

  def add_det(self, g, c, op):
    mean = op(g.mean, c)
    return FGauss(mean, self.broadcast(g, mean.shape).cov, g.scalar)

  def _scale(self, g, c):
    """c * x for deterministic c broadcast to x's shape."""
    if g.scalar:
      return g.cov * (c * c)[..., None, None]
    return g.cov * _outer(c, c)

  def apply(self, eqn, ins):
    """One primitive with a random input: ([FGauss], exact), by arithmetic (_arithmetic), a
    matmul (_dot), a concatenation or a change of layout (_layout)."""
    name = eqn.primitive.name
    rand = [isinstance(x, FGauss) for x in ins]
    mean = lambda: bind(eqn, [self.mean_of(x) for x in ins])[0]  # noqa: E731
    if name in ("add", "sub", "add_any", "neg", "mul", "div"):
      return self._arithmetic(eqn, ins, rand, mean)
    if any(rand[1:]) and name not in ("concatenate", "dot_general"):
      raise Unsupported("a random value used as an index, mask or second operand")
    if name == "dot_general":
      return [self._dot(eqn, ins, mean())], True
    if name == "concatenate":
      return [self._concatenate(eqn, ins, mean())], True
    return [self._layout(eqn, ins[0] if rand[0] else None, mean)], True

  def _arithmetic(self, eqn, ins, rand, mean):
    """x + y, -x, x * y, x / c (independent operands, see the module docstring)."""
    name, shape = eqn.primitive.name, eqn.outvars[0].aval.shape
    if name in ("add", "sub", "add_any"):
      m = mean()
      gs = [self.broadcast(x, shape) for x in ins if isinstance(x, FGauss)]
      return [FGauss(m, sum(g.cov for g in gs[1:]) + gs[0].cov, gs[0].scalar)], True
    if name == "neg":
      return [self.neg(ins[0])], True
    m = mean()
    if rand[1] and (name == "div" or rand[0]):
      if name == "div":
        raise Unsupported("division by a random value")
      a, b = self.broadcast(ins[0], shape), self.broadcast(ins[1], shape)
      if a.scalar:
        return [FGauss(m, a.cov * b.cov + a.cov * (b.mean**2)[..., None, None]
                       + b.cov * (a.mean**2)[..., None, None], True)], False
      ma, mb = _outer(a.mean, a.mean), _outer(b.mean, b.mean)
      return [FGauss(m, (a.cov + ma) * (b.cov + mb) - ma * mb)], False
    g, c = (ins[0], ins[1]) if rand[0] else (ins[1], ins[0])
    g = self.broadcast(g, shape)
    c = jnp.broadcast_to(1.0 / c if name == "div" else c, shape)
    scaled = (ins[0] if rand[0] else ins[1], ins[1] if rand[0] else ins[0]) \
        if name == "mul" and np.ndim(ins[1] if rand[0] else ins[0]) == 0 else None
    return [FGauss(m, self._scale(g, c), g.scalar, scaled=scaled)], True

  def _layout(self, eqn, g, mean):
    """A cast, sum, reshape, squeeze, broadcast, transpose or slice of g (exact): an FGauss when
    the features stay on the last axis (or are summed away into a scalar), else Unsupported."""
    name, p = eqn.primitive.name, eqn.params
    shape = eqn.outvars[0].aval.shape
    n = g.mean.ndim if g is not None else 0
    if name in ("convert_element_type", "copy", "copy_p", "reduce_precision"):
      if not jnp.issubdtype(eqn.outvars[0].aval.dtype, jnp.floating):
        raise Unsupported("a cast of a random value to a non-float dtype")
      return FGauss(mean(), g.cov.astype(eqn.outvars[0].aval.dtype), g.scalar)
    if name == "reduce_sum":
      axes = tuple(p["axes"])
      if g.scalar or n - 1 not in axes:
        return FGauss(mean(), jnp.sum(g.cov, axes), g.scalar)
      cov = jnp.sum(jnp.sum(g.cov, (-2, -1)), tuple(a for a in axes if a != n - 1))
      return FGauss(mean(), cov[..., None, None], True)
    if name == "reshape" and p.get("dimensions") is None:
      new = tuple(p["new_sizes"])
      if not g.scalar and new and new[-1] == g.mean.shape[-1]:
        return FGauss(mean(), g.cov.reshape(new[:-1] + new[-1:] * 2))
      if g.scalar and new and new[-1] == 1:
        return FGauss(mean(), g.cov.reshape(new[:-1] + (1, 1)))
      if not g.scalar and g.mean.shape[-1] == 1 and new == g.mean.shape[:-1]:
        return FGauss(mean(), g.cov, True)
    if name == "squeeze":
      dims = tuple(d % n for d in p["dimensions"])
      lead = tuple(d for d in dims if d != n - 1 or g.scalar)
      return FGauss(mean(), lax.squeeze(g.cov, lead), g.scalar or n - 1 in dims)
    if name == "broadcast_in_dim":
      dims, out_n = tuple(p["broadcast_dimensions"]), len(shape)
      if g.scalar and out_n - 1 not in dims:
        cov = lax.broadcast_in_dim(g.cov, shape + shape[-1:], dims + (out_n - 1, out_n))
        return FGauss(mean(), cov)
      if g.scalar:
        cov = lax.broadcast_in_dim(g.cov, shape + (1, 1), dims + (out_n, out_n + 1))
        return FGauss(mean(), cov, True)
      if dims[-1] == out_n - 1:
        cov = lax.broadcast_in_dim(g.cov, shape + shape[-1:], dims[:-1] + (out_n - 1, out_n))
        return FGauss(mean(), cov)
    if name == "transpose":
      perm = tuple(p["permutation"])
      if g.scalar:
        return FGauss(mean(), jnp.transpose(g.cov, perm + (n, n + 1)), True)
      if perm[-1] == n - 1:
        return FGauss(mean(), jnp.transpose(g.cov, perm[:-1] + (n - 1, n)))
    if name == "slice" and p.get("strides") is None:
      start, limit = tuple(p["start_indices"]), tuple(p["limit_indices"])
      if g.scalar:
        cov = lax.slice(g.cov, start + (0, 0), limit + (1, 1))
      else:
        cov = lax.slice(g.cov, start + start[-1:], limit + limit[-1:])
      return FGauss(mean(), cov, g.scalar)
    raise Unsupported("" if name not in ("reshape", "broadcast_in_dim", "transpose", "squeeze",
                                         "slice", "select_n") else
                      "covariance='full' needs the features on the last axis, kept there")

  def _dot(self, eqn, ins, mean):
    """x @ W with W deterministic and 2-D (or 1-D): C -> W^T C W."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    a, b = ins
    if isinstance(a, FGauss) and isinstance(b, FGauss):
      raise Unsupported("x @ y of two random values (covariance='full')")
    if lb or rb:
      raise Unsupported("a batched dot_general (covariance='full')", hint=_MEMBERS_HINT)
    if isinstance(a, FGauss):
      g, w, g_dims, w_dims = a, b, tuple(lc), tuple(rc)
    else:
      g, w, g_dims, w_dims = b, a, tuple(rc), tuple(lc)
      if g.mean.ndim != 1:
        raise Unsupported("c @ x with a random x of more than one axis (covariance='full')")
    if g.scalar or g_dims != (g.mean.ndim - 1,) or w.ndim not in (1, 2):
      raise Unsupported("covariance='full' needs x @ W contracting x's last axis with a 2-D W",
                        hint=_MEMBERS_HINT if w.ndim > 2 else None)
    w = jnp.asarray(w)
    mat = w[:, None] if w.ndim == 1 else (w if w_dims == (0,) else w.T)     # [I, O]
    cov = jnp.matmul(mat.T, jnp.matmul(g.cov, mat))
    return FGauss(mean, cov, scalar=w.ndim == 1)

  def _concatenate(self, eqn, ins, mean):
    """Along the last axis: a block-diagonal covariance (operands independent, see above)."""
    axis, n = eqn.params["dimension"], mean.ndim
    gs = [x if isinstance(x, FGauss) else FGauss(x, self.constant(x)[1]) for x in ins]
    if any(g.scalar for g in gs):
      raise Unsupported("concatenating scalar random values (covariance='full')")
    if axis != n - 1:
      return FGauss(mean, lax.concatenate([g.cov for g in gs], axis))
    sizes = [g.mean.shape[-1] for g in gs]
    total, rows, start = sum(sizes), [], 0
    for g, d in zip(gs, sizes):
      pad = [(0, 0, 0)] * (n - 1) + [(0, 0, 0), (start, total - start - d, 0)]
      rows.append(lax.pad(g.cov, jnp.zeros((), g.cov.dtype), pad))
      start += d
    return FGauss(mean, lax.concatenate(rows, n - 1))
