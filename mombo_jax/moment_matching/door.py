"""The moments propagate is given, checked before any work (propagate.py calls check_input).

What is checked when:
  always (eager, and under jit / vmap / grad, where the inputs are tracers): the structure and the
    shapes. A random argument is a (mean, var) pair; var has mean's tree structure; each mean
    leaf is a float array; each var leaf fits its mean: diagonal mode, mean's shape or one that
    broadcasts to it (a [..., d, d] covariance is refused with the way to pass it); full mode,
    mean's shape (a diagonal) or mean.shape + (d,) (a covariance over the last axis).
  when the values are concrete (not tracers: an eager call) and check_values is True (the
    default) or "checkify": means finite; variances finite and >= 0; a full covariance finite,
    symmetric within a tolerance and positive semi-definite within it (a Cholesky factorisation
    of C + tol * scale * I, scale = the row's largest variance, tol = 10 d eps(dtype): rounding
    of a computed covariance is accepted, a negative eigenvalue beyond it is not). Up to d = 63
    that runs in float64 on the host; from d = 64 first on the covariance's device in its dtype
    (one fused symmetry test and a batched Cholesky), and the float64 host check runs only if that
    fails, to confirm and name the row: at [256, 256, 256] in float32 0.68x one layer's W^T C W,
    where the host check alone took 1.0-3.5x it (benchmarks/bench_propagate_eager.txt; not the
    sixth its d^3 / 3 flops suggest). check_values=False skips them.
  under jit / vmap / grad (tracers): with check_values=True nothing is value-checked (a negative
    variance gives plausible numbers). check_values="checkify" stages the same checks as
    jax.experimental.checkify checks (the covariance's in its dtype, on its device): wrap the
    jitted function, err, out = checkify.checkify(jax.jit(g))(...), then err.throw(); unwrapped,
    JAX refuses to compile the staged check, naming checkify.checkify.
Each refusal is a MomentsError (a PropagateError, so a ValueError) naming the argument, the leaf,
and the shapes expected and given (or the first bad value and its index).
"""
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

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


# From this size on a covariance is first checked on its device in its own dtype (one fused
# symmetry test and a batched Cholesky of C + tol * scale * I, both far cheaper than the float64
# host factorisation: benchmarks/bench_propagate_eager.txt); the host check below runs only when
# that one fails, to confirm (float32 rounding) and to name the row. Smaller ones go to the host
# directly: no compilation per shape for them.
_DEVICE_CHECK_D = 64


@jax.jit
def _device_psd(cov):
  """[rows] flags of cov [..., d, d] flattened: symmetric and Cholesky-factorable within tol."""
  d = cov.shape[-1]
  c = cov.reshape((-1, d, d))
  tol = 10.0 * d * jnp.finfo(c.dtype).eps
  scale = jnp.maximum(jnp.max(jnp.abs(jnp.diagonal(c, axis1=-2, axis2=-1)), axis=-1),
                      jnp.finfo(c.dtype).tiny)[:, None, None]
  sym = jnp.all(jnp.abs(c - jnp.swapaxes(c, -1, -2)) <= tol * scale, axis=(-2, -1))
  factor = jnp.linalg.cholesky(c + tol * scale * jnp.eye(d, dtype=c.dtype))
  return sym & jnp.all(jnp.isfinite(factor), axis=(-2, -1))


def _check_finite_on_device(label, name, x):
  if not bool(jnp.all(jnp.isfinite(x))):
    _check_finite(label, name, x)          # names the first bad entry


def _check_psd(label, cov):
  """Symmetric and positive semi-definite within tol * scale, per row of cov [..., d, d]."""
  d = cov.shape[-1]
  if d >= _DEVICE_CHECK_D and cov.dtype in (np.float32, np.float64) and bool(
      np.all(np.asarray(_device_psd(jnp.asarray(cov))))):
    return
  cov = np.asarray(cov)
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


def _checkify(label, mean, var, full):
  """The value checks as checkify.check calls, for traced inputs (check_values="checkify"): the
  caller's jitted function must be wrapped in jax.experimental.checkify.checkify."""
  mean, var = jnp.asarray(mean), jnp.asarray(var)
  is_cov = full and mean.ndim > 0 and var.shape == mean.shape + mean.shape[-1:]
  checks = [(jnp.all(jnp.isfinite(mean)), f"propagate: {label}'s mean has NaN or infinite "
             "entries; pass finite moments."),
            (jnp.all(jnp.isfinite(var)), f"propagate: {label}'s var has NaN or infinite "
             "entries; pass finite moments.")]
  if is_cov:
    checks.append((jnp.all(_device_psd(var)), f"propagate: {label}'s covariance is not "
                   "symmetric positive semi-definite (within 10 d eps(dtype) of a row's largest "
                   "variance, checked in its dtype); pass a covariance (e.g. L @ L.T)."))
  else:
    checks.append((jnp.all(var >= 0), f"propagate: {label}'s var has negative entries; a "
                   "variance is >= 0 (clip it: jnp.maximum(var, 0))."))
  # Unwrapped, JAX refuses the staged check itself ("Cannot abstractly evaluate a
  # checkify.check which was not functionalized ... checkify.checkify"), when jit lowers g.
  for ok, message in checks:
    checkify.check(ok, message)


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
    if check_values == "checkify" and not (_concrete(m) and _concrete(v)):
      _checkify(name, m, v, full)
      continue
    if not (check_values and _concrete(m) and _concrete(v)):
      continue
    _check_finite(name, "mean", m)
    is_cov = full and np.ndim(m) > 0 and np.shape(v) == tuple(np.shape(m)) + np.shape(m)[-1:]
    if is_cov and np.shape(v)[-1] >= _DEVICE_CHECK_D:
      _check_finite_on_device(name, "var", v)
      _check_psd(name, v)
      continue
    v = _check_finite(name, "var", v)
    if not jnp.issubdtype(v.dtype, jnp.floating):
      v = v.astype(np.float64)
    if is_cov:
      _check_psd(name, v)
    elif (v < 0).any():
      raise MomentsError(f"propagate: {name}'s var has {int((v < 0).sum())} negative entries "
                         f"({_first(v < 0, v)}); a variance is >= 0. Check how it was "
                         "computed, or clip it: jnp.maximum(var, 0).")
  return var_leaves
