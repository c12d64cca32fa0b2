"""propagate(fn): the moment-matched twin of a plain JAX function (paper Algorithm 1 for any net).

API
  propagate(fn, argnums=0, covariance="diagonal", check_values=True, relu_covariance=None) -> g
    g takes fn's arguments, except that each argument at `argnums` is a pair (mean, var) of
    arrays (or of matching pytrees) describing a Gaussian input, and returns fn's output with
    every array y replaced by a pair (mean, var) of y's first two moments ("full": (mean, cov),
    full.py). Deterministic outputs come back with zero variance.

How: g traces fn to a jaxpr (jax.make_jaxpr, on the arguments' shapes) and evaluates that jaxpr
(interpreter.interpret, with this module's DiagonalRules) once, replacing each value that
depends on a random argument by its moments. Values that do not depend on one (the parameters, their
transposes, ...) are computed exactly as fn computes them. The rules, for a random x ~ N(m, v)
(diagonal: independent coordinates, the paper's assumption after every layer) and deterministic c:

  exact    x @ c, c @ x (dot_general: mean m @ c, variance v @ c^2), x + c, x - c, x * c, x / c,
           -x, sum, cumsum, reshape / broadcast / transpose / squeeze / slice / pad / concatenate /
           gather / dynamic_slice with deterministic indices, select with a deterministic mask,
           dtype casts between floats;
  Lemma 1  relu in any spelling (jax.nn.relu, jnp.maximum(x, 0), max(x, c), min(x, c),
           jnp.where(x > 0, x, 0)) via moments.mm_relu, leaky relu (jax.nn.leaky_relu,
           jnp.where(x >= 0, x, a * x)) via moments.mm_leaky_relu;
  itself   x * x, x ** 2, jnp.square (mean m^2 + v, variance 4 m^2 v + 2 v^2), x ** n, exp
           (lognormal), x + x, x - x: exact for a Gaussian x (closed_forms.py);
  two      every random value carries `src`, the random inputs (leaves) it depends on. Two random
           values x, y meeting in one operation: a product (x * y, x @ y) is exact when they share
           no input (independent: Var[x y] = v_x v_y + v_x m_y^2 + v_y m_x^2) and refused when
           they share one (x * f(x): correlated, no rule); a sum or concatenation is taken as
           independent either way (Var[x + y] = v_x + v_y): a skip connection y = x + f(x) drops
           Cov(x, f(x)), the paper's independence assumption (tests/test_propagate_mc.py reports
           the resulting error; docs/moment_matching.md states it).

Sub-programs are entered: jit (pjit), custom_jvp (jax.nn.relu, ...), custom_vjp (critics.matmul),
checkpoint. Where a custom_jvp / custom_vjp sub-program is affine in its random inputs, its mean
is that sub-program called on the means, so gradients go through its own rule, as in the plain
function. Any other primitive with a random input raises PropagateError naming the user's line, the
layer or library function it called, then the primitive, and what to do (where.py).
The inputs are checked before any work (door.py: shapes always, values when concrete, and under
jit with check_values="checkify"). An eager call seen before (same fn, settings and input shapes)
runs compiled (_compiled below): 1.2-1.5x a jitted call at width 256, where the interpreted
call is ~2,000x in the diagonal mode (benchmarks/bench_propagate_eager.txt).

Exactness: zero input variance gives fn's output bit for bit and variance exactly 0 (the means are
fn's own operations; mm_relu(m, 0) == (relu(m), 0)); a Flax Dense/ReLU stack equals the
hand-written moments.mm_linear / mm_relu chain bit for bit, gradients included (tests/
test_propagate.py). g composes with jit, vmap and grad: it is plain JAX at trace time. Concatenating
a random input with a deterministic one (the critic's state and action) keeps the deterministic
part out of the variance matmul, as critics.MMDense does, so the critic's moment-matched path is
propagate on the plain critic bit for bit, and compiles to the same optimised HLO
(benchmarks/bench_propagate.txt); the cost of propagate is its trace, once per jit compilation.
"""
import functools
from typing import Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mombo_jax.errors import InvalidArgument
from mombo_jax.moment_matching import full
from mombo_jax.moment_matching.closed_forms import exp_moments, power_moments
from mombo_jax.moment_matching.door import MomentsError, check_input  # noqa: F401
from mombo_jax.moment_matching.interpreter import (  # noqa: F401
  PropagateError,
  Sign,
  Unsupported,
  bind,
  float_mean,
  interpret,
)
from mombo_jax.moment_matching.moments import mm_leaky_relu, mm_relu
from mombo_jax.moment_matching.where import public_name


class Gauss:
  """A random value in the interpreted program: mean and diagonal variance (same shape).

  slab: None, or (axis, start, total): var holds only positions [start, start + var.shape[axis])
    of `axis`, of `total`; the rest is exactly 0 (a random value concatenated with deterministic
    ones), so dot_general can leave those kernel rows out, as critics.MMDense does.
  scaled: (x, c) when this value is x * c with x random and c deterministic (leaky relu's branch).
  """
  __slots__ = ("mean", "var", "slab", "scaled", "src")

  def __init__(self, mean, var, slab=None, scaled=None):
    self.mean, self.var, self.slab, self.scaled = mean, var, slab, scaled
    self.src = frozenset()     # the random inputs it depends on (interpreter.interpret)

  def full_var(self):
    """The variance of the whole value, zeros filled in where slab says so."""
    if self.slab is None:
      return self.var
    axis, start, total = self.slab
    pad = [(0, 0, 0)] * self.var.ndim
    pad[axis] = (start, total - start - self.var.shape[axis], 0)
    return lax.pad(self.var, jnp.zeros((), self.var.dtype), pad)


def _split_pair(arg, i):
  if not (isinstance(arg, (tuple, list)) and len(arg) == 2):
    raise InvalidArgument(f"propagate: argument {i} is random (in `argnums`), so it must be a "
                          f"(mean, var) pair, got {type(arg).__name__}; pass (x_mean, x_var).")
  return arg


def propagate(fn: Callable, argnums: Union[int, Sequence[int]] = 0,
              covariance: str = "diagonal", check_values: Union[bool, str] = True,
              relu_covariance: Optional[str] = None) -> Callable:
  """fn's moment-matched twin (see the module docstring).

  Args:
    fn: a function of arrays (pytrees of arrays), traceable by jax.make_jaxpr; fixed non-array
      arguments belong in a closure or functools.partial.
    argnums: the positions of the Gaussian arguments; each is passed as (mean, var) with mean and
      var pytrees of the same structure and shapes (var broadcastable to mean).
    covariance: "diagonal" (independent coordinates after every layer, the paper's Algorithm 1),
      or "full" (covariance over each value's last axis, see full.py): then var may be
      [..., d] (diagonal) or [..., d, d], and outputs are (mean [..., d], cov [..., d, d]).
    check_values: True: check concrete inputs' values before any work (finite, variances >= 0,
      a full covariance symmetric positive semi-definite; door.py says what is checked when);
      under jit the values are tracers and are not checked. "checkify": also under jit, as
      jax.experimental.checkify checks (wrap: checkify.checkify(jax.jit(g)), then err.throw()).
      False: none. Shapes are always checked.
    relu_covariance: with covariance="full" only, how a ReLU's cross covariances are computed
      (relu_covariance.py): "quadrature" (the default; within 5.7e-7 of s_i s_j) or "dvi" (Wu et
      al.'s closed form, within 1.45e-2 of s_i s_j; about half the cost at width 256,
      benchmarks/bench_propagate.txt).
  Returns:
    g(*args) -> fn's output pytree with each array y replaced by (mean [y.shape], var [y.shape])
    ("full": (mean [..., d], cov [..., d, d])).
  Raises (from g): door.MomentsError for moments that are not a Gaussian's, and
    PropagateError for an operation with no moment rule; both name the argument or the line.
  """
  if covariance == "diagonal" and relu_covariance is not None:
    raise InvalidArgument(f"propagate: relu_covariance={relu_covariance!r} applies to "
                          "covariance='full' only; drop it or pass covariance='full'.",
                          params=["relu_covariance"])
  if check_values not in (True, False, "checkify"):
    raise InvalidArgument(f"propagate: check_values={check_values!r} is not one of True, False, "
                          "'checkify'.", params=["check_values"])
  if covariance not in ("diagonal", "full"):
    raise InvalidArgument(f"propagate: covariance={covariance!r} is not one of 'diagonal', "
                          "'full'.", params=["covariance"])
  if covariance == "full":
    full.FullRules(relu_covariance or "quadrature")        # refuses an unknown relu_covariance
  nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)

  @functools.wraps(fn)
  def moments(*args):
    for i in nums:
      if not -len(args) <= i < len(args):
        raise InvalidArgument(f"propagate: argnums={argnums} but the function got {len(args)} "
                              "arguments.", params=["argnums"])
    random = {i % len(args) for i in nums}
    pairs = {i: _split_pair(args[i], i) for i in random}
    # The door: every random argument's structure, shapes (and values) before any work.
    var_lists = {i: check_input(f"argument {i}", *pairs[i], covariance == "full", check_values)
                 for i in sorted(random)}
    plain = [pairs[i][0] if i in random else a for i, a in enumerate(args)]
    leaves, tree = jax.tree.flatten(plain)
    flags = tuple(jax.tree.leaves([jax.tree.map(lambda _, r=i in random: r, a)
                                   for i, a in enumerate(plain)]))
    var_leaves = [v for i in range(len(args)) for v in var_lists.get(i, [])]
    labels = tuple(f"argument {i}" + (f" {jax.tree_util.keystr(path)}" if path else "")
                   for i in range(len(args)) if i in random
                   for path, _ in jax.tree_util.tree_flatten_with_path(pairs[i][0])[0])
    spec = (fn, covariance, relu_covariance, tree, flags, labels)
    compiled = _compiled(spec, leaves, var_leaves)
    if compiled is not None:
      try:
        return compiled(leaves, var_leaves)
      except Exception:         # noqa: BLE001  (the interpreted call below raises it, or answers)
        _COMPILED[_key(spec, leaves, var_leaves)] = _EAGER
    return _evaluate(spec, leaves, var_leaves)

  return moments


def _evaluate(spec, leaves, var_leaves):
  """fn's moments at the flat inputs: fn traced to a jaxpr, the jaxpr interpreted on moments."""
  fn, covariance, relu_covariance, tree, flags, labels = spec
  rules = DiagonalRules() if covariance == "diagonal" else \
      full.FullRules(relu_covariance or "quadrature")
  var_leaves, labels = iter(var_leaves), iter(labels)
  shapes = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in leaves]
  flat_fn = lambda *xs: fn(*jax.tree.unflatten(tree, xs))  # noqa: E731
  closed, out_shape = jax.make_jaxpr(flat_fn, return_shape=True)(*shapes)
  # jax records no frame above make_jaxpr: a library function passed as fn is named instead.
  rules.caller = public_name(fn)
  rules.labels = {}
  inputs = []
  for k, (x, r) in enumerate(zip(leaves, flags)):
    if r:   # provenance: each random leaf is its own independent input
      x = rules.lift(x, next(var_leaves))
      x.src, rules.labels[k] = frozenset([k]), next(labels)
    inputs.append(x)
  outs, _ = interpret(closed.jaxpr, closed.consts, inputs, rules)
  if any(isinstance(o, Sign) for o in outs):
    raise PropagateError("propagate: fn returns a comparison of a random value (x > 0), which "
                         "has no Gaussian moments; return x itself or compute the mask outside.")
  pairs_out = [rules.output(o) if isinstance(o, rules.value_type) else rules.constant(o)
               for o in outs]
  return jax.tree.unflatten(jax.tree.structure(out_shape), pairs_out)


# Eager calls. Interpreting fn's jaxpr op by op outside jit dispatches every operation on its own
# (20x-2,000x a jitted call at width 256: benchmarks/bench_propagate_eager.txt), so a call on
# concrete inputs that was seen before (the same fn, settings, tree and input shapes) runs
# _evaluate compiled, cached here; the first call stays interpreted, so that one-off calls
# compile nothing. A call under the user's own jit (tracer inputs) is traced as before: MOMBO's
# training program never comes here. A compiled call that fails (a rule that needs a concrete
# value) is marked and answered interpreted, as on its first call.
_COMPILED = {}          # key -> None (seen once), _EAGER, or the jitted _evaluate
_EAGER = object()
_MAX_COMPILED = 32    # each entry holds its fn (and what fn closes over)


def _key(spec, leaves, var_leaves):
  return spec + tuple((jnp.shape(x), jnp.result_type(x)) for x in (*leaves, *var_leaves))


def _compiled(spec, leaves, var_leaves):
  """The jitted _evaluate for these inputs, or None (traced inputs, unhashable fn, a first
  call, or one known to need the interpreted path)."""
  if any(isinstance(x, jax.core.Tracer) or not hasattr(x, "shape")
         for x in (*leaves, *var_leaves)):
    return None
  try:
    key = _key(spec, leaves, var_leaves)
    entry = _COMPILED.get(key, False)
  except TypeError:                # an unhashable fn or leaf: stays interpreted
    return None
  if entry is False:
    if len(_COMPILED) >= _MAX_COMPILED:
      _COMPILED.pop(next(iter(_COMPILED)))
    _COMPILED[key] = None
    return None
  if entry is None:
    entry = _COMPILED[key] = jax.jit(functools.partial(_evaluate, spec))
  return None if entry is _EAGER else entry


class DiagonalRules:
  """Moment rules for diagonal Gaussians (Gauss values)."""
  value_type = Gauss
  caller = "an unknown line"   # where an error points when no user frame is known

  def lift(self, mean, var):
    mean = float_mean(mean)
    var = jnp.asarray(var, mean.dtype)
    if jnp.broadcast_shapes(var.shape, mean.shape) != mean.shape:
      raise InvalidArgument(f"propagate: var of shape {var.shape} does not fit mean of shape "
                            f"{mean.shape}; pass var of mean's shape.")
    return Gauss(mean, jnp.broadcast_to(var, mean.shape))

  def output(self, g):
    return g.mean, g.full_var()

  def constant(self, x):
    return x, jnp.zeros_like(x)

  def mean_of(self, x):
    return x.mean if isinstance(x, Gauss) else x

  def with_mean(self, g, mean):
    return Gauss(mean, g.var, g.slab)

  def broadcast(self, g, shape):
    if g.mean.shape == tuple(shape):
      return g
    return Gauss(jnp.broadcast_to(g.mean, shape), jnp.broadcast_to(g.full_var(), shape))

  def relu(self, g):
    return Gauss(*mm_relu(g.mean, g.full_var()))

  def leaky_relu(self, g, slope):
    return Gauss(*mm_leaky_relu(g.mean, g.full_var(), slope))

  def neg(self, g):
    return Gauss(lax.neg(g.mean), g.var, g.slab)

  def add_det(self, g, c, op):
    mean = op(g.mean, c)
    return Gauss(mean, jnp.broadcast_to(g.full_var(), mean.shape))

  def power(self, g, n, plain):
    """g ** n (n >= 2), exact for a Gaussian (closed_forms.power_moments); plain: fn's m ** n."""
    return Gauss(*power_moments(g.mean, g.full_var(), n, plain))

  def exp(self, g, plain_exp):
    return Gauss(*exp_moments(g.mean, g.full_var(), plain_exp))

  def scale(self, g, c, mean):
    """c * g for a Python number c, with mean fn's own (x + x)."""
    return Gauss(mean, g.full_var() * (c * c))

  def apply(self, eqn, ins):
    name = eqn.primitive.name
    shape = eqn.outvars[0].aval.shape
    rand = [isinstance(x, Gauss) for x in ins]
    mean_out = lambda: bind(eqn, [self.mean_of(x) for x in ins])[0]  # noqa: E731
    var_of = lambda x: x.full_var() if isinstance(x, Gauss) else None  # noqa: E731

    if name in ("add", "sub", "add_any"):
      mean = mean_out()
      if all(rand):
        return [Gauss(mean, jnp.broadcast_to(ins[0].full_var() + ins[1].full_var(), shape))], True
      g = ins[0] if rand[0] else ins[1]
      return [Gauss(mean, jnp.broadcast_to(g.full_var(), shape))], True
    if name == "neg":
      return [self.neg(ins[0])], True
    if name == "mul":
      mean = mean_out()
      if all(rand):
        (ma, va), (mb, vb) = [(x.mean, x.full_var()) for x in ins]
        return [Gauss(mean, jnp.broadcast_to(va * vb + va * (mb * mb) + vb * (ma * ma),
                                             shape))], False
      g, c = (ins[0], ins[1]) if rand[0] else (ins[1], ins[0])
      scaled = (g, c) if np.ndim(c) == 0 else None
      return [Gauss(mean, jnp.broadcast_to(g.full_var() * (c * c), shape), scaled=scaled)], True
    if name == "div":
      if rand[1]:
        raise Unsupported("division by a random value")
      return [Gauss(mean_out(), jnp.broadcast_to(ins[0].full_var() / (ins[1] * ins[1]),
                                                 shape))], True
    if name == "dot_general":
      return [self._dot(eqn, ins, mean_out())], not all(rand)
    if name == "concatenate":
      return [self._concatenate(eqn, ins, mean_out())], True
    if name == "pad":
      if rand[1]:
        raise Unsupported("a random padding value")
      var = lax.pad(ins[0].full_var(), jnp.zeros((), ins[0].var.dtype),
                    eqn.params["padding_config"])
      return [Gauss(mean_out(), var)], True
    if name == "select_n":
      if rand[0]:
        raise Unsupported("a mask computed from a random value other than x > 0")
      zero = jnp.zeros(shape, eqn.outvars[0].aval.dtype)
      var = lax.select_n(ins[0], *[var_of(x) if r else zero for x, r in zip(ins[1:], rand[1:])])
      return [Gauss(mean_out(), var)], True
    if name == "convert_element_type" and not jnp.issubdtype(eqn.params["new_dtype"],
                                                             jnp.floating):
      raise Unsupported(f"a cast of a random value to {eqn.params['new_dtype']}")
    if name in ("reshape", "broadcast_in_dim", "transpose", "squeeze", "expand_dims", "slice",
                "rev", "copy", "copy_p", "convert_element_type", "reduce_sum", "cumsum",
                "dynamic_slice", "gather", "reduce_precision"):
      if any(rand[1:]):
        raise Unsupported("a random value used as an index")
      var = bind(eqn, [ins[0].full_var()] + ins[1:])[0]
      return [Gauss(mean_out(), var)], True
    raise Unsupported("")

  def _dot(self, eqn, ins, mean):
    """x @ c: variance v @ c^2 (the same dot_general); x @ y: independent products summed."""
    a, b = ins
    (lc, rc), _ = eqn.params["dimension_numbers"]
    dot = lambda p, q: bind(eqn, [p, q])[0]  # noqa: E731
    if isinstance(a, Gauss) and isinstance(b, Gauss):
      va, vb = a.full_var(), b.full_var()
      return Gauss(mean, dot(va, vb) + dot(va, b.mean * b.mean) + dot(a.mean * a.mean, vb))
    g, c, g_dims, c_dims = (a, b, lc, rc) if isinstance(a, Gauss) else (b, a, rc, lc)
    var = g.var
    if g.slab is not None and g.slab[0] in g_dims:
      # Only the random rows of c enter the variance (critics.MMDense: kernel[:num_var]).
      axis, start = g.slab[:2]
      c = lax.slice_in_dim(c, start, start + var.shape[axis], axis=c_dims[list(g_dims).index(axis)])
    elif g.slab is not None:
      var = g.full_var()
    c2 = c * c
    return Gauss(mean, dot(var, c2) if g is a else dot(c2, var))

  def _concatenate(self, eqn, ins, mean):
    """A random block among deterministic ones keeps its variance as a slab (Gauss.slab)."""
    axis = eqn.params["dimension"]
    sizes = [np.shape(self.mean_of(x))[axis] for x in ins]
    rand = [i for i, x in enumerate(ins) if isinstance(x, Gauss)]
    first, last = rand[0], rand[-1]
    start, stop = sum(sizes[:first]), sum(sizes[:last + 1])
    parts = [x.full_var() if isinstance(x, Gauss) else
             jnp.zeros(np.shape(x), mean.dtype) for x in ins[first:last + 1]]
    var = parts[0] if len(parts) == 1 else lax.concatenate(parts, axis)
    if start == 0 and stop == sum(sizes):
      return Gauss(mean, var)
    return Gauss(mean, var, slab=(axis, start, sum(sizes)))

