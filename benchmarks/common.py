"""Measurements shared by the benchmarks: this machine's matmul throughput, XLA's FLOP count of a
compiled call, a FLOP count from the jaxpr that multiplies loop bodies by their trip counts, and a
report printed and written to its record."""
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np


def matmul_gflops(rows: int, width: int, seconds: float = 5.0, chain: int = 64) -> float:
  """This machine's float32 matmul throughput (GFLOP/s) at a network layer's shapes: the best of
  repeated jitted chains of [rows, width] x [width, width] products over `seconds`. At these
  (small) shapes the figure includes XLA's per-op overhead, so it bounds what a train step of such
  layers can reach better than the CPU's peak does."""
  x = jnp.ones((rows, width), jnp.float32)
  w = jnp.full((width, width), 1.0 / width, jnp.float32)

  @jax.jit
  def products(x, w):
    return jax.lax.fori_loop(0, chain, lambda _, y: y @ w, x)

  products(x, w).block_until_ready()
  flops = 2.0 * rows * width * width * chain
  best, t_end = 0.0, time.perf_counter() + seconds
  while time.perf_counter() < t_end:
    t = time.perf_counter()
    products(x, w).block_until_ready()
    best = max(best, flops / (time.perf_counter() - t))
  return best / 1e9


def xla_flops(compiled) -> float:
  """FLOPs of one call of a compiled function (jax `.lower(...).compile()`), by XLA's cost
  analysis. A while loop's body counts once, whatever its trip count: count a scan's step on its
  own and multiply."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost["flops"])


# Elementwise primitives counted as one FLOP per output element (where an input is floating point),
# as XLA's cost analysis counts them; transcendental ones included (XLA lists those apart).
_ELEMENTWISE = frozenset("""
  add add_any sub mul div rem neg abs sign max min pow integer_pow square sqrt rsqrt cbrt exp exp2
  log log1p expm1 tanh logistic erf erfc erf_inv sin cos tan atan2 floor ceil round clamp select_n
  eq ne lt le gt ge is_finite nextafter""".split())
# Reductions: one FLOP per input element.
_REDUCTIONS = frozenset("""reduce_sum reduce_max reduce_min reduce_prod argmax argmin cumsum cummax
  cummin cumprod cumlogsumexp""".split())


def _size(aval) -> int:
  return math.prod(getattr(aval, "shape", ()))


def _is_float(aval) -> bool:
  dtype = getattr(aval, "dtype", None)
  return dtype is not None and jnp.issubdtype(dtype, jnp.inexact)


def _sub_jaxprs(params):
  """The jaxprs nested in an equation's params (pjit, custom_jvp/vjp, shard_map, remat, ...)."""
  for value in params.values():
    for v in value if isinstance(value, (tuple, list)) else (value,):
      inner = getattr(v, "jaxpr", v)
      if hasattr(inner, "eqns"):
        yield inner


def _jaxpr_flops(jaxpr) -> float:
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "scan":
      total += eqn.params["length"] * _jaxpr_flops(eqn.params["jaxpr"].jaxpr)
    elif name == "cond":
      total += max(_jaxpr_flops(b.jaxpr) for b in eqn.params["branches"])
    elif name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2.0 * _size(eqn.outvars[0].aval) * math.prod(lhs[d] for d in contract)
    elif name in _ELEMENTWISE:
      if any(_is_float(v.aval) for v in eqn.invars):
        total += _size(eqn.outvars[0].aval)
    elif name in _REDUCTIONS:
      if _is_float(eqn.invars[0].aval):
        total += _size(eqn.invars[0].aval)
    else:   # while loops (trip count unknown: the body once), calls, custom derivatives
      total += sum(_jaxpr_flops(j) for j in _sub_jaxprs(eqn.params))
  return total


def jaxpr_flops(fn, *args) -> float:
  """FLOPs of one call fn(*args), counted on its jaxpr: 2 M N K per matrix product (dot_general,
  batch dims included), one per output element of floating-point elementwise ops, one per input
  element of reductions, unused equations left out; a scan's body times its length (XLA's cost
  analysis counts it once), a cond's costliest branch, a while loop's body once. Integer work (the
  RNG's threefry, index arithmetic), gathers, scatters and data movement count nothing. Tracing
  only: nothing runs."""
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  # Equations whose results nothing uses are left out, as XLA drops them: e.g. the primal call a
  # custom_vjp keeps beside its forward rule under differentiation (critics.matmul).
  from jax._src.interpreters import partial_eval as pe
  jaxpr, _ = pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))
  return _jaxpr_flops(jaxpr)


def cpu_name() -> str:
  """The CPU's model name (/proc/cpuinfo) and core count, for the hardware line of a record."""
  try:
    with open("/proc/cpuinfo") as f:
      name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    name = "unknown CPU"
  return f"{name}, {os.cpu_count()} cores"


def print_header(name: str):
  """The first lines of a record: the benchmark, the hardware, JAX's devices and the load."""
  print(f"# {name}")
  print(f"hardware: {cpu_name()}; devices: {jax.device_count()} x "
        f"{jax.devices()[0].device_kind} ({jax.default_backend()}); jax {jax.__version__}")
  print(f"load average at start: {os.getloadavg()[0]:.1f}")


def record_start(out, module: str, title: str, args):
  """The first lines of a record through `out`: the benchmark and its title, the command that
  reproduces it (every flag of `args` in its parser's order, --out left out), the machine, JAX and
  the load at the start."""
  flags = " ".join(f"--{k}={v}" for k, v in vars(args).items() if k != "out")
  out(f"# benchmarks/{module}.py: {title}")
  out(f"command: python3 -m benchmarks.{module} {flags}")
  out(f"machine: {cpu_name()}; jax {jax.__version__} ({jax.default_backend()}); load at "
      f"start {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


class Record:
  """Prints lines and appends them to --out as they come (a stopped run keeps what it measured)."""

  def __init__(self, path):
    self.file = open(path, "w") if path else None

  def __call__(self, line=""):
    print(line, flush=True)
    if self.file:
      self.file.write(line + "\n")
      self.file.flush()


def alternate(variants: dict, rounds: int, run, label: str, say):
  """Calls run(name, variant) for every variant, round after round, the order reversed every other
  round (so that load drifts fall on all alike); appends each call's seconds to variant["times"],
  counts variant["epoch"] up and says one line per round."""
  names = list(variants)
  for r in range(rounds):
    for name in (names if r % 2 == 0 else names[::-1]):
      x = variants[name]
      t = time.perf_counter()
      run(name, x)
      x["times"].append(time.perf_counter() - t)
      x["epoch"] += 1
    say(f"  {label} round {r + 1}: " + ", ".join(f"{n} {x['times'][-1]:.2f} s" for n, x in
                                                   variants.items())
        + f" (load {os.getloadavg()[0]:.1f})")


def median_ratio(times, reference_times) -> float:
  """The median of the per-round ratios times[i] / reference_times[i]."""
  return float(np.median([a / b for a, b in zip(times, reference_times)]))


def equal_leaves(tree, reference) -> int:
  """How many leaves of `tree` equal `reference`'s (same structure) bit for bit."""
  return sum(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(tree),
                                                  jax.tree.leaves(reference)))


def emit(lines, out=None):
  """Prints the report's lines and, where `out` names a file, writes them there (the record)."""
  report = "\n".join(lines)
  print(report)
  if out:
    with open(out, "w") as f:
      f.write(report + "\n")
