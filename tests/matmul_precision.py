"""Tolerances for tests that compare two computations made of float32 matmuls, derived from the
matmul precision in use, and TF32's rounding emulated on the CPU (issue #43).

The precision in use: a dot pinned with jax.default_matmul_precision computes at the pinned
precision; an unpinned one at JAX's default for the backend: full float32 on a CPU (XLA:CPU
ignores the precision), TF32 on a GPU with tensor cores (Ampere and later: inputs rounded to 10
mantissa bits), bfloat16 on a TPU. The package pins its programs to Config.matmul_precision
(xla_options.at_precision); a test's own jit of a network is unpinned unless the test pins it.

The error model (`rtol`): a dot of width n rounds each input to the precision's unit roundoff u
(float32 inputs: none; TF32: 2^-11; bfloat16: 2^-8) and sums n products in float32, errors of
random sign that add up like sqrt(n); a chain of k such dots adds k of them. Two evaluations of
one chain that differ in how their dots are computed (another shape, a batched or a fused dot,
one of them at another precision: XLA picks per dot) differ by up to about k sqrt(n) u relative
to the size of the terms, so comparisons are made relative to the output's largest entry
(`assert_close`): an entry that cancels to near zero keeps the error of the terms it came from.
float32 gives k sqrt(n) 2^-24 (1e-6 for three dots of width 32), TF32 8,192 times that.

`emulate_tf32(fn)` evaluates fn with every float32 dot's operands rounded to TF32 first
(lax.reduce_precision, 8 exponent and 10 mantissa bits), as a GPU's tensor cores take them, so a
CPU test can show that a tolerance holds under TF32 (and that a float32 one would not).
"""
import math

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np

FLOAT32, TF32, BFLOAT16 = "float32", "tensorfloat32", "bfloat16"
# Relative rounding of a dot's inputs at each precision, and of its float32 sums.
UNIT_ROUNDOFF = {FLOAT32: 2.0**-24, TF32: 2.0**-11, BFLOAT16: 2.0**-8}
# jax.default_matmul_precision's names of each (None, "default", "bfloat16": the backend's default).
_PINNED = {"float32": FLOAT32, "highest": FLOAT32, "F32_F32_F32": FLOAT32,
           "tensorfloat32": TF32, "high": TF32, "TF32_TF32_F32": TF32}
_BACKEND_DEFAULT = {"cpu": FLOAT32, "gpu": TF32, "cuda": TF32, "rocm": TF32, "tpu": BFLOAT16}


def in_use(backend=None) -> str:
  """FLOAT32, TF32 or BFLOAT16: what a float32 dot traced now computes at on `backend` (default:
  JAX's), by the precision pinned around it (jax.default_matmul_precision) or the backend's
  default. A GPU without TF32 units computes float32, more exact than TF32: TF32's tolerance
  still holds there."""
  backend = backend or jax.default_backend()
  if backend == "cpu":
    return FLOAT32                          # XLA:CPU computes every precision in float32
  pinned = _PINNED.get(jax.config.jax_default_matmul_precision)
  return pinned or _BACKEND_DEFAULT.get(backend, BFLOAT16)


def rtol(dots: int, width: int, precision=None) -> float:
  """dots * sqrt(width) * u: how far two evaluations of a chain of `dots` float32 dots of width
  <= `width` may differ at `precision` (default: in_use()), relative to the size of the terms."""
  return dots * math.sqrt(width) * UNIT_ROUNDOFF[precision or in_use()]


def assert_close(actual, desired, dots: int, width: int, precision=None, err_msg=""):
  """|actual - desired| <= rtol * max(|desired|, |desired|.max()): the chain's error model, each
  entry judged against the output's scale (an entry that cancelled keeps its terms' error)."""
  desired = np.asarray(desired)
  tol = rtol(dots, width, precision)
  np.testing.assert_allclose(actual, desired, rtol=tol, atol=tol * float(np.max(np.abs(desired))),
                             err_msg=err_msg)


def max_difference(actual, desired) -> float:
  """max |actual - desired| / max |desired|: the relative difference assert_close measures."""
  actual, desired = np.asarray(actual, np.float64), np.asarray(desired, np.float64)
  return float(np.max(np.abs(actual - desired)) / np.max(np.abs(desired)))


def _tf32(x):
  if x.dtype != jnp.float32:
    return x
  return jax.lax.reduce_precision(x, exponent_bits=8, mantissa_bits=10)


def _has_dot(jaxpr) -> bool:
  return any(e.primitive.name == "dot_general"
             or any(_has_dot(j) for j in jex.jaxprs_in_params(e.params)) for e in jaxpr.eqns)


# Call-like primitives whose one inner jaxpr computes their outputs from their inputs (a forward
# evaluation needs nothing else): jit, custom_jvp_call, custom_vjp_call.
_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "custom_jvp_call": "call_jaxpr",
          "custom_vjp_call": "call_jaxpr"}


def _evaluate(jaxpr, consts, args, counter):
  env = {}

  def read(v):
    return v.val if isinstance(v, jex.Literal) else env[v]

  for var, x in zip(jaxpr.constvars, consts):
    env[var] = x
  for var, x in zip(jaxpr.invars, args):
    env[var] = x
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    name = eqn.primitive.name
    if name == "dot_general":
      counter[0] += 1
      outs = [eqn.primitive.bind(*map(_tf32, ins), **eqn.params)]
    elif name in _CALLS:
      inner = eqn.params[_CALLS[name]]
      outs = _evaluate(inner.jaxpr, inner.consts, ins, counter)
    else:
      if any(_has_dot(j) for j in jex.jaxprs_in_params(eqn.params)):
        raise NotImplementedError(f"emulate_tf32: a dot inside {name}, which it does not enter.")
      outs = eqn.primitive.bind(*ins, **eqn.params)
      outs = outs if eqn.primitive.multiple_results else [outs]
    for var, x in zip(eqn.outvars, outs):
      env[var] = x
  return [read(v) for v in jaxpr.outvars]


def emulate_tf32(fn):
  """fn(*args) evaluated op by op with the operands of every float32 dot (in fn, and in the
  jit / custom_jvp / custom_vjp calls it makes) rounded to TF32 first; a dot it cannot reach (in
  a scan, a while loop, a cond) is an error, never silently left at float32. Returns fn's outputs
  and how many dots were rounded."""
  def emulated(*args):
    closed, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    counter = [0]
    flat = _evaluate(closed.jaxpr, closed.consts, jax.tree.leaves(args), counter)
    return jax.tree.unflatten(jax.tree.structure(shapes), flat), counter[0]
  return emulated

