"""Eager propagate(...)(...) against the same call jitted by the user, and the cost of the value
checks (issue #49: eager calls were ~20x the jitted ones; check_input on a [256, 256, 256]
covariance took 2.1 s). The numbers docs/moment_matching.md ("What is checked before any work",
"Eager calls") and moment_matching/door.py quote.

  python3 -m benchmarks.bench_propagate_eager [--out=benchmarks/bench_propagate_eager.txt]
      [--width=256] [--batch=256] [--reps=3]

The network: a Flax MLP of two hidden ReLU layers of `width` on an input of `width` features
(benchmarks/bench_propagate.py's _MLP), batch `batch`; the input N(mean, var) with a diagonal
variance, or a full covariance [batch, width, width] of rank 16 plus a small diagonal.

Part 1, per mode: the first eager call (interpreted op by op: what every eager call cost on
ffc5631), the second (compiled and cached: moment_matching/propagate.py _compiled), the median of
`reps` later eager calls (10 x reps in the diagonal mode), and the median of as many calls of
jax.jit(propagate(...)) after its compilation, the two alternated so that both see the same load;
"eager / jit" is the ratio of the last two. Each eager call includes the value checks.

Part 2, the value checks of one [batch, width, width] covariance: the float64 host check
(door._check_psd with the device path off: what ffc5631 ran) and the default check (first on the
device in float32, the host only on failure), each the median of `reps` calls after a warm-up;
beside them one layer's covariance product W^T C W (jitted), the unit the docs compare with.
"""
import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench_propagate import _MLP
from benchmarks.common import Record, record_start
from mombo_jax.moment_matching import door
from mombo_jax.moment_matching.propagate import propagate


def _seconds(fn):
  t = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t


def _inputs(width, batch):
  rng = np.random.default_rng(0)
  mean = jnp.asarray(rng.normal(size=(batch, width)), jnp.float32)
  var = jnp.asarray(rng.uniform(0.01, 0.1, size=(batch, width)), jnp.float32)
  factor = rng.normal(size=(batch, width, 16)) * 0.1
  cov = np.einsum("bik,bjk->bij", factor, factor) + np.eye(width) * 0.01
  return mean, var, jnp.asarray(cov, jnp.float32)


def eager_table(out, width, batch, reps):
  net = _MLP(depth=2, width=width)
  mean, var, cov = _inputs(width, batch)
  params = net.init(jax.random.PRNGKey(0), mean)
  out(f"Part 1: eager propagate(net.apply, argnums=1, covariance=...)(params, (mean, var)), MLP "
      f"{width} -> {width} -> {width} -> 4, batch {batch} (seconds)")
  out("| mode | 1st eager (interpreted) | 2nd eager (compiles) | later eager (median) | jitted "
      "(median) | jit compile | eager / jit |")
  out("|---|---|---|---|---|---|---|")
  for mode, v in (("diagonal", var), ("full", cov)):
    call = lambda: propagate(net.apply, argnums=1, covariance=mode)(params, (mean, v))  # noqa
    first, second = _seconds(call), _seconds(call)
    jitted = jax.jit(propagate(net.apply, argnums=1, covariance=mode))
    compile_s = _seconds(lambda: jitted(params, (mean, v)))
    # Alternated, so that both see the same load (the machine is shared).
    pairs = [(_seconds(call), _seconds(lambda: jitted(params, (mean, v))))
             for _ in range(reps if mode == "full" else 10 * reps)]
    later, jit_s = (statistics.median(t) for t in zip(*pairs))
    same = np.allclose(call()[0], jitted(params, (mean, v))[0], rtol=1e-5, atol=1e-6)
    out(f"| {mode} | {first:.3f} | {second:.3f} | {later:.4f} | {jit_s:.4f} | {compile_s:.2f} | "
        f"{later / jit_s:.2f}x |" + ("" if same else " (means differ!)"))


def check_table(out, width, batch, reps):
  _, _, cov = _inputs(width, batch)
  out()
  out(f"Part 2: the value checks of a [{batch}, {width}, {width}] float32 covariance (seconds, "
      f"median of {reps})")

  def host():
    saved, door._DEVICE_CHECK_D = door._DEVICE_CHECK_D, 10 ** 9
    try:
      door._check_psd("x", cov)
    finally:
      door._DEVICE_CHECK_D = saved

  def default():
    door.check_input("x", jnp.zeros(cov.shape[:-1]), cov, True)

  w = jnp.asarray(np.random.default_rng(1).normal(size=(width, width)), jnp.float32)
  product = jax.jit(lambda c: jnp.matmul(w.T, jnp.matmul(c, w)))
  rows = [("float64 host check (ffc5631's)", host), ("default check (device first)", default),
          ("one layer's W^T C W (jitted)", lambda: product(cov))]
  times = {}
  for name, fn in rows:
    _seconds(fn)
    times[name] = statistics.median(_seconds(fn) for _ in range(reps))
  unit = times["one layer's W^T C W (jitted)"]
  out("| what | seconds | x one layer's W^T C W |")
  out("|---|---|---|")
  for name, _ in rows:
    out(f"| {name} | {times[name]:.4f} | {times[name] / unit:.2f} |")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--width", type=int, default=256)
  p.add_argument("--batch", type=int, default=256)
  p.add_argument("--reps", type=int, default=3)
  p.add_argument("--out", default=None)
  args = p.parse_args()
  out = Record(args.out)
  record_start(out, "bench_propagate_eager", "eager propagate against jitted, and the value "
               "checks", args)
  out()
  eager_table(out, args.width, args.batch, args.reps)
  check_table(out, args.width, args.batch, args.reps)


if __name__ == "__main__":
  main()
