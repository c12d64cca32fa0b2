"""Where a span's time goes, per phase, ours against unifloral's (issue #29 item 2).

  python3 -m benchmarks.peers.profile --unifloral=/path/to/unifloral \
      --out=benchmarks/peers/profile.txt

Each phase is a jitted piece, compiled ahead of time (compilation excluded), warmed up, then timed
--repeats times with block_until_ready, ours and theirs in turns (the medians are reported), and
counted by XLA's cost analysis (FLOPs and bytes accessed). Per-step phases run as a lax.scan of
--scan steps (so that dispatch does not count) and are scaled to the span's steps. Phases:
- rollout: the model rollout with its buffer write (ours: start states + rollout.run; theirs:
  their rollout_fn unchanged); its buffer write also on its own (ours: buffer.add; theirs: their
  concatenate-based update);
- mixed sampling: one mixed batch (ours buffer.sample_mixed; theirs sample_from_buffer twice);
- critic update (with its target) and actor + temperature update (with Polyak): halves.py
  (mirrors of each side's step, which neither exposes in halves), on one fixed batch;
- health checks + metric reductions (ours only: train.health_checks and the per-epoch means the
  chunk keeps; unifloral has none);
- gradient step as in the epoch: the unchanged step (ours buffer.sample_mixed + sac.update;
  theirs their train step with a no-op rollout) = sampling + both halves + the per-step metrics;
- the whole span (ours cells_program.make_cells_chunk, theirs their jitted scan), for the residual.
The same work and data as side_by_side.py (benchmarks/peers/work.py), one seed, in one process.
Ours' pieces are compiled with the package's XLA options (core/xla_options: Eigen's dots on CPU),
theirs with XLA's defaults, as each side compiles its runs (records before 2026-11-26 06:40 UTC
compiled ours with XLA's defaults too).
"""
import argparse
import functools
import sys
import time

import jax
import jax.numpy as jnp

from benchmarks.common import Record, cpu_name
from benchmarks.peers import halves, work as work_lib


class Piece:
  """A jitted piece compiled ahead of time, with its XLA cost; run() times one call (blocked) and
  feeds its output to the next call (feed(args, out) -> args: donated arguments are consumed)."""

  def __init__(self, fn, args, donate=(), feed=None, unroll_cost=False, options=None):
    with work_lib.unrolled_scans() if unroll_cost else _null():
      self.cost = work_lib.xla_cost(jax.jit(fn, compiler_options=options).lower(*args).compile())
    self.compiled = jax.jit(fn, donate_argnums=donate, compiler_options=options).lower(
        *args).compile()
    self.args, self.feed = args, feed

  def run(self) -> float:
    seconds, out = work_lib.timed(self.compiled, *self.args)
    if self.feed is not None:
      self.args = self.feed(self.args, out)
    return seconds


def measure(fn, args, repeats=None, donate=(), feed=None, unroll_cost=False, options=None):
  """options: XLA compiler options (ours: the package's, xla_options.options(); theirs: None,
  XLA's defaults, as each side compiles its runs)."""
  del repeats   # timed later, ours and theirs in turns (interleave)
  return Piece(fn, args, donate, feed, unroll_cost, options)


def interleave(ours: dict, theirs: dict, repeats: int):
  """{phase: (median seconds, cost)} of each side: per phase, one warm-up call each, then
  `repeats` rounds of one ours call and one theirs call (so that load drifts hit both)."""
  out_o, out_t = {}, {}
  for key, po in ours.items():
    pt = theirs.get(key)
    pieces = [po] + ([pt] if pt else [])
    for p in pieces:
      p.run()
    times = [[p.run() for p in pieces] for _ in range(repeats)]
    out_o[key] = (work_lib.median([t[0] for t in times]), po.cost)
    if pt:
      out_t[key] = (work_lib.median([t[1] for t in times]), pt.cost)
  return out_o, out_t


class _null:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def _scan(body, n):
  """fn(carry, key) -> the carry after n body(carry, key_i) steps (body returns (carry, y))."""
  def fn(carry, key):
    return jax.lax.scan(body, carry, jax.random.split(key, n))[0]
  return fn


def _tree_sum(tree):
  return sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree.leaves(tree))


def profile_ours(side, n, repeats):
  from mombo_jax.core import cells_program, train, xla_options
  from mombo_jax.settings import environment
  config, out = side.config, {}
  # Compiled as the package compiles its training programs (xla_options: Eigen's dots on CPU).
  measure_ours = functools.partial(measure, options=xla_options.options(environment.cpu_dots()))
  key = jax.random.PRNGKey(5)
  roll_fn, (k, agent, ring) = side.rollout_piece()
  out["rollout"] = measure_ours(roll_fn, (k, agent, ring), repeats, donate=(2,),
                           feed=lambda a, o: (a[0], a[1], o[0]), unroll_cost=True)
  roll = jax.jit(roll_fn)
  ring = roll(k, agent, side._agent_ring()[1])[0]       # a filled ring for the samples
  write_fn, (_, rows, mask) = side.write_piece()
  out["buffer write"] = measure_ours(write_fn, (ring, rows, mask), repeats, donate=(0,),
                                feed=lambda a, o: (o, a[1], a[2]))
  ring = roll(k, agent, side._agent_ring()[1])[0]
  sample_fn, _ = side.sample_piece()
  out["sampling"] = measure_ours(_scan(lambda acc, k: (acc + _tree_sum(sample_fn(k, ring)), None),
                                       n),
                            (jnp.zeros(()), key), repeats)
  batch = jax.jit(sample_fn)(key, ring)
  target_fn = side.target_fn()
  out["critic"] = measure_ours(_scan(lambda a, k: halves.ours_critic(a, batch, k, target_fn,
                                                                     config),
                                n), (agent, key), repeats)
  out["actor+alpha"] = measure_ours(_scan(lambda a, k: halves.ours_actor_alpha(a, batch, k, config),
                                     n), (agent, key), repeats)
  step_fn, _ = side.step_piece()
  out["step"] = measure_ours(_scan(lambda a, k: step_fn(a, ring, k), n), (agent, key), repeats)
  metrics = jax.eval_shape(step_fn, agent, ring, key)[1]
  metrics = {m: jnp.zeros((side.work.steps,), s.dtype) for m, s in metrics.items()}
  out["health"] = measure_ours(
      lambda a, m: (train.health_checks(a, m, config), cells_program._per_cell(m)),
      (agent, metrics), repeats)
  return out


def profile_theirs(side, n, repeats):
  out = {}
  key = jax.random.PRNGKey(5)
  roll_fn, (k, params, _) = side.rollout_piece()
  fresh = lambda: jax.tree.map(jnp.copy, side.carry[2])  # noqa: E731  (donated below)
  out["rollout"] = measure(roll_fn, (k, params, fresh()), repeats, donate=(2,),
                           feed=lambda a, o: (a[0], a[1], o), unroll_cost=True)
  roll = jax.jit(roll_fn)
  buf = roll(k, params, fresh())
  write_fn, (_, rows) = side.write_piece()
  out["buffer write"] = measure(write_fn, (buf, rows), repeats, donate=(0,),
                                feed=lambda a, o: (o, a[1]))
  buf = roll(k, params, fresh())
  sample_fn, _ = side.sample_piece()
  out["sampling"] = measure(_scan(lambda acc, k: (acc + _tree_sum(sample_fn(k, buf)), None), n),
                            (jnp.zeros(()), key), repeats)
  batch = jax.jit(sample_fn)(key, buf)
  agent = side.carry[1]
  out["critic"] = measure(_scan(lambda a, k: halves.theirs_critic(side, a, batch, k), n),
                          (agent, key), repeats)
  out["actor+alpha"] = measure(_scan(lambda a, k: halves.theirs_actor_alpha(side, a, batch, k),
                                     n), (agent, key), repeats)
  step_fn, (carry,) = side.step_piece()
  carry = (carry[0], carry[1], buf)
  out["step"] = measure(lambda c, k: jax.lax.scan(lambda c, _: step_fn(c), c, None, n)[0],
                        (carry, key), repeats)
  return out


def spans(ours, theirs, repeats):
  """(ours, theirs) median seconds of the whole compiled span, in turns after a warm-up span
  each; (nan, nan) for repeats 0."""
  if repeats < 1:
    return float("nan"), float("nan")
  for side in (ours, theirs):
    side.compile()
    side.span()
  times = [(ours.span(), theirs.span()) for _ in range(repeats)]
  return work_lib.median([t[0] for t in times]), work_lib.median([t[1] for t in times])


ROWS = [  # (label, key, per step?)
    ("rollout (model steps + buffer write), 1 per span", "rollout", False),
    ("  of which the buffer write alone", "buffer write", False),
    ("mixed sampling, x steps", "sampling", True),
    ("critic update incl. target, x steps", "critic", True),
    ("actor + alpha update + Polyak, x steps", "actor+alpha", True),
    ("health checks + metric means, 1 per span", "health", False),
]


def table(say, ours, theirs, ours_span, theirs_span, steps, n):
  scale = lambda key, per_step: steps / n if per_step else 1.0  # noqa: E731
  say(f"| phase (per span of {steps} steps) | ours s | unifloral s | ours / theirs | ours - theirs "
      "s | ours GFLOP | unifloral GFLOP | ours GB | unifloral GB | ours GFLOP/s | unifloral "
      "GFLOP/s |")
  say("|---|" + "---|" * 10)
  sums = [0.0, 0.0]

  def row(label, o, t, per_step, add=True):
    vals = []
    for i, side in enumerate((o, t)):
      if side is None:
        vals.append((float("nan"),) * 3)
        continue
      s = scale(None, per_step)
      sec = side[0] * s
      # XLA counts a scan's body once: per step = the piece's count, times the span's steps.
      mult = steps if per_step else 1.0
      vals.append((sec, side[1]["flops"] * mult, side[1]["bytes"] * mult))
      if add:
        sums[i] += sec
    (os_, of, ob), (ts, tf, tb) = vals
    say(f"| {label} | {os_:.2f} | {ts:.2f} | {os_ / ts:.2f} | {os_ - ts:+.2f} | {of / 1e9:.1f} | "
        f"{tf / 1e9:.1f} | {ob / 1e9:.2f} | {tb / 1e9:.2f} | {work_lib.gflops(of, os_):.1f} | "
        f"{work_lib.gflops(tf, ts):.1f} |")

  for label, key, per_step in ROWS:
    row(label, ours.get(key), theirs.get(key), per_step, add=key != "buffer write")
  say(f"| sum of the phases above | {sums[0]:.2f} | {sums[1]:.2f} | {sums[0] / sums[1]:.2f} | "
      f"{sums[0] - sums[1]:+.2f} | | | | | | |")
  row("gradient step as in the epoch (sampling + update + step metrics), x steps",
      ours["step"], theirs["step"], True, add=False)
  o_whole = ours["rollout"][0] + ours["step"][0] * steps / n + ours["health"][0]
  t_whole = theirs["rollout"][0] + theirs["step"][0] * steps / n
  say(f"| rollout + steps as in the epoch (+ health, ours) | {o_whole:.2f} | {t_whole:.2f} | "
      f"{o_whole / t_whole:.2f} | {o_whole - t_whole:+.2f} | | | | | | |")
  say(f"| whole span, compiled as each runs it | {ours_span:.2f} | {theirs_span:.2f} | "
      f"{ours_span / theirs_span:.2f} | {ours_span - theirs_span:+.2f} | | | | | | |")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  work_lib.add_work_flags(parser)
  parser.add_argument("--unifloral", required=True, help="path of a unifloral checkout")
  parser.add_argument("--scan", type=int, default=200, help="steps per timed scan of a step phase")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--span_repeats", type=int, default=1,
                      help="timed whole spans (after a warm-up one); 0: skip them")
  parser.add_argument("--out", default=None)
  args = parser.parse_args()
  say = Record(args.out)
  from benchmarks.peers import ours as ours_lib, theirs as theirs_lib
  mods, notes = theirs_lib.load(args.unifloral)
  work = work_lib.work_from(args)
  t0 = time.time()
  say("# benchmarks/peers/profile.py: seconds per phase of one span, ours against unifloral's")
  say("command: python3 -m benchmarks.peers.profile " + " ".join(sys.argv[1:]))
  say(f"machine: {cpu_name()}; jax {jax.__version__}; load average (1/5/15 min) at "
      f"start: {work_lib.loadavg()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
  say(f"work: as side_by_side.py, {work.steps} steps per span, rollout {work.rollout_batch} x "
      f"{work.rollout_length}, {work.rows} rows; step phases timed as scans of {args.scan} "
      f"steps, medians of {args.repeats}; whole spans: median of {args.span_repeats}")
  for note in notes:
    say(f"unifloral stubbed/changed: {note}")
  data = work_lib.synthetic_data(work.rows)
  ours_side = ours_lib.Ours(work, data, seeds=1)
  theirs_side = theirs_lib.Theirs(mods, work, data, work.seed)
  o, t = interleave(profile_ours(ours_side, args.scan, args.repeats),
                    profile_theirs(theirs_side, args.scan, args.repeats), args.repeats)
  o_span, t_span = spans(ours_side, theirs_side, args.span_repeats)
  peak = work_lib.matmul_peak_gflops()
  say()
  table(say, o, t, o_span, t_span, work.steps, args.scan)
  say()
  say(f"matmul peak of this CPU: {peak:.0f} GFLOP/s (float32 [n,n]x[n,n], best call). Each phase "
      "timed in turns: ours once, theirs once, --repeats times (medians). GFLOP and GB: XLA's cost "
      "analysis of each piece (a scan's body times the steps; the rollout's scan unrolled for "
      "the count). Phases are timed apart, so their sum need not equal the whole span (fusion "
      "across phases, the per-step metric stacking, loop overheads): the last rows show both.")
  say(f"load average (1/5/15 min) at end: {work_lib.loadavg()}; wall {time.time() - t0:.0f} s")


if __name__ == "__main__":
  main()
