"""The jaxpr interpreter behind propagate (propagate.py): evaluates a traced function on
random values whose moment rules a `rules` object gives (propagate.DiagonalRules,
full.FullRules), and the pieces both rule sets share (relu recognised in any spelling,
the error for an unsupported operation)."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from mombo_jax.errors import InvalidArgument
from mombo_jax.moment_matching.where import refusal_message

# Sub-program primitives entered by the interpreter, and the parameter holding their jaxpr.
_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
          "remat2": "jaxpr", "checkpoint": "jaxpr", "custom_jvp_call": "call_jaxpr",
          "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr"}
_CUSTOM = {"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"}
# Deterministic primitives evaluated at trace time when their inputs are scalar constants, so that
# `max(x, broadcast(0.0))` is recognised as a ReLU. Shape-only: no rounding can differ, and XLA
# folds such constants anyway (larger constants are left to XLA: the program stays fn's).
_FOLD = {"broadcast_in_dim", "convert_element_type", "reshape", "squeeze", "expand_dims",
         "transpose", "copy", "copy_p"}
# A custom sub-program using one of these is taken as non-affine (a relu) without a try.
_NONLINEAR = {"max", "min", "gt", "ge", "lt", "le"}
_CMP = {"gt": (True, False), "ge": (True, False), "lt": (False, True), "le": (False, True)}
# Primitives that draw random numbers (jax.random.bernoulli / uniform / normal, and so
# nn.Dropout(deterministic=False)): a value they reach is a draw, and a draw meeting a random
# (Gaussian) value is refused the same way in both modes (one draw would fix one mask or noise
# for every moment: the moments of fn given that draw, not of fn).
_DRAWS = {"random_bits", "threefry2x32", "rng_bit_generator", "rng_uniform"}
_DRAW_HINT = ("moment matching pushes a Gaussian through a deterministic function. For "
              "nn.Dropout pass deterministic=True (your module's evaluation mode, e.g. "
              "train=False); to condition on one mask, draw it outside and pass it to fn as an "
              "argument.")

SUPPORTED = ("dot_general / matmul / einsum with deterministic weights, add, sub, mul and div by "
             "deterministic values, neg, sum, cumsum, reshape, broadcast, transpose, squeeze, "
             "slice, pad, concatenate, gather / dynamic_slice with deterministic indices, select "
             "with a deterministic mask, float casts, relu (jax.nn.relu, jnp.maximum(x, 0), "
             "jnp.where(x > 0, x, 0)), leaky relu (jax.nn.leaky_relu), x * x, x ** n and "
             "jnp.square (exact; covariance='full': n = 2), exp (exact, lognormal), x + x and "
             "x - x (exact), the sum of two random values (taken as independent, also when they "
             "share an input: a skip connection), the product of two random values that share no "
             "random input (exact); jit, custom_jvp, custom_vjp and checkpoint sub-calls are "
             "entered")
MAX_POWER = 8    # x ** n has an exact rule for 0 <= n <= MAX_POWER (closed_forms.power_moments)
# Binary operations that multiply two random values: refused when both depend on one random input
# (x * f(x) has no rule), exact when they share none (independent inputs).
_PRODUCTS = {"mul", "dot_general"}


class PropagateError(InvalidArgument):
  """propagate refuses fn: an operation with no moment rule for a random input (the message:
  moment_matching/where.py), or moments that are not a Gaussian's (door.MomentsError).
  `supported` lists every operation with a rule."""
  supported = SUPPORTED


class Sign:
  """The mask `x > 0` (or >=, <, <=, against zero) of a random x: only a select may use it."""
  __slots__ = ("x", "true_is_positive")

  def __init__(self, x, true_is_positive):
    self.x, self.true_is_positive = x, true_is_positive


class Unsupported(Exception):
  """Raised by a rule; the interpreter turns it into a PropagateError naming the equation.
  detail: what is refused (said on the message's first line); hint: what to do instead."""

  def __init__(self, detail="", hint=None):
    super().__init__(detail)
    self.hint = hint


def bind(eqn, ins):
  """Evaluate one equation on concrete or traced inputs, as jax.core.eval_jaxpr does."""
  params = eqn.primitive.get_bind_params(eqn.params)
  subfuns, params = params if isinstance(params, tuple) else ((), params)   # older jax: a pair
  with eqn.ctx.manager:
    out = eqn.primitive.bind(*subfuns, *ins, **params)
  return list(out) if eqn.primitive.multiple_results else [out]


def is_zero(x):
  """x is a constant known at trace time and all zeros."""
  if isinstance(x, jax.core.Tracer) or not isinstance(x, (np.ndarray, np.generic, jax.Array,
                                                          int, float)):
    return False
  return bool(np.all(np.asarray(x) == 0))


def _uses(jaxpr, names):
  """Whether jaxpr or a sub-jaxpr of it has an equation whose primitive is in `names`."""
  return any(eqn.primitive.name in names for eqn in jaxpr.eqns) or \
      any(_uses(getattr(sub, "jaxpr", sub), names) for sub in jcore.subjaxprs(jaxpr))


def source(x):
  """The random inputs (indices) a value depends on: its provenance (empty: deterministic)."""
  if isinstance(x, Sign):
    return x.x.src
  return getattr(x, "src", frozenset())


def _stamp(outs, ins, rules):
  """Give each new random output the union of its random inputs' provenance."""
  src = frozenset().union(*(source(x) for x in ins))
  for o in outs:
    if isinstance(o, rules.value_type) and not any(o is x for x in ins):
      o.src = src


def interpret(jaxpr, consts, args, rules, outer=()):
  """Evaluate `jaxpr` on args (arrays, Gauss-like values of `rules`, or Sign masks).

  Every random value carries `src`, the random inputs it depends on (propagate sets the inputs'),
  so that a product of two values sharing an input is refused rather than taken as independent.
  outer: the enclosing call equations (where an error points when this jaxpr's have no frame).
  Returns (outputs, affine): affine is False when a non-affine moment rule ran (relu, a product of
  two random values), i.e. when the means are not fn applied to the input means.
  """
  env = {}
  read = lambda v: v.val if isinstance(v, jcore.Literal) else env[v]  # noqa: E731
  for v, c in zip(jaxpr.constvars, consts):
    env[v] = c
  for v, a in zip(jaxpr.invars, args):
    env[v] = a
  affine = True
  drawn = set()                    # the variables whose value comes from a random draw
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    name = eqn.primitive.name
    from_draw = any(isinstance(v, jcore.Var) and v in drawn for v in eqn.invars)
    if not any(isinstance(x, (rules.value_type, Sign)) for x in ins):
      if from_draw or name in _DRAWS or (name in _CALLS and _uses(
          getattr(eqn.params[_CALLS[name]], "jaxpr", eqn.params[_CALLS[name]]), _DRAWS)):
        drawn.update(v for v in eqn.outvars if not isinstance(v, jcore.DropVar))
      if name in _FOLD and all(not isinstance(x, jax.core.Tracer) and np.size(x) <= 1
                               for x in ins):
        with jax.ensure_compile_time_eval():
          outs = bind(eqn, ins)
      else:
        outs = bind(eqn, ins)
    elif from_draw:
      error = PropagateError(refusal_message(
          eqn, "one of its operands is a random draw made inside fn (a dropout mask, noise: "
          "nn.Dropout(deterministic=False)?), and one draw would stand for every sample of the "
          "Gaussian", rules.caller, outer, _DRAW_HINT))
      error.primitive = name
      raise error
    elif name in _CALLS:
      sub = eqn.params[_CALLS[name]]
      sub_jaxpr, sub_consts = (sub.jaxpr, sub.consts) if hasattr(sub, "consts") else (sub, ())
      means = None
      rebind = name in _CUSTOM and not any(isinstance(x, Sign) for x in ins) and \
          not _uses(sub_jaxpr, _NONLINEAR)
      # The means of an affine sub-program are the sub-program on the means: called as the
      # custom function itself, so that its custom derivative rule (e.g. critics.matmul's) is the
      # one differentiated, as in the plain function. Called before the variance is computed
      # (mm_linear's order), or after when a slab's kernel rows get sliced (MMDense slices them
      # first), so that gradients add up in the hand-written layers' order, bit for bit.
      slab = any(getattr(x, "slab", None) is not None for x in ins)
      if rebind and not slab:
        means = bind(eqn, [rules.mean_of(x) for x in ins])
      outs, sub_affine = interpret(sub_jaxpr, sub_consts, ins, rules, (*outer, eqn))
      affine = affine and sub_affine
      if rebind and slab and sub_affine:
        means = bind(eqn, [rules.mean_of(x) for x in ins])
      if means is not None and sub_affine:
        outs = [_with_mean(rules, o, m) for o, m in zip(outs, means)]
    else:
      try:
        outs, eqn_affine = apply_rule(eqn, ins, rules)
      except Unsupported as err:
        error = PropagateError(refusal_message(eqn, str(err), rules.caller, outer, err.hint))
        error.primitive = name
        raise error from None
      _stamp(outs, ins, rules)
      affine = affine and eqn_affine
    for v, o in zip(eqn.outvars, outs):
      if not isinstance(v, jcore.DropVar):
        env[v] = o
  return [read(v) for v in jaxpr.outvars], affine


def _with_mean(rules, o, mean):
  if not isinstance(o, rules.value_type):
    return o
  new = rules.with_mean(o, mean)
  new.src = o.src
  return new


def _labels(rules, src):
  names = getattr(rules, "labels", None) or {}
  return ", ".join(names.get(i, f"random input {i}") for i in sorted(src))


def _whole_exponent(ins):
  """x ** 2.0 (pow with a constant whole exponent) as integer_pow's n; else None."""
  y = ins[1]
  if isinstance(y, jax.core.Tracer) or np.ndim(y) != 0 or not isinstance(
      y, (np.ndarray, np.generic, jax.Array, int, float)):
    return None
  y = float(np.asarray(y))
  return int(y) if y == int(y) and abs(y) <= 1e6 else None


def _same_value_rule(eqn, ins, rules):
  """x combined with itself, or x ** n / exp(x): exact rules; None when none applies."""
  name, vt = eqn.primitive.name, rules.value_type
  x = ins[0]
  if not isinstance(x, vt):
    return None
  plain = lambda: bind(eqn, [rules.mean_of(y) for y in ins])[0]  # noqa: E731
  if name in ("mul", "square") and (name == "square" or x is ins[1]):
    return [rules.power(x, 2, plain())], False
  n = eqn.params["y"] if name == "integer_pow" else _whole_exponent(ins) if name == "pow" else None
  if n is not None:
    if n < 0:
      raise Unsupported(f"x ** {n}: the reciprocal of a Gaussian has no finite moments")
    if n > MAX_POWER:
      raise Unsupported(f"x ** {n}: powers above {MAX_POWER} have no rule (their moments' "
                        "coefficients overflow float32)")
    if n == 0:
      return [plain()], True
    return [x if n == 1 else rules.power(x, n, plain())], n == 1
  if name == "exp":
    return [rules.exp(x, lambda m: bind(eqn, [m])[0])], False
  if name in ("add", "add_any", "sub") and x is ins[1]:
    # x + x = 2 x (variance 4 v), x - x = 0 exactly: not two independent values.
    return ([rules.scale(x, 2.0, plain())] if name != "sub" else [plain()]), True
  return None


def apply_rule(eqn, ins, rules):
  """The moment rule of one equation with at least one random input: (outputs, affine)."""
  name, out_shape = eqn.primitive.name, eqn.outvars[0].aval.shape
  vt = rules.value_type
  same = _same_value_rule(eqn, ins, rules)
  if same is not None:
    return same
  if name in _PRODUCTS and len(ins) == 2 and all(isinstance(x, vt) for x in ins):
    shared = source(ins[0]) & source(ins[1])
    if shared:
      raise Unsupported(
          f"two random values multiplied that both depend on {_labels(rules, shared)}, as in "
          "x * f(x)", hint="they are correlated, and the moments of their product have no rule "
          "(taking them as independent would be silently wrong). x * x, x ** n and "
          "jnp.square(x) are exact, and so is a product of values from independent random "
          "inputs; rewrite the product in one of these forms, or estimate its moments by Monte "
          "Carlo (mombo_jax.mc_moments).")
  if name in _CMP and len(ins) == 2:
    x, y = ins
    if isinstance(x, vt) and is_zero(y):
      return [Sign(x, _CMP[name][0])], True
    if isinstance(y, vt) and is_zero(x):
      return [Sign(y, _CMP[name][1])], True
    raise Unsupported("a comparison is supported only as the mask of a relu: x > 0")
  if any(isinstance(x, Sign) for x in ins):
    if name != "select_n" or not isinstance(ins[0], Sign) or len(ins) != 3:
      raise Unsupported("a random value's sign may only pick between x and 0 or x and a * x")
    sign = ins[0]
    pos, neg = (ins[2], ins[1]) if sign.true_is_positive else (ins[1], ins[2])
    if pos is sign.x:
      if is_zero(neg):
        return [rules.relu(sign.x)], False
      if isinstance(neg, vt) and neg.scaled is not None and neg.scaled[0] is sign.x:
        return [rules.leaky_relu(sign.x, neg.scaled[1])], False
    raise Unsupported("a random value's sign may only pick between x and 0 or x and a * x")
  if name in ("max", "min"):
    x, c = ins if isinstance(ins[0], vt) else ins[::-1]
    if isinstance(c, vt):
      raise Unsupported("the max or min of two random values")
    if is_zero(c):
      return [rules.broadcast(rules.relu(x) if name == "max" else
                              rules.neg(rules.relu(rules.neg(x))), out_shape)], False
    # max(x, c) = c + relu(x - c); min(x, c) = c - relu(c - x).
    shifted = rules.add_det(x, c, lax.sub) if name == "max" else \
        rules.add_det(rules.neg(x), c, lax.add)
    r = rules.relu(shifted)
    return [rules.add_det(r, c, lax.add) if name == "max" else
            rules.add_det(rules.neg(r), c, lax.add)], False
  return rules.apply(eqn, ins)


def float_mean(mean):
  """A random input's mean as a float array (both modes lift their inputs through this), or one
  error saying how to cast it."""
  mean = jnp.asarray(mean)
  if not jnp.issubdtype(mean.dtype, jnp.floating):
    raise InvalidArgument(f"propagate: a random input's mean must be a float array, got "
                          f"{mean.dtype}; cast it with .astype(jnp.float32).")
  return mean
