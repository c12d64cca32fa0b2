"""mombo_jax.propagate: its cost against the critic's hand-written moment-matched path, the
diagonal and full-covariance modes' errors against Monte Carlo by depth, width and input variance,
and the full mode's cost against its floor (the tables in docs/moment_matching.md).

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
init, biases N(0, 0.1^2)), depth 1-3 hidden layers of width 16, 64, 256 and 512, and a residual
block (relu(Dense(x)), then h + relu(Dense(h)), then the head) of width 64 and 256; inputs
N(x, diag var) with x ~ N(0, 1), var in {1e-3, 1e-2, 0.1, 1, 10}, 16 rows each. Modes: "diag"
(covariance="diagonal"), "full" (covariance="full", the quadrature), "dvi" (covariance="full",
relu_covariance="dvi"). Error against Monte Carlo (mc_moments, float64; 1e5 samples at widths 16
and 64, 2e4 at 256, 1e4 at 512, so the reference's own relative variance error, ~sqrt(2 / n), is
0.4%, 1% and 1.4%): "mean err" is |mean - mean_MC| / std_MC over rows and outputs, "var err"
|var / var_MC - 1|, each as its average and (95th percentile). ms: one jitted float32 call on the
16 rows (median of round-robin calls; once per network, on its first row, as the cost does not
depend on the variance), "plain" the network itself, "MC 100" Monte Carlo with 100
samples.

Part 3, the full mode's cost against its floor: a critic-shaped MLP (input 23, 3 hidden ReLU
layers, output 1) at width 256 on a batch of 256 and width 512 on a batch of 64, float32, jitted:
"floor" is the layers' own covariance products alone (W^T C W per row and Dense layer, one plain
jitted einsum each, on covariances of the same shapes), the least any exact full-covariance method
computes; beside it the full mode ("full", "dvi"), the diagonal mode and the plain network, each
as the median of calls timed round-robin (so the ratio to the floor is measured side by side) and
its trace + compile time.
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
from mombo_jax.moment_matching.monte_carlo import mc_moments
from mombo_jax.moment_matching.propagate import propagate

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
  out: int = 4
  residual: bool = False

  @nn.compact
  def __call__(self, x):
    init = nn.initializers.normal(0.1)
    if self.residual:   # one residual block: the skip and its branch meet as independent values
      x = nn.relu(nn.Dense(self.width, bias_init=init)(x))
      x = x + nn.relu(nn.Dense(self.width, bias_init=init)(x))
    for _ in range(0 if self.residual else self.depth):
      x = nn.relu(nn.Dense(self.width, bias_init=init)(x))
    return nn.Dense(self.out, bias_init=init)(x)


LEVELS = (1e-3, 1e-2, 0.1, 1.0, 10.0)
MODES = {"diag": {}, "full": {"covariance": "full"},
         "dvi": {"covariance": "full", "relu_covariance": "dvi"}}
COST_SHAPES = ((256, 256), (512, 64))   # (width, batch) of part 3
N_MC = {16: 100_000, 64: 100_000, 256: 20_000, 512: 10_000}


def _errors(m, v, mm, mv):
  """(mean err, its p95, var err, its p95) of propagated (m, v) against Monte Carlo (mm, mv)."""
  m, v, mm, mv = (np.asarray(a, np.float64) for a in (m, v, mm, mv))
  em, ev = np.abs(m - mm) / np.sqrt(mv), np.abs(v / mv - 1.0)
  return em.mean(), np.percentile(em, 95), ev.mean(), np.percentile(ev, 95)


def error_table(seconds, rows=16):
  head = (["depth", "width", "in var", "MC n"] + [f"{k} {q}" for k in MODES
                                                  for q in ("mean err", "var err")]
          + ["plain ms", "diag ms", "full ms", "dvi ms", "MC 100 ms"])
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  nets = [(d, w, False) for d in (1, 2, 3) for w in (16, 64, 256, 512)]
  nets += [(1, w, True) for w in (64, 256)]
  rng = np.random.default_rng(1)
  for depth, width, residual in nets:
    net = _MLP(depth, width, residual=residual)
    n_mc = N_MC[width]
    with jax.enable_x64(True):
      x = jnp.asarray(rng.normal(size=(rows, 8)))
      params = net.init(jax.random.PRNGKey(depth * 1000 + width + residual), x)
      fns = {k: jax.jit(propagate(net.apply, argnums=1, **kw)) for k, kw in MODES.items()}
      got, ref = [], []
      for level in LEVELS:
        var = jnp.full_like(x, level)
        got.append({k: f(params, (x, var)) for k, f in fns.items()})
        ref.append(mc_moments(lambda z, p=params: net.apply(p, z), x, var,
                              jax.random.PRNGKey(7), n_mc))
    # Cost in float32, the default dtype (the errors above are float64's).
    params32 = jax.tree.map(lambda a: a.astype(jnp.float32), params)
    x32 = x.astype(jnp.float32)
    apply = jax.jit(net.apply)
    fns32 = {k: jax.jit(propagate(net.apply, argnums=1, **kw)) for k, kw in MODES.items()}
    mc100 = jax.jit(lambda p, v, k: mc_moments(lambda z: net.apply(p, z), x32, v, k, 100))
    var32 = jnp.ones_like(x32)   # the cost does not depend on the variance: timed once per net
    ms = _timed([("plain", lambda: apply(params32, x32))]
                + [(k, lambda f=f: f(params32, (x32, var32))) for k, f in fns32.items()]
                + [("mc", lambda: mc100(params32, var32, jax.random.PRNGKey(3)))], seconds / 4)
    for row, (level, outs, (mm, mv)) in enumerate(zip(LEVELS, got, ref)):
      stats = []
      for k, (m, v) in outs.items():
        stats += _errors(m, v if k == "diag" else jnp.diagonal(v, axis1=-2, axis2=-1), mm, mv)
      cells = ([str(depth) + (" (residual)" if residual else ""), str(width), f"{level:g}",
                f"{n_mc:.0e}".replace("e+0", "e")]
               + [f"{stats[i]:.3f} ({stats[i + 1]:.2f})" for i in range(0, len(stats), 2)]
               + [f"{t:.3f}" if row == 0 else "" for t in ms])
      lines.append("| " + " | ".join(cells) + " |")
  return lines


def cost_table(seconds):
  """The full mode beside its floor (module docstring, part 3)."""
  head = ["width", "batch", "", "floor", "full", "dvi", "diag", "plain"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for width, batch in COST_SHAPES:
    rng = np.random.default_rng(width)
    net = _MLP(3, width, out=1)
    x = jnp.asarray(rng.normal(size=(batch, 23)), jnp.float32)
    var = jnp.full_like(x, 0.1)
    params = jax.jit(net.init)(jax.random.PRNGKey(0), x)
    kernels = [params["params"][f"Dense_{i}"]["kernel"] for i in range(4)]
    covs = [jnp.broadcast_to(jnp.eye(k.shape[0], dtype=jnp.float32), (batch,) + k.shape[:1] * 2)
            for k in kernels]
    floor = lambda ks, cs: [jnp.einsum("io,bij,jp->bop", k, c, k)  # noqa: E731
                            for k, c in zip(ks, cs)]
    calls, first = {}, {}
    for name, fn, args in [("floor", floor, (kernels, covs))] + [
        (k, propagate(net.apply, argnums=1, **kw), (params, (x, var))) for k, kw in MODES.items()
    ] + [("plain", net.apply, (params, x))]:
      t = time.perf_counter()
      compiled = jax.jit(fn).lower(*args).compile()
      first[name] = time.perf_counter() - t
      calls[name] = lambda c=compiled, a=args: c(*a)
    order = ["floor", "full", "dvi", "diag", "plain"]
    ms = dict(zip(calls, _timed(list(calls.items()), seconds)))
    lines.append(f"| {width} | {batch} | ms per call | "
                 + " | ".join(f"{ms[k]:.1f}" for k in order) + " |")
    lines.append(f"| {width} | {batch} | x floor | "
                 + " | ".join(f"{ms[k] / ms['floor']:.2f}" for k in order) + " |")
    lines.append(f"| {width} | {batch} | trace + compile s | "
                 + " | ".join(f"{first[k]:.2f}" for k in order) + " |")
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
  lines += ["", "## The full mode against its floor, input 23, 3 hidden ReLU layers, output 1, "
            "float32", ""]
  lines += cost_table(args.seconds)
  lines += ["", "## Error against Monte Carlo and cost, random ReLU MLPs, input 8, output 4, "
            "16 rows, float64 (cost: float32)", ""]
  lines += error_table(args.seconds)
  lines.append(f"(load average {os.getloadavg()[0]:.1f} at the end; "
               f"total {time.time() - t0:.0f} s)")
  common.emit(lines, args.out)


if __name__ == "__main__":
  main()
