"""The moments propagate is given, checked before any work (propagate.py calls check_input).

What is checked when:
  always (eager, and under jit / vmap / grad, where the inputs are tracers): the structure and the
    shapes. A random argument is a (mean, var) pair; var has mean's tree structure; each mean
    leaf is a float array; each var leaf fits its mean: diagonal mode, mean's shape or one that
    broadcasts to it (a [..., d, d] covariance is refused with the way to pass it); full mode,
    mean's shape (a diagonal) or mean.shape + (d,) (a covariance over the last axis).
  when the values are concrete (not tracers) and check_values=True (the default): means finite;
    variances finite and >= 0; a full covariance finite, symmetric within a tolerance and positive
    semi-definite within it (a Cholesky factorisation of C + tol * scale * I in float64 on the host,
    scale = the row's largest variance, tol = 10 d eps(dtype): rounding of a computed covariance is
    accepted, a negative eigenvalue beyond it is not). That costs a transfer to the host and, for a
    full covariance, d^3 / 3 flops per row (about a sixth of one layer's covariance product);
    check_values=False skips it. Under jit nothing is value-checked: check the inputs once outside
    jit (call the propagated function eagerly on them, or check_input).
Each refusal is a MomentsError (a PropagateError, so a ValueError) naming the argument, the leaf,
and the shapes expected and given (or the first bad value and its index).
"""
import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax.moment_matching.interpreter import PropagateError


class MomentsError(PropagateError):
  """The moments passed to a propagated function are not a Gaussian's (door.py)."""


def _concrete(x):
  return not isinstance(x, jax.core.Tracer)


def _first(bad, values):
  idx = tuple(int(i) for i in np.argwhere(bad)[0])
  return f"the first {float(values[idx])} at index {idx}"


def _check_finite(label, name, x):
  x = np.asarray(x)
  bad = ~np.isfinite(x)
  if bad.any():
    raise MomentsError(f"propagate: {label}'s {name} has {int(bad.sum())} NaN or infinite "
                       f"entries ({_first(bad, x)}); pass finite moments (NaN in, NaN out would "
                       "hide where it came from).")
  return x


def _check_psd(label, cov):
  """Symmetric and positive semi-definite within tol * scale, per row of cov [..., d, d]."""
  d = cov.shape[-1]
  tol = 10.0 * d * float(jnp.finfo(cov.dtype).eps)
  c = cov.astype(np.float64).reshape((-1, d, d))
  scale = np.maximum(np.max(np.abs(np.diagonal(c, axis1=-2, axis2=-1)), axis=-1),
                     np.finfo(np.float64).tiny)[:, None, None]
  asym = np.abs(c - np.swapaxes(c, -1, -2)) > tol * scale
  if asym.any():
    row, i, j = (int(k) for k in np.argwhere(asym)[0])
    raise MomentsError(
        f"propagate: {label}'s covariance is not symmetric: row {row} has C[{i}, {j}] = "
        f"{c[row, i, j]!r} but C[{j}, {i}] = {c[row, j, i]!r} (tolerance {tol:.1e} of the row's "
        "largest variance). Pass (C + C^T) / 2 if it is a rounding matter.")
  neg = np.diagonal(c, axis1=-2, axis2=-1) < 0
  try:
    np.linalg.cholesky(c + tol * scale * np.eye(d))
    return
  except np.linalg.LinAlgError:
    pass      # find the first row that fails, for the message
  for row in range(c.shape[0]):
    try:
      np.linalg.cholesky(c[row] + tol * scale[row] * np.eye(d))
    except np.linalg.LinAlgError:
      low = float(np.linalg.eigvalsh(c[row])[0])
      extra = " (a negative variance on its diagonal)" if neg[row].any() else ""
      raise MomentsError(
          f"propagate: {label}'s covariance is not positive semi-definite: row {row} "
          f"(of {c.shape[0]}, the leading axes flattened) has eigenvalue {low:.3g}, below "
          f"-{tol:.1e} x its largest variance {float(scale[row, 0, 0]):.3g}{extra}. Pass a "
          "covariance (e.g. L @ L.T), or clip its eigenvalues at 0.") from None


def _check_shapes(label, mean, var, full):
  """The var leaf against its mean leaf (module docstring); the rule broken names both shapes."""
  ms, vs = tuple(np.shape(mean)), tuple(np.shape(var))
  if not jnp.issubdtype(jnp.result_type(mean), jnp.floating):
    raise MomentsError(f"propagate: {label}'s mean must be a float array, got "
                       f"{jnp.result_type(mean)}; cast it with .astype(jnp.float32).")
  cov_shape = ms + ms[-1:]
  if not full:
    try:
      fits = np.broadcast_shapes(vs, ms) == ms
    except ValueError:
      fits = False
    if fits:
      return
    if ms and vs == cov_shape:
      raise MomentsError(
          f"propagate: {label}'s var has shape {vs}, a covariance over the last axis of its mean "
          f"{ms}, but the diagonal mode expects variances of shape {ms}. Pass "
          "covariance='full' to keep it, or its diagonal: jnp.diagonal(cov, axis1=-2, axis2=-1).")
    raise MomentsError(
        f"propagate: {label}'s var has shape {vs}, which does not fit its mean of shape {ms}: "
        f"expected {ms} (one variance per entry) or a shape that broadcasts to it.")
  if (not ms and not vs) or (ms and vs in (ms, cov_shape)):
    return
  expected = f"{ms} (variances, a diagonal covariance) or {cov_shape} (a covariance over the " \
      "last axis)" if ms else "() (a scalar mean has a scalar variance)"
  shared = ""
  if len(ms) > 1 and vs == ms[-1:] * 2:
    shared = (f" A covariance shared by every row: pass jnp.broadcast_to(cov, {cov_shape}).")
  raise MomentsError(f"propagate(covariance='full'): {label}'s var has shape {vs}, which does not "
                     f"fit its mean of shape {ms}: expected {expected}.{shared}")


def check_input(label, mean, var, full, check_values=True):
  """Check one random argument's (mean, var) pytrees; returns var's leaves in mean's leaf order.

  label: how the error names the argument ("argument 1"); full: covariance='full'.
  """
  mean_leaves, tree = jax.tree_util.tree_flatten_with_path(mean)
  try:
    var_leaves = tree.flatten_up_to(var)
  except (ValueError, TypeError):
    raise MomentsError(f"propagate: {label}'s var has the tree structure "
                       f"{jax.tree.structure(var)} but its mean {tree}; pass var with mean's "
                       "structure (one variance array per mean array).") from None
  for (path, m), v in zip(mean_leaves, var_leaves):
    name = label + (f" {jax.tree_util.keystr(path)}" if path else "")
    _check_shapes(name, m, v, full)
    if not (check_values and _concrete(m) and _concrete(v)):
      continue
    _check_finite(name, "mean", m)
    v = _check_finite(name, "var", v)
    if not jnp.issubdtype(v.dtype, jnp.floating):
      v = v.astype(np.float64)
    is_cov = full and np.ndim(m) > 0 and v.shape == tuple(np.shape(m)) + np.shape(m)[-1:]
    if is_cov:
      _check_psd(name, v)
    elif (v < 0).any():
      raise MomentsError(f"propagate: {name}'s var has {int((v < 0).sum())} negative entries "
                         f"({_first(v < 0, v)}); a variance is >= 0. Check how it was "
                         "computed, or clip it: jnp.maximum(var, 0).")
  return var_leaves
