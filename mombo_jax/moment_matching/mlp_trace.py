"""A ReLU MLP's layers read from the network as it runs (moment_matching_bound's apply_fn): the
function traced to a jaxpr, and the chain x @ A_1 + b_1 -> relu -> ... -> x @ A_L + b_L read
from it in call order.

API
  read_mlp(apply_fn, x) -> [(kernel [I, O], bias [O]), ...]   in the order apply_fn calls them

Why a trace: parameters alone say neither the order the layers are called in (Flax numbers layers
as they are built: `nn.Dense(1)(nn.relu(nn.Dense(16)(x)))` builds the output layer first, so
Dense_0 is the last layer called) nor the activation between them. The trace says both. Only the
plain MLP is read: along the value that depends on x, a dot_general contracting its last axis with
a fixed 2-D kernel, an add of a fixed bias (optional), max(., 0) between layers (relu in any
spelling that lowers to it: jax.nn.relu, nn.relu, jnp.maximum(x, 0)), the last layer linear;
sub-programs (jit, custom_jvp, custom_vjp) are entered, and whatever does not depend on x (the
parameters' reshapes and casts) is computed as apply_fn computes it. Anything else on that value
(another activation, a normalisation, a skip connection that uses a value twice, a reshape) raises
ValueError naming the primitive and the layer it follows: the paper's bound is for this network
only, and a bound for another network is worse than none.

Shapes: B... = batch dims of x, I / O = a layer's input / output size.
"""
import jax
import numpy as np
from jax.extend import core as jcore

from mombo_jax.moment_matching.interpreter import bind

# Sub-program primitives, and the parameter holding their jaxpr (as the interpreter enters them).
_CALLS = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
          "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
          "custom_vjp_call_jaxpr": "fun_jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr"}
_SAME = {"copy", "copy_p"}    # the value itself


class _Run:
  """The value that depends on x: after how many layers, and where inside the current one
  ("input", "dot": after x @ A, "affine": after + b, "relu")."""

  def __init__(self, layers, stage):
    self.layers, self.stage, self.used = layers, stage, False


def _refuse(what, run):
  after = f"after layer {len(run.layers)} ({run.stage})" if run.layers else "on the input"
  raise ValueError(
      f"moment_matching_bound: apply_fn {what} {after}; the bound is the paper's for a plain ReLU "
      "MLP (Dense, relu, ..., Dense, the last layer linear) and is not returned for another "
      "network. Propagate its moments with mombo_jax.propagate (no bound), or bound the plain "
      "MLP part alone.")


def _fixed(x):
  return not isinstance(x, _Run)


def _eval(jaxpr, consts, args):
  env = {}
  read = lambda v: v.val if isinstance(v, jcore.Literal) else env[v]  # noqa: E731
  for v, c in zip(jaxpr.constvars, consts):
    env[v] = c
  for v, a in zip(jaxpr.invars, args):
    env[v] = a
  for eqn in jaxpr.eqns:
    ins = [read(v) for v in eqn.invars]
    name = eqn.primitive.name
    runs = [x for x in ins if isinstance(x, _Run)]
    if not runs:
      outs = bind(eqn, ins)
    elif name in _CALLS:
      sub = eqn.params[_CALLS[name]]
      outs = _eval(getattr(sub, "jaxpr", sub), getattr(sub, "consts", ()), ins)
    else:
      outs = [_step(eqn, ins, runs)]
    for v, o in zip(eqn.outvars, outs):
      if not isinstance(v, jcore.DropVar):
        env[v] = o
  return [read(v) for v in jaxpr.outvars]


def _step(eqn, ins, runs):
  """One primitive applied to the running value: the next stage, or a refusal."""
  name, run = eqn.primitive.name, runs[0]
  if len(runs) > 1 or run.used:
    _refuse(f"combines the network's value with itself or an earlier one (`{name}`: a skip "
            "connection or a gate)", run)
  run.used = True
  if name in _SAME or (name == "convert_element_type" and
                       eqn.params["new_dtype"] == eqn.invars[0].aval.dtype):
    return _Run(run.layers, run.stage)
  if name == "dot_general" and ins[0] is run and run.stage in ("input", "relu"):
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    kernel = np.asarray(ins[1]) if _fixed(ins[1]) else None
    if kernel is not None and kernel.ndim == 2 and tuple(lc) == (eqn.invars[0].aval.ndim - 1,) \
        and tuple(rc) == (0,) and not lb and not rb:
      return _Run(run.layers + [[ins[1], None]], "dot")
  if name == "add" and run.stage == "dot":
    bias = ins[1] if ins[0] is run else ins[0]
    out = run.layers[-1][0].shape[1]
    if np.size(bias) == out and np.shape(bias)[-1:] == (out,):
      layers = run.layers[:-1] + [[run.layers[-1][0], np.reshape(np.asarray(bias), (out,))]]
      return _Run(layers, "affine")
  if name == "max" and run.stage in ("dot", "affine"):
    other = ins[1] if ins[0] is run else ins[0]
    if np.all(np.asarray(other) == 0):
      return _Run(run.layers, "relu")
  if name in ("dot_general", "add", "max"):
    _refuse(f"applies `{name}` where the MLP has no such step", run)
  _refuse(f"applies JAX's `{name}` to the network's value", run)


def read_mlp(apply_fn, x) -> list:
  """[(kernel [I, O], bias [O]), ...]: the ReLU MLP apply_fn(x [B..., I]) -> [B..., O] runs, in
  call order (module docstring); x concrete. A layer without a bias gets zeros."""
  closed = jax.make_jaxpr(apply_fn)(x)
  start = _Run([], "input")
  outs = _eval(closed.jaxpr, closed.consts, [start])
  if len(outs) != 1 or _fixed(outs[0]):
    raise ValueError(f"moment_matching_bound: apply_fn returns {len(outs)} arrays"
                     f"{'' if len(outs) != 1 else ' that do not depend on x'}; it must return "
                     "the MLP's output, one array [B..., O].")
  end = outs[0]
  if not end.layers or end.stage not in ("dot", "affine"):
    _refuse("ends with a relu (the last layer must be linear)" if end.layers else
            "has no Dense layer", end)
  return [(np.asarray(k), np.zeros(np.shape(k)[1:], np.asarray(k).dtype) if b is None else b)
          for k, b in end.layers]
