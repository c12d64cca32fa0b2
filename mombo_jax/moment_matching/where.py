"""Where a refused operation sits in the user's code, and the message propagate's PropagateError
prints for it (moment_matching/interpreter.py raises it).

A primitive's traceback (jax's source_info) runs from JAX's internals through the libraries the
user called (jax.numpy, jax.nn, Flax's layers) up to the user's own code. jax's own user-frame
filter leaves Flax (and any other library) in; here every frame under an installed library's
folder is skipped, so the error names the user's line, the library function or layer that line
called (`nn.LayerNorm`, `jax.nn.gelu`), and only then JAX's primitive. The message:

  line 1   what and where: the layer or function, the user's file:line (function), the primitive;
  line 2   that line of source, indented;
  line 3   what to do (a hint per primitive family: why it has no rule, what to use instead);
  line 4   a short list of what is supported (the whole list: PropagateError.supported).
"""
import functools
import importlib.util
import linecache
import os
import re
import traceback

_LIBRARIES = ("jax", "jaxlib", "flax", "optax", "chex", "equinox", "haiku", "numpy")
_OWN = tuple(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
             for name in ("propagate.py", "full.py", "interpreter.py",
                          "door.py", "where.py"))
# Library files that are machinery, not a function a user calls (tracing, wrappers, jit).
_MACHINERY = ("jax/_src/core.py", "jax/_src/interpreters/", "jax/_src/source_info_util.py",
              "jax/_src/pjit.py", "jax/_src/traceback_util.py", "jax/_src/api.py",
              "jax/_src/api_util.py", "jax/_src/linear_util.py", "jax/_src/custom_derivatives.py",
              "jax/_src/dispatch.py", "jax/_src/numpy/array_methods.py",
              "jax/_src/numpy/ufunc_api.py", "flax/linen/module.py",
              "flax/core/", "flax/linen/transforms.py")
# How a user spells a library folder's functions.
_PREFIXES = (("jax/_src/numpy/", "jnp."), ("jax/_src/nn/", "jax.nn."), ("jax/_src/lax/", "lax."),
             ("flax/linen/", "nn."), ("flax/nnx/", "nnx."), ("jax/_src/", "jax."))
# Python operators on arrays (jax/_src/numpy/array_methods.py's _operator_<name>).
_OPERATORS = {"mul": "*", "matmul": "@", "truediv": "/", "pow": "**", "add": "+", "sub": "-",
              "rmul": "*", "rmatmul": "@", "rtruediv": "/", "radd": "+", "rsub": "-"}
# A primitive's everyday name, where it differs.
ALIASES = {"logistic": "sigmoid", "integer_pow": "x ** n", "rsqrt": "1 / sqrt",
           "reduce_max": "max over an axis", "argmax": "argmax", "erf": "erf (exact gelu)",
           "dot_general": "matmul", "mul": "*", "div": "/", "select_n": "where"}

_SQUASH = ("has no closed-form Gaussian moments (E[f(X)] for X ~ N(m, v) is an integral with no "
           "closed form for tanh, sigmoid, atan). Use relu or leaky_relu in the part you "
           "propagate, or estimate this part's moments by Monte Carlo (mombo_jax.mc_moments).")
_NOT_YET = ("has no rule here (its Gaussian moments have closed forms, erf's variance through a "
            "bivariate normal CDF, that propagate does not implement). Use relu or leaky_relu in "
            "the part you propagate, or estimate this part's moments by Monte Carlo "
            "(mombo_jax.mc_moments).")
_NORM = ("divides by a random value (1 / x: no finite moments) or by a statistic of the value "
         "itself (a normalisation: LayerNorm, RMSNorm, BatchNorm in training mode, a softmax's "
         "denominator: a ratio of dependent random values, with no closed-form moments). "
         "Normalise outside the propagated function (on the means) or with fixed statistics.")
_MAX = ("takes the max over random values (softmax's shift, max pooling, argmax); beyond relu's "
        "max(x, c) it has no closed form. Move it outside the propagated function.")
HINTS = {**{p: _SQUASH for p in ("tanh", "logistic", "atan", "atan2", "erf_inv", "tan", "asin",
                                 "acos", "asinh")},
         **{p: _NOT_YET for p in ("erf", "erfc", "sin", "cos", "sinh", "cosh")},
         **{p: _NORM for p in ("rsqrt", "sqrt", "cbrt", "div")},
         **{p: _MAX for p in ("reduce_max", "reduce_min", "argmax", "argmin", "max", "min",
                               "sort", "cumlogsumexp", "cummax")},
         **{p: ("is undefined for the negative values a Gaussian takes: no moments. Apply it "
                "outside the propagated function.") for p in ("log", "log1p", "pow")}}
DEFAULT_HINT = ("Rewrite that part with the supported operations, compute it outside the "
                "propagated function, or estimate its moments by Monte Carlo "
                "(mombo_jax.mc_moments).")
SHORT_SUPPORTED = ("x @ W and Dense with fixed weights; +, -, *, / by fixed values; relu and "
                   "leaky relu in any spelling; x * x, x ** n, exp; sums of random values, and "
                   "products of independent ones; reshapes, slices, concatenation, float casts")


@functools.lru_cache(maxsize=None)
def _library_dirs():
  dirs = []
  for name in _LIBRARIES:
    try:
      spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
      spec = None
    for path in (spec.submodule_search_locations or []) if spec is not None else []:
      dirs.append(os.path.abspath(path) + os.sep)
  return tuple(dirs)


def _is_library(path):
  path = os.path.abspath(path)
  return path in _OWN or path.startswith(_library_dirs())


def _raw_frames(eqn):
  """[(file, line, function)] of the equation's traceback, innermost first ([] if unknown)."""
  try:
    return [(f.file_name, f.line_num, f.function_name) for f in eqn.source_info.traceback.frames]
  except Exception:  # pylint: disable=broad-except  (a private jaxlib API: never fail on it)
    return []


def _library_name(path, function):
  """`nn.LayerNorm` for flax/linen/normalization.py's LayerNorm.__call__, `jax.nn.gelu`, ...;
  None for private helpers and machinery."""
  if any(m in path.replace(os.sep, "/") for m in _MACHINERY) or "<" in function:
    return None
  parts = function.split(".")
  name = parts[-2] if parts[-1] == "__call__" and len(parts) > 1 else parts[-1]
  if name.startswith("_"):
    return None
  unix = path.replace(os.sep, "/")
  prefix = next((p for folder, p in _PREFIXES if folder in unix), "")
  return f"`{prefix}{name}`"


def locate(eqn, outer=()):
  """(user frame (file, line, function) or None, the library layer / function it called or None)
  for the equation, falling back on the enclosing call equations `outer` (innermost last)."""
  for e in (eqn, *reversed(outer)):
    frames = _raw_frames(e)
    for i, (path, line, function) in enumerate(frames):
      if not _is_library(path):
        called = None
        for lib_path, _, lib_function in reversed(frames[:i]):   # outermost library call first
          op = re.search(r"(?:^|\.)_operator_(\w+)$", lib_function)
          called = f"`{_OPERATORS[op[1]]}`" if op and op[1] in _OPERATORS else \
              _library_name(lib_path, lib_function)
          if called:
            break
        return (path, line, function), called
  return None, None


def public_name(fn):
  """`jax.nn.softmax` for jax.nn.softmax (whose __module__ is jax._src.nn.functions), else
  module.qualname: how the error names a traced fn that is itself a library function."""
  module, name = getattr(fn, "__module__", None) or "?", getattr(fn, "__qualname__", repr(fn))
  folder = module.replace(".", "/") + "/"
  prefix = next((p for f, p in _PREFIXES if folder.startswith(f)), None)
  return prefix + name if prefix else f"{module}.{name}"


def caller_of_propagated():
  """The user's frame that called the propagated function (when the traced fn is a library's)."""
  for frame in reversed(traceback.extract_stack()[:-1]):
    if not _is_library(frame.filename):
      return frame.filename, frame.lineno, frame.name
  return None


def _short_path(path):
  rel = os.path.relpath(path)
  return path if rel.startswith("..") else rel


def refusal_message(eqn, detail, fallback_name, outer=(), hint=None):
  """The PropagateError text for `eqn`, refused (module docstring); fallback_name: fn's own name,
  said when no user frame is in the traceback (fn is itself a library function); detail: what
  exactly is refused, hint: what to do (else the primitive family's hint)."""
  prim = eqn.primitive.name
  user, called = locate(eqn, outer)
  scope = str(getattr(eqn.source_info, "name_stack", "") or "")
  if user is None:
    user = caller_of_propagated()
    called = called or f"`{fallback_name}`"
  alias = ALIASES.get(prim)
  if called and called.startswith(("`nn.", "`nnx.")) and scope:
    called += f" (module {scope})"
  where = f"{_short_path(user[0])}:{user[1]} ({user[2]})" if user else "an unknown line"
  named = called or (f"`{alias}`" if alias else None)
  if named:
    first = f"{named} at {where} applies JAX's `{prim}` to a random (Gaussian) value"
  else:
    first = f"JAX's `{prim}` at {where} takes a random (Gaussian) value"
  text = (f"propagate: {first}, which has no moment rule{f': {detail}' if detail else ''}.")
  source = linecache.getline(user[0], user[1]).strip() if user else ""
  if source:
    text += f"\n    {source}"
  if hint is None and prim in HINTS:
    hint = f"JAX's `{prim}`{f' ({alias})' if alias else ''} {HINTS[prim]}"
  text += f"\nWhat to do: {hint or DEFAULT_HINT}"
  return text + (f"\nSupported: {SHORT_SUPPORTED} (all: PropagateError.supported; "
                 "docs/moment_matching.md).")
