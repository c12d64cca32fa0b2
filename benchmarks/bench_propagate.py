"""mombo_jax.propagate: its cost against the critic's hand-written moment-matched path, and the
diagonal and full-covariance modes' errors against Monte Carlo by depth and width, with the cost
of each (the table in docs/moment_matching.md).

  python benchmarks/bench_propagate.py [--out benchmarks/bench_propagate.txt] [--seconds 2]

Part 1, the critic: one CriticEnsemble (2 members, hidden [256, 256], batch 256, obs 17 +
action 6, as bench_moments.py), jitted: the moment-matched forward through its own path
(critic.apply(params, obs, act, obs_var)) and through propagate(critic.apply) on the plain
critic, and the gradient of the lcb-style loss mean - var w.r.t. the parameters through each.
The compiled programs are checked to give bit-identical outputs and to be the same optimised HLO
(instruction by instruction, names and source locations aside); times are medians of calls timed
round-robin, so their differences are the machine's noise. "trace + compile" is the one-off cost of
jit's first call.

Part 2, the error table: random Flax nn.Dense ReLU MLPs (input 8, output 4, Flax's default
init, biases N(0, 0.1^2)), depth 1-3 hidden layers of width 16 and 64; inputs N(x, diag var) with x
~ N(0, 1), var in {0.1, 1}, 16 rows each. Error against Monte Carlo (mc_moments, 1e5 samples,
float64 to keep the reference's own error below the table's precision): "mean err" is the median
over rows and outputs of |mean - mean_MC| / std_MC, "var err" the median of |var / var_MC - 1| (and
its 95th percentile). ms: one jitted float32 call on the 16 rows (median of round-robin calls),
"plain" the network itself, "MC 100" Monte Carlo with 100 samples.
"""
import argparse
import os
import platform
import re
import statistics
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from mombo_jax.core.critics import CriticEnsemble
from mombo_jax.core.monte_carlo import mc_moments
from mombo_jax.core.propagate import propagate

BATCH, OBS_DIM, ACT_DIM, HIDDEN = 256, 17, 6, (256, 256)


def _timed(rows, seconds):
  """Median ms of each (name, fn) over round-robin calls for ~`seconds` (after a warm-up)."""
  for _, fn in rows:
    jax.block_until_ready(fn())
  times = [[] for _ in rows]
  end = time.perf_counter() + seconds
  while time.perf_counter() < end or len(times[0]) < 3:
    for i, (_, fn) in enumerate(rows):
      t = time.perf_counter()
      jax.block_until_ready(fn())
      times[i].append((time.perf_counter() - t) * 1e3)
  return [statistics.median(t) for t in times]


def critic_table(seconds):
  rng = np.random.default_rng(0)
  obs = jnp.asarray(rng.normal(size=(BATCH, OBS_DIM)), jnp.float32)
  act = jnp.asarray(rng.uniform(-1, 1, size=(BATCH, ACT_DIM)), jnp.float32)
  obs_var = jnp.asarray(rng.uniform(0.0, 0.1, size=(BATCH, OBS_DIM)), jnp.float32)
  net = CriticEnsemble(HIDDEN, 2)
  params = jax.jit(net.init)(jax.random.PRNGKey(0), obs, act)
  own = lambda p, o, v: net.apply(p, o, act, v)  # noqa: E731
  auto = lambda p, o, v: propagate(net.apply, argnums=1)(p, (o, v), act)  # noqa: E731
  lcb = lambda f: jax.grad(lambda p, o, v: jnp.sum(f(p, o, v)[0] - f(p, o, v)[1]))  # noqa: E731
  lines = [f"{'critic MM path':<34}{'run ms':>9}{'trace + compile s':>19}"]
  fns = {"forward, own path": own, "forward, propagate": auto,
         "lcb gradient, own path": lcb(own), "lcb gradient, propagate": lcb(auto)}
  compiled, first = {}, {}
  for name, f in fns.items():
    t = time.perf_counter()
    compiled[name] = jax.jit(f).lower(params, obs, obs_var).compile()
    first[name] = time.perf_counter() - t
  same = [jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)),
                                    compiled[f"{k}, own path"](params, obs, obs_var),
                                    compiled[f"{k}, propagate"](params, obs, obs_var)))
          for k in ("forward", "lcb gradient")]
  hlo = [_instructions(compiled[f"{k}, own path"]) == _instructions(compiled[f"{k}, propagate"])
         for k in ("forward", "lcb gradient")]
  ms = _timed([(n, lambda c=c: c(params, obs, obs_var)) for n, c in compiled.items()], seconds)
  for (name, _), t in zip(compiled.items(), ms):
    lines.append(f"{name:<34}{t:>9.3f}{first[name]:>19.2f}")
  lines.append(f"outputs bit-identical: forward {same[0]}, gradient {same[1]}; optimised HLO "
               f"identical (names aside): forward {hlo[0]}, gradient {hlo[1]}")
  return lines


def _instructions(compiled):
  """The optimised HLO's instructions without names and source metadata (what XLA runs)."""
  text = re.sub(r", metadata=\{[^}]*\}", "", compiled.as_text())
  return [re.sub(r"%[\w.\-]+", "%", line) for line in text.split("\n") if " = " in line]


class _MLP(nn.Module):
  depth: int
  width: int

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.normal(0.1)
    for _ in range(self.depth):
      x = nn.relu(nn.Dense(self.width, bias_init=init)(x))
    return nn.Dense(4, bias_init=init)(x)


def error_table(seconds, n_mc=100_000, rows=16):
  lines = [f"{'depth':>5}{'width':>6}{'in var':>7}  {'diag mean err':>13}{'var err (p95)':>16}  "
           f"{'full mean err':>13}{'var err (p95)':>16}  {'plain ms':>9}{'diag ms':>8}"
           f"{'full ms':>8}{'MC 100 ms':>10}"]
  with jax.enable_x64(True):
    rng = np.random.default_rng(1)
    for depth in (1, 2, 3):
      for width in (16, 64):
        net = _MLP(depth, width)
        x = jnp.asarray(rng.normal(size=(rows, 8)))
        params = net.init(jax.random.PRNGKey(depth * 100 + width), x)
        apply = jax.jit(net.apply)
        diag = jax.jit(propagate(net.apply, argnums=1))
        full = jax.jit(propagate(net.apply, argnums=1, covariance="full"))
        for level in (0.1, 1.0):
          var = jnp.full_like(x, level)
          dm, dv = diag(params, (x, var))
          fm, fc = full(params, (x, var))
          fv = jnp.diagonal(fc, axis1=-2, axis2=-1)
          mm, mv = mc_moments(lambda z, p=params: net.apply(p, z), x, var,
                              jax.random.PRNGKey(7), n_mc)
          std = np.sqrt(np.asarray(mv))
          stats = []
          for m, v in ((dm, dv), (fm, fv)):
            rel = np.abs(np.asarray(v) / np.asarray(mv) - 1.0)
            stats += [np.median(np.abs(np.asarray(m) - np.asarray(mm)) / std), np.median(rel),
                      np.percentile(rel, 95)]
          # Cost in float32, the default dtype (the errors above are float64's).
          x32, var32 = x.astype(jnp.float32), var.astype(jnp.float32)
          mc100 = jax.jit(lambda p, k: mc_moments(lambda z: net.apply(p, z), x32, var32, k, 100))
          ms = _timed([("plain", lambda: apply(params, x32)),
                        ("diag", lambda: diag(params, (x32, var32))),
                        ("full", lambda: full(params, (x32, var32))),
                        ("mc", lambda: mc100(params, jax.random.PRNGKey(3)))], seconds / 4)
          lines.append(f"{depth:>5}{width:>6}{level:>7g}  {stats[0]:>13.3f}"
                       f"{stats[1]:>9.3f} ({stats[2]:.2f})  {stats[3]:>13.3f}"
                       f"{stats[4]:>9.3f} ({stats[5]:.2f})  {ms[0]:>9.3f}{ms[1]:>8.3f}"
                       f"{ms[2]:>8.3f}{ms[3]:>10.3f}")
  return lines


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default=None, help="also write the report to this file")
  parser.add_argument("--seconds", type=float, default=2.0, help="timing per table row group")
  args = parser.parse_args()
  devices = jax.devices()
  hardware = (f"{os.cpu_count()}-core CPU, no GPU" if all(d.platform == "cpu" for d in devices)
              else ", ".join(str(d.device_kind) for d in devices))
  t0 = time.time()
  lines = [f"# bench_propagate.py on {hardware} ({platform.processor() or platform.machine()})",
           f"# jax {jax.__version__}; {time.strftime('%Y-%m-%d %H:%M:%S')}; other processes may "
           f"share the CPU (load average {os.getloadavg()[0]:.1f} at start)", "",
           f"## The critic's moment-matched path: CriticEnsemble(2 x {list(HIDDEN)}), batch "
           f"{BATCH}, float32", ""]
  lines += critic_table(args.seconds)
  lines += ["", "## Error against Monte Carlo (1e5 samples) and cost, random ReLU MLPs, "
            "input 8, output 4, 16 rows, float64", ""]
  lines += error_table(args.seconds)
  lines.append(f"(load average {os.getloadavg()[0]:.1f} at the end; "
               f"total {time.time() - t0:.0f} s)")
  common.emit(lines, args.out)


if __name__ == "__main__":
  main()
