"""Cost of a moment-matching critic forward vs a plain forward vs Monte Carlo, and the accuracy
of mm_relu against an mpmath reference.

  python benchmarks/bench_moments.py [--out benchmarks/bench_moments.txt] [--skip_accuracy]
                                     [--skip_steps]

Timing: one MMCritic (hidden [256, 256]) on batch 256, obs dim 17 + action dim 6 (HalfCheetah),
jitted, warmed up, each call timed with block_until_ready; the median over repetitions (and the
min) in ms. The short calls are timed round-robin so that background load on a shared machine
hits them alike; "x plain" is the ratio of medians, "x plain (min)" the ratio of minima. Monte
Carlo draws N next states per batch row from N(obs, obs_var) and returns the mean and variance of
Q over them (moment_matching/monte_carlo.py mc_moments, chunked so N = 10000 fits in memory). "MM,
textbook formula" is the same network with the unstable closed form of the reference code, to show
what the stable mm_relu costs on top of it; the last three rows time the elementwise step alone on
one hidden layer ([256, 256]).

Training step (what the moment matching costs where it is used): one `sac.update` (batch 256,
critics and actor [256, 256], 2 critics, walker2d dims obs 17 / action 6, state variances 0.01),
50 steps per jitted lax.scan, the variants timed round-robin: SAC with its soft target and plain
critics; the MOMBO lcb step; and its two halves, the lcb target with the plain actor loss and the
plain deterministic target with the moment-matched actor loss. "lcb, free mm_relu" swaps mm_relu
for a stand-in of negligible cost with the same data flow (not a valid algorithm): what the step
would cost if mm_relu were free, i.e. the floor set by the variance matmuls. Wall ms per step
(median, min) and process CPU ms per step (less sensitive to other processes); ratios to SAC are
medians of the per-round ratios.

Accuracy: relative error of E[relu(X)] and Var[relu(X)] against mpmath (80 digits, at the exact
floating-point inputs) on a grid of a = mean/std in {0, +-logspace(-4, 4, 401)} and var in
logspace(-30, 10, 41), per dtype and regime; where the true value is subnormal or underflows, the
absolute error in units of the smallest normal number.
"""
import argparse
import os
import platform
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks import common  # noqa: E402
from mombo_jax.core import buffer, critics, sac, targets  # noqa: E402
from mombo_jax.core.critics import MMCritic  # noqa: E402
from mombo_jax.moment_matching.moments import mm_linear, mm_relu  # noqa: E402
from mombo_jax.moment_matching.monte_carlo import mc_moments  # noqa: E402
from mombo_jax.settings import config as config_lib

BATCH, OBS_DIM, ACT_DIM, HIDDEN = 256, 17, 6, (256, 256)
MC_SAMPLES = (2, 10, 100, 10000)
MC_CHUNK = 100                     # samples per lax.scan step: 25,600 critic rows at once
MIN_SECONDS, MAX_REPS = 2.0, 400   # repeat each timing until this much time or this many calls


def _time_interleaved(rows, seconds):
  """Time several jitted calls round-robin, so that a varying background load (a shared CPU)
  hits them alike. Each call is compiled and warmed up first; every call is timed alone with
  block_until_ready. Returns [(median ms, min ms, reps)] in the order of rows."""
  for _, fn, args in rows:
    for _ in range(3):
      jax.block_until_ready(fn(*args))
  times = [[] for _ in rows]
  start = time.perf_counter()
  while len(times[0]) < MAX_REPS and (time.perf_counter() - start < seconds or len(times[0]) < 3):
    for i, (_, fn, args) in enumerate(rows):
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[i].append((time.perf_counter() - t0) * 1e3)
  return [(statistics.median(t), min(t), len(t)) for t in times]


def _textbook_relu(mean, var):
  """The reference code's closed form (no stable branch), for the cost comparison only."""
  s = jnp.sqrt(var + 1e-16)
  a = mean / s
  cdf, pdf = jax.scipy.stats.norm.cdf(a), jax.scipy.stats.norm.pdf(a)
  m = mean * cdf + s * pdf
  return m, jnp.maximum((mean**2 + var) * cdf + mean * s * pdf - m**2, 0.0)


def timing_table():
  rng = np.random.default_rng(0)
  obs = jnp.asarray(rng.normal(size=(BATCH, OBS_DIM)), jnp.float32)
  act = jnp.asarray(rng.uniform(-1, 1, size=(BATCH, ACT_DIM)), jnp.float32)
  obs_var = jnp.asarray(rng.uniform(0.0, 0.1, size=(BATCH, OBS_DIM)), jnp.float32)
  net = MMCritic(HIDDEN)
  params = jax.jit(net.init)(jax.random.PRNGKey(0), obs, act)

  def textbook(params, obs, act, obs_var):
    layers = params["params"]
    m = jnp.concatenate([obs, act], -1)
    v = jnp.concatenate([obs_var, jnp.zeros_like(act)], -1)
    for i in range(len(layers)):
      m, v = mm_linear(m, v, layers[f"MMDense_{i}"]["kernel"], layers[f"MMDense_{i}"]["bias"])
      if i < len(layers) - 1:
        m, v = _textbook_relu(m, v)
    return m[..., 0], v[..., 0]

  rows = [("plain forward", jax.jit(net.apply), (params, obs, act)),
          ("MM forward (mm_relu)", jax.jit(net.apply), (params, obs, act, obs_var)),
          ("MM, textbook formula", jax.jit(textbook), (params, obs, act, obs_var))]
  for n in MC_SAMPLES:
    mc = jax.jit(lambda params, key, n=n: mc_moments(
        lambda o: net.apply(params, o, act), obs, obs_var, key, n, chunk_size=min(n, MC_CHUNK)))
    rows.append((f"Monte Carlo, N={n}", mc, (params, jax.random.PRNGKey(1))))
  # The elementwise part alone, on one hidden layer's pre-activations [256, 256].
  pre = jnp.asarray(rng.normal(size=(BATCH, HIDDEN[0])), jnp.float32)
  pre_var = jnp.asarray(rng.uniform(0.0, 0.1, size=(BATCH, HIDDEN[0])), jnp.float32)
  rows += [("  mm_relu alone", jax.jit(mm_relu), (pre, pre_var)),
           ("  textbook alone", jax.jit(_textbook_relu), (pre, pre_var)),
           ("  relu alone", jax.jit(jax.nn.relu), (pre,))]
  # Calls under ~10 ms are interleaved with each other; the long Monte Carlo runs go separately.
  fast = [r for r in rows if "N=100" not in r[0]]
  slow = [r for r in rows if "N=100" in r[0]]
  stats = dict(zip([r[0] for r in fast], _time_interleaved(fast, 6 * MIN_SECONDS)))
  for row in slow:
    stats[row[0]] = _time_interleaved([row], MIN_SECONDS)[0]
  plain_med, plain_min, _ = stats["plain forward"]
  lines = [f"{'method':<24}{'median ms':>11}{'min ms':>10}{'reps':>6}{'x plain':>9}"
           f"{'x plain (min)':>15}"]
  for name, _, _ in rows:
    med, low, reps = stats[name]
    lines.append(f"{name:<24}{med:>11.3f}{low:>10.3f}{reps:>6}{med / plain_med:>9.2f}"
                 f"{low / plain_min:>15.2f}")
  return lines


@jax.custom_jvp
def _free_mm_relu(mean, var):
  """Stand-in for mm_relu with negligible cost but the same data flow (m and its derivative
  depend on var, v on mean), so no variance matmul becomes dead code: step_table's floor row."""
  return jax.nn.relu(mean), 0.5 * var


@_free_mm_relu.defjvp
def _free_mm_relu_jvp(primals, tangents):
  (mean, var), (d_mean, d_var) = primals, tangents
  return (_free_mm_relu(mean, var),
          (jnp.where(mean > 0, d_mean, 0.0) + var * d_var, 0.5 * d_var + mean * d_mean))


def step_table(steps=50, rounds=9):
  """ms per training step of SAC and MOMBO lcb variants (see the module docstring)."""
  rng = np.random.default_rng(0)
  n = BATCH * steps
  f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  var = lambda *shape: jnp.full(shape, 0.01, jnp.float32)  # noqa: E731
  data = buffer.Batch(obs=f(n, OBS_DIM), action=jnp.tanh(f(n, ACT_DIM)), reward=f(n),
                      next_obs=f(n, OBS_DIM), done=jnp.zeros(n), obs_var=var(n, OBS_DIM),
                      next_obs_mean=f(n, OBS_DIM), next_obs_var=var(n, OBS_DIM),
                      reward_mean=f(n), reward_var=var(n))
  mombo = config_lib.make_config("walker2d-medium", "mombo")
  mopo = config_lib.make_config("walker2d-medium", "mopo")
  plain_actor = mombo.replace(algo="mobile")   # sac.update's plain actor loss

  def lcb(agent, batch, key):
    return targets.mombo_lcb(agent, batch, key, dyn=None, config=mombo, term_fn=None)

  def det(agent, batch, key):   # plain target critics, deterministic backup
    return targets._plain_target(agent, batch, key, mombo), {}  # pylint: disable=protected-access

  def soft(agent, batch, key):
    return sac.soft_target(agent, batch, key, mopo)

  def compiled(config, target_fn):
    agent = sac.init_agent(jax.random.PRNGKey(0), OBS_DIM, ACT_DIM, config, 10**6)

    def run(agent, data, key):
      batches = jax.tree.map(lambda x: x.reshape((steps, BATCH) + x.shape[1:]), data)
      body = lambda a, inp: sac.update(a, inp[0], inp[1], target_fn, config)  # noqa: E731
      return jax.lax.scan(body, agent, (batches, jax.random.split(key, steps)))

    fn = jax.jit(run).lower(agent, data, jax.random.PRNGKey(1)).compile()
    return lambda: jax.block_until_ready(fn(agent, data, jax.random.PRNGKey(1)))

  rows = [("sac (soft target)", compiled(mopo, soft)),
          ("lcb target, plain actor", compiled(plain_actor, lcb)),
          ("plain target, MM actor", compiled(mombo, det)),
          ("lcb (full)", compiled(mombo, lcb))]
  real = critics.mm_relu
  critics.mm_relu = _free_mm_relu      # traced into this one program only
  try:
    rows.append(("lcb, free mm_relu", compiled(mombo, lcb)))
  finally:
    critics.mm_relu = real
  for _, fn in rows:
    fn()
  wall = [[] for _ in rows]
  cpu = [[] for _ in rows]
  for _ in range(rounds):
    for i, (_, fn) in enumerate(rows):
      t0, c0 = time.perf_counter(), time.process_time()
      fn()
      wall[i].append((time.perf_counter() - t0) * 1e3 / steps)
      cpu[i].append((time.process_time() - c0) * 1e3 / steps)
  wall, cpu = np.array(wall), np.array(cpu)
  lines = [f"{'variant':<26}{'wall med':>9}{'wall min':>9}{'x sac':>7}{'cpu med':>9}{'x sac':>7}"
           "   (ms per step)"]
  for i, (name, _) in enumerate(rows):
    lines.append(f"{name:<26}{np.median(wall[i]):>9.2f}{wall[i].min():>9.2f}"
                 f"{np.median(wall[i] / wall[0]):>7.2f}{np.median(cpu[i]):>9.2f}"
                 f"{np.median(cpu[i] / cpu[0]):>7.2f}")
  return lines


def _mp_reference(mu, var):
  import mpmath  # pylint: disable=import-outside-toplevel
  with mpmath.workdps(80):
    mu, var = mpmath.mpf(float(mu)), mpmath.mpf(float(var))
    s = mpmath.sqrt(var)
    a = mu / s
    cdf, pdf = mpmath.ncdf(a), mpmath.npdf(a)
    m = mu * cdf + s * pdf
    return float(m), float((mu * mu + var) * cdf + mu * s * pdf - m * m)


def accuracy_table():
  a_pos = np.logspace(-4, 4, 401)
  a_grid, v_grid = np.meshgrid(np.concatenate([-a_pos[::-1], [0.0], a_pos]),
                               np.logspace(-30, 10, 41), indexing="ij")
  bands = [(0, 1), (1, 4), (4, 10), (10, 40), (40, np.inf)]
  lines = []
  for dtype in (np.float32, np.float64):
    var = v_grid.astype(dtype).ravel()
    mu = (a_grid * np.sqrt(v_grid)).astype(dtype).ravel()
    with jax.enable_x64(dtype == np.float64):
      m, v = jax.jit(mm_relu)(jnp.asarray(mu), jnp.asarray(var))
      got = np.stack([np.asarray(m), np.asarray(v)], 1).astype(np.float64)
    ref = np.array([_mp_reference(x, y) for x, y in zip(mu, var)])
    finfo = np.finfo(dtype)
    normal = ref >= finfo.tiny
    rel = np.where(normal, np.abs(got - ref) / np.where(normal, ref, 1.0), 0.0)
    under = np.where(normal, 0.0, np.abs(got - ref) / finfo.tiny)
    t = np.abs(mu.astype(np.float64)) / np.sqrt(var.astype(np.float64))
    neg = mu <= 0
    lines.append(f"{np.dtype(dtype).name} (eps = {finfo.eps:.3g}); {mu.size} points; worst "
                 "relative error where the true value is normal [in units of eps]")
    lines.append(f"  {'|a| band':<14}{'E[Y], a<=0':>22}{'E[Y], a>0':>22}{'Var[Y], a<=0':>22}"
                 f"{'Var[Y], a>0':>22}")
    for lo, hi in bands:
      cells = []
      for k in (0, 1):
        for side in (neg, ~neg):
          mask = side & (t >= lo) & (t < hi) & normal[:, k]
          if mask.any():
            worst = rel[mask, k].max()
            cells.append(f"{worst:.2e} [{worst / finfo.eps:6.1f}]")
          else:
            cells.append("(all underflow)")
      cells = [cells[0], cells[1], cells[2], cells[3]]
      lines.append(f"  [{lo:g}, {hi:g}){'':<{12 - len(f'[{lo:g}, {hi:g})')}}" +
                   "".join(f"{c:>22}" for c in cells))
    ratio = np.where(normal, rel / (finfo.eps * (16.0 + t[:, None] ** 2)), 0.0).max()
    lines.append(f"  max rel / ((16 + a^2) eps) = {ratio:.3f}   (the test tolerance is 2.0)")
    lines.append(f"  true value subnormal/underflowing: {(~normal).sum()} entries, max |error| = "
                 f"{under.max():.3f} x smallest normal ({finfo.tiny:.3g})")
    lines.append("")
  return lines


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default=None, help="also write the report to this file")
  parser.add_argument("--skip_accuracy", action="store_true", help="timing only")
  parser.add_argument("--skip_steps", action="store_true", help="no training-step table")
  args = parser.parse_args()
  cores = os.cpu_count()
  devices = jax.devices()
  hardware = (f"{cores}-core CPU, no GPU" if all(d.platform == "cpu" for d in devices)
              else ", ".join(str(d.device_kind) for d in devices))
  lines = [f"# bench_moments.py on {hardware} ({platform.processor() or platform.machine()})",
           f"# jax {jax.__version__}, jax.devices() = {devices}",
           f"# {time.strftime('%Y-%m-%d %H:%M:%S')}; other processes may share the CPU "
           f"(load average {os.getloadavg()[0]:.1f} at start)",
           "",
           f"## One critic forward: batch {BATCH}, obs {OBS_DIM} + action {ACT_DIM}, hidden "
           f"{list(HIDDEN)}, float32, jitted",
           ""]
  t0 = time.time()
  lines += timing_table()
  lines.append(f"(load average {os.getloadavg()[0]:.1f} at the end of the timings)")
  if not args.skip_steps:
    lines += ["", f"## One training step (sac.update), batch {BATCH}, critics and actor "
              f"{list(HIDDEN)}, obs {OBS_DIM} + action {ACT_DIM}", ""]
    lines += step_table()
    lines.append(f"(load average {os.getloadavg()[0]:.1f} at the end of the step timings)")
  if not args.skip_accuracy:
    lines += ["", "## mm_relu accuracy vs mpmath (80 digits)", ""]
    lines += accuracy_table()
  lines.append(f"total runtime {time.time() - t0:.0f} s")
  common.emit(lines, args.out)


if __name__ == "__main__":
  main()
