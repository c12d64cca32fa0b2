"""The critics' scalar head: its weight gradient as XLA:CPU's gemv on x in place, or with x^T
written out as every wider layer's is (critics.matmul, critics.GEMV_FEATURES); and the alternatives
to the package's backward that were tried against it.

Run (repo root):  python3 -m benchmarks.bench_head_grad [--parts=dot,epoch]
                  [--algos=mopo,mombo,mobile] [--variants=written,gemv] [--steps=300]
                  [--rollout_batch=15000] [--rounds=6] [--out=FILE]

Part 1, the dot alone: the weight gradient x^T g of a layer of F output features at the critics'
shape (10 members, 256 rows, 256 inputs; a batched dot as in the vmapped step), both ways, for F
in 1, 2, 6, 16 (why the switch stops at 1). Part 2, the training epoch: per algorithm, one process
builds the one-cell epoch program (cells_program.make_cells_chunk, what runs use) once per
variant, calls them in alternation round after round (order reversed every other round) and
records each one's median seconds and the median of its per-round ratios to the first variant
listed, with how many of the state's leaves differ from its after one epoch. Variants:
  written      every weight gradient with x^T written out, the heads' too (GEMV_FEATURES = 0)
  gemv         the package's backward (the heads' weight gradient in place)
  gradients_t  the backward with the cotangent transposed instead, g^T [F, R] written once:
               dx^T = kernel g^T and dkernel^T = g^T x are then standard dots without kernel^T or
               x^T, and dx, dkernel are handed on transposed (to the ReLU's and Adam's fusions)
  xla:NAME=V[+NAME=V]  the package's backward compiled with more XLA options (e.g.
               xla:xla_cpu_prefer_vector_width=512); each V parsed as JSON where it can be
Work as bench_epoch_changes': 10 critics, actor and critics 3x256, batch 256, real ratio 0.05,
rollouts of --rollout_batch x 5 (retained 5 epochs), a random 7-member 4x200 ensemble, synthetic
hopper-shaped data (200,000 rows), float32, one seed.
"""
import argparse
import contextlib
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks.bench_epoch_changes import ROWS, build, synthetic
from mombo_jax.core import buffer, cells_program, critics, xla_options


@jax.custom_vjp
def _gradients_t_matmul(x, kernel):
  return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))


def _gradients_t_fwd(x, kernel):
  return _gradients_t_matmul(x, kernel), (x, kernel)


def _gradients_t_bwd(residuals, g):
  x, kernel = residuals
  rows, grads = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
  barrier = jax.lax.optimization_barrier
  grads_t = barrier(grads.T)                                                      # [F, R]
  dx_t = barrier(jax.lax.dot_general(kernel, grads_t, (((1,), (0,)), ((), ()))))  # [I, R]
  dkernel_t = barrier(jax.lax.dot_general(grads_t, rows, (((1,), (0,)), ((), ()))))  # [F, I]
  return dx_t.T.reshape(x.shape), dkernel_t.T


_gradients_t_matmul.defvjp(_gradients_t_fwd, _gradients_t_bwd)


def _xla_extra(name):
  """{option: value} of an `xla:NAME=V[+NAME=V]` variant (each V parsed as JSON where it can be)."""
  extra = {}
  for item in name[4:].split("+"):
    key, _, value = item.partition("=")
    try:
      extra[key] = json.loads(value)
    except ValueError:
      extra[key] = value
  return extra


def _bad_flag(args):
  """What is wrong with the flags (one sentence naming the fix), or None; checked before any
  work."""
  parts = args.parts.split(",")
  if not set(parts) <= {"dot", "epoch"}:
    return f"--parts={args.parts}: use dot, epoch or dot,epoch"
  if "epoch" in parts:
    for algo in args.algos.split(","):
      if algo not in ("mopo", "mombo", "mobile"):
        return f"--algos: unknown algorithm {algo!r}; use mopo, mombo and/or mobile"
    for name in args.variants.split(","):
      if name.startswith("xla:"):
        extra = _xla_extra(name)
        if not all(extra) or xla_options._accepted(tuple(sorted(
            {**xla_options._CPU_OPTIONS, **extra}.items()))) is None:
          return f"--variants: this XLA refuses the options of {name!r} ({extra})"
      elif name not in ("written", "gemv", "gradients_t"):
        return (f"--variants: unknown variant {name!r}; use written, gemv, gradients_t or "
                "xla:NAME=V[+NAME=V]")
  return None


@contextlib.contextmanager
def variant(name):
  """The package set up as variant `name` (module docstring) while its program is traced."""
  saved = (critics.GEMV_FEATURES, critics.matmul, dict(xla_options._CPU_OPTIONS))
  try:
    if name == "written":
      critics.GEMV_FEATURES = 0
    elif name == "gradients_t":
      critics.matmul = _gradients_t_matmul
    elif name.startswith("xla:"):
      xla_options._CPU_OPTIONS = dict(saved[2], **_xla_extra(name))
      xla_options._accepted.cache_clear()
    cells_program._cells_chunk.cache_clear()   # programs are cached per config: build each anew
    yield
  finally:
    critics.GEMV_FEATURES, critics.matmul = saved[0], saved[1]
    xla_options._CPU_OPTIONS = saved[2]
    xla_options._accepted.cache_clear()
    cells_program._cells_chunk.cache_clear()


def _dot_seconds(fn, *args, calls=300):
  """Median seconds of one call of the compiled fn."""
  compiled = xla_options.jit(fn).lower(*args).compile()
  jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(calls):
    t = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t)
  return float(np.median(times))


def dot_part(out):
  out("## Part 1: the weight gradient x^T g alone, x [10, 256, 256], g [10, 256, F] (ms, median "
      "of 300 calls)")
  out("| F | x^T written out, then Eigen's dot | x's rows contracted in place | in place / "
      "written |")
  out("|---|---|---|---|")
  dims = lambda lhs: (((lhs,), (1,)), ((0,), (0,)))  # noqa: E731
  written = lambda x, g: jax.lax.dot_general(  # noqa: E731
      jax.lax.optimization_barrier(jnp.swapaxes(x, 1, 2)), g, dims(2))
  in_place = lambda x, g: jax.lax.dot_general(x, g, dims(1))  # noqa: E731
  x = jax.random.normal(jax.random.PRNGKey(0), (10, 256, 256))
  for features in (1, 2, 6, 16):
    g = jax.random.normal(jax.random.PRNGKey(features), (10, 256, features))
    np.testing.assert_allclose(written(x, g), in_place(x, g), rtol=1e-4, atol=1e-3)
    a, b = _dot_seconds(written, x, g), _dot_seconds(in_place, x, g)
    out(f"| {features} | {a * 1e3:.3f} | {b * 1e3:.3f} | **{b / a:.2f}** |")


def epoch_part(algo, args, real, out):
  config, state, stacked, cells, keys = build(algo, args, real)
  v = {}
  for name in args.variants.split(","):
    with variant(name):
      compiled = cells_program.make_cells_chunk(config, 1, 1).lower(
          jax.tree.map(jnp.asarray, state), stacked, keys, cells, 0, 1).compile()
    first, _ = jax.block_until_ready(compiled(jax.tree.map(jnp.asarray, state), stacked, keys,
                                              cells, 0, 1))
    v[name] = dict(fn=compiled, state=first, first=jax.device_get(first), times=[], epoch=1)
  first_name = next(iter(v))
  ref = v[first_name]["first"]
  leaves = len(jax.tree.leaves(ref))

  def one_epoch(name, x):
    x["state"], _ = jax.block_until_ready(x["fn"](x["state"], stacked, keys, cells, x["epoch"], 1))

  common.alternate(v, args.rounds, one_epoch, algo, out)
  rows = []
  for name, x in v.items():
    ratio = common.median_ratio(x["times"], v[first_name]["times"])
    differ = leaves - common.equal_leaves(x["first"], ref)
    rows.append(f"| {algo} | {name} | {np.median(x['times']):.2f} | **{ratio:.3f}** | "
                f"{differ} of {leaves} |")
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--parts", default="dot,epoch")
  p.add_argument("--algos", default="mopo,mombo,mobile")
  p.add_argument("--variants", default="written,gemv")
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--rollout_batch", type=int, default=15_000)
  p.add_argument("--rounds", type=int, default=6)
  p.add_argument("--out", default=None)
  args = p.parse_args()
  problem = _bad_flag(args)
  if problem:
    raise SystemExit(f"error: {problem}")
  out = common.Record(args.out)
  common.record_start(out, "bench_head_grad", "the critics' scalar head's weight gradient, in "
                      "place or with x^T written out", args)
  if "dot" in args.parts.split(","):
    dot_part(out)
  if "epoch" not in args.parts.split(","):
    return
  real = buffer.from_transitions(synthetic(ROWS))
  out("")
  out(f"## Part 2: one training epoch ({args.steps} gradient steps + a {args.rollout_batch} x 5 "
      "rollout), 1 cell")
  table = []
  for algo in args.algos.split(","):
    table += epoch_part(algo, args, real, out)
  out("")
  first = args.variants.split(",")[0]
  out(f"| algorithm | variant | median s | x {first} (median of rounds' ratios) | "
      f"state leaves differing from {first}'s after one epoch |")
  out("|---|---|---|---|---|")
  for row in table:
    out(row)
  out(f"load at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
  main()
