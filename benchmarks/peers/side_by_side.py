"""This project's MOPO against unifloral's (EmptyJackson/unifloral) on the same work (issue #29):
seconds per span (one rollout of 50,000 x 5 + 1,000 gradient steps, compilation excluded).

  # 1 seed, both processes alive, taking turns span by span (the robust ratio):
  python3 -m benchmarks.peers.side_by_side --unifloral=/path/to/unifloral --design=turns \
      --rounds=3 --out=benchmarks/peers/side_by_side.txt
  # 4 seeds: ours one program; unifloral 4 single-seed processes in a row; ours 4 such too:
  python3 -m benchmarks.peers.side_by_side --unifloral=/path/to/unifloral --design=seeds4 \
      --spans=2 --out=benchmarks/peers/side_by_side_4seeds.txt
  # 4 seeds, the three workers alive together, in turns (robust on a shared machine):
  python3 -m benchmarks.peers.side_by_side --unifloral=/path/to/unifloral --design=seeds4_turns \
      --rounds=3 --out=benchmarks/peers/side_by_side_4seeds_turns.txt
  # ours only, tiny sizes, seconds (checks that the script runs; no unifloral needed):
  python3 -m benchmarks.peers.side_by_side --smoke

The work (benchmarks/peers/work.py): MOPO, 10 critics, actor and critics 3x256, batch 256, real
ratio 0.05, rollouts of 50,000 x 5 every span retained 5 spans, a random 7-member 4x200 dynamics
ensemble, the same synthetic hopper-shaped data, float32. Each implementation runs in its own
worker process (this script with --worker), built, compiled and warmed up first; the parent
tells one worker to run one span, waits, then the other, and so on. What was stubbed to import
unifloral: benchmarks/peers/theirs.py (printed in the record).
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import time

from benchmarks.common import Record, cpu_name
from benchmarks.peers import work as work_lib


def _send(msg):
  sys.stdout.write(json.dumps(msg) + "\n")
  sys.stdout.flush()


def _count_flops(side, steps):
  """{'xla', 'jaxpr'}: FLOPs of one span = rollout + steps x gradient step, each piece counted by
  XLA's cost analysis (the rollout's 5-step scan unrolled for the count) and on its jaxpr."""
  import jax

  from benchmarks import common
  out = {}
  roll_fn, roll_args = side.rollout_piece()
  step_fn, step_args = side.step_piece()
  # Ours runs the rollout's 50,000 rows in pieces (a loop XLA would count once): counted in one
  # piece, the same arithmetic.
  with work_lib.unrolled_scans(), getattr(side, "one_piece", contextlib.nullcontext)():
    roll = work_lib.xla_cost(jax.jit(roll_fn).lower(*roll_args).compile())
  step = work_lib.xla_cost(jax.jit(step_fn).lower(*step_args).compile())
  out["xla"] = roll["flops"] + steps * step["flops"]
  out["xla_bytes"] = roll["bytes"] + steps * step["bytes"]
  out["jaxpr"] = (common.jaxpr_flops(roll_fn, *roll_args)
                  + steps * common.jaxpr_flops(step_fn, *step_args))
  out["rollout_xla"], out["step_xla"] = roll["flops"], step["flops"]
  return out


def worker(args):
  """One implementation in this process: builds, compiles, warms up, then runs a span per
  'span' line on stdin, answering a JSON line each on stdout (everything else goes to stderr)."""
  real_stdout, sys.stdout = sys.stdout, sys.stderr
  t0 = time.perf_counter()
  work = work_lib.work_from(args)
  notes, version = [], None
  if args.worker == "unifloral":
    from benchmarks.peers import theirs
    mods, notes = theirs.load(args.unifloral)
    import jax
    side = theirs.Theirs(mods, work, work_lib.synthetic_data(work.rows), args.seed)
    version = side.version
  else:
    import jax

    from benchmarks.peers import ours
    from mombo_jax.core import cell_layout
    from mombo_jax.settings import environment
    side = ours.Ours(work, work_lib.synthetic_data(work.rows), seeds=args.seeds)
    if args.seeds > 1:
      how = {"loop": "looped", "vmap": "vmapped"}[cell_layout.layout(environment.cells())]
      notes = [f"its {args.seeds} cells {how} in one program (core/cell_layout)"]
  compile_s = side.compile()
  flops = _count_flops(side, work.steps) if args.flops else None
  if flops is not None and args.worker == "ours" and args.seeds == 1:
    flops["jaxpr_epoch"] = side.epoch_jaxpr_flops()
  warm = [side.span() for _ in range(args.warmup)]
  sys.stdout = real_stdout
  _send(dict(ready=True, jax=jax.__version__, notes=notes, version=version, compile_s=compile_s,
             warmup_s=warm, flops=flops, setup_s=time.perf_counter() - t0,
             rss_gb=work_lib.peak_rss_gb(), pid=os.getpid()))
  for line in sys.stdin:
    if line.strip() != "span":
      break
    sys.stdout = sys.stderr
    seconds = side.span()
    sys.stdout = real_stdout
    _send(dict(seconds=seconds, rss_gb=work_lib.peak_rss_gb()))


class Worker:
  """A worker process of this script (the parent's handle)."""

  def __init__(self, args, which, seeds=1, seed=0, flops=False):
    cmd = [args.python if which == "ours" else args.unifloral_python, "-m",
           "benchmarks.peers.side_by_side", f"--worker={which}", f"--seeds={seeds}",
           f"--seed={seed}", f"--steps={args.steps}", f"--rollout_batch={args.rollout_batch}",
           f"--rows={args.rows}", f"--warmup={args.warmup}", f"--unifloral={args.unifloral}"]
    if flops:
      cmd.append("--flops")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    self.which, self.t_start = which, time.perf_counter()
    self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 cwd=root, env=env, stderr=None if args.verbose else
                                 subprocess.DEVNULL)
    self.info = None

  def ready(self):
    """Waits for the worker's ready line (built, compiled, warmed up); returns self."""
    self.info = self._read()
    return self

  def _read(self):
    line = self.proc.stdout.readline()
    if not line:
      raise SystemExit(f"the {self.which} worker died (exit {self.proc.wait()}); rerun with "
                       "--verbose to see its errors")
    return json.loads(line)

  def span(self) -> float:
    self.proc.stdin.write("span\n")
    self.proc.stdin.flush()
    return self._read()["seconds"]

  def close(self) -> float:
    """Ends the worker; returns its process wall time (start to end) in seconds."""
    self.proc.stdin.write("quit\n")
    self.proc.stdin.close()
    self.proc.wait()
    return time.perf_counter() - self.t_start


def _fmt(xs):
  return ", ".join(f"{x:.2f}" for x in xs)


def header(say, args, design):
  import jax
  say(f"# benchmarks/peers/side_by_side.py --design={design}")
  say("command: python3 -m benchmarks.peers.side_by_side " + " ".join(sys.argv[1:]))
  say(f"machine: {cpu_name()}; load average (1/5/15 min) at start: {work_lib.loadavg()}")
  say(f"parent jax {jax.__version__} ({jax.default_backend()}); date "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
  w = work_lib.work_from(args)
  say(f"work per span: MOPO, {w.critics} critics, actor and critics {w.layers}x{w.hidden}, batch "
      f"{w.batch}, real ratio {w.real_ratio}, rollout {w.rollout_batch} x {w.rollout_length} "
      f"retained {w.retain_epochs} spans, {w.steps} gradient steps, random {w.members}-member "
      f"{w.dyn_layers}x{w.dyn_hidden} ensemble, synthetic hopper data ({w.rows} rows, obs "
      f"{work_lib.OBS}, action {work_lib.ACT}), float32; warm-up spans per worker: {args.warmup}")


def describe(say, name, info):
  say(f"{name}: jax {info['jax']}" + (f", unifloral commit {info['version']}"
                                      if info.get("version") else "")
      + f"; setup {info['setup_s']:.0f} s, compile {info['compile_s']:.1f} s, warm-up spans "
      f"[{_fmt(info['warmup_s'])}] s, peak RSS {info['rss_gb']:.2f} GB")
  for note in info["notes"]:
    say(f"  {'stubbed/changed' if info.get('version') else 'note'}: {note}")


def turns(args, say):
  header(say, args, "turns")
  peak = work_lib.matmul_peak_gflops()
  # Both workers start together (setup, compilation and warm-up are not timed).
  workers = {"ours": Worker(args, "ours", flops=True),
             "unifloral": Worker(args, "unifloral", flops=True)}
  for name, w in workers.items():
    describe(say, name, w.ready().info)
  times = {name: [] for name in workers}
  for r in range(args.rounds):
    order = list(workers) if r % 2 == 0 else list(workers)[::-1]   # alternate who goes first
    for name in order:
      times[name].append(workers[name].span())
    line = f"round {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in order)
    if "unifloral" in times:
      line += f"; ours / theirs {times['ours'][-1] / times['unifloral'][-1]:.3f}"
    say(line + f" (load {work_lib.loadavg()})")
  for w in workers.values():
    w.close()
  peak = max(peak, work_lib.matmul_peak_gflops())
  say()
  say(f"## Seconds per span ({args.steps} gradient steps + its rollout), 1 seed, turns")
  say("| | " + " | ".join(workers) + (" | ours / theirs |" if len(workers) > 1 else " |"))
  say("|---|" + "---|" * (len(workers) + (len(workers) > 1)))
  med = {n: work_lib.median(t) for n, t in times.items()}
  ratios = ([o / u for o, u in zip(times["ours"], times["unifloral"])]
            if "unifloral" in times else [])
  extra = lambda s: f" {s} |" if ratios else ""  # noqa: E731
  say("| per round (s) | " + " | ".join(_fmt(t) for t in times.values()) + " |"
      + extra(_fmt(ratios)))
  say("| median (s) | " + " | ".join(f"{m:.2f}" for m in med.values()) + " |"
      + extra(f"**{work_lib.median(ratios):.3f}** (median of the rounds' ratios)"))
  for kind in ("xla", "jaxpr"):
    fl = {n: w.info["flops"][kind] for n, w in workers.items()}
    say(f"| TFLOP per span ({kind}) | " + " | ".join(f"{f / 1e12:.3f}" for f in fl.values())
        + " |" + extra(f"{fl['ours'] / fl['unifloral']:.3f}" if ratios else ""))
    say(f"| GFLOP/s ({kind}, at the median) | "
        + " | ".join(f"{work_lib.gflops(fl[n], med[n]):.1f}" for n in workers) + " |"
        + extra(""))
  say(f"| % of the matmul peak ({peak:.0f} GFLOP/s, xla) | " + " | ".join(
      f"{100 * work_lib.gflops(workers[n].info['flops']['xla'], med[n]) / peak:.1f}%"
      for n in workers) + " |" + extra(""))
  say("| XLA bytes accessed per span (GB) | " + " | ".join(
      f"{w.info['flops']['xla_bytes'] / 1e9:.1f}" for w in workers.values()) + " |" + extra(""))
  say()
  say("FLOPs per span = the rollout (its 5-step scan unrolled for XLA's count) + steps x one "
      "gradient step, each compiled on its own (XLA's cost analysis counts a loop body once); "
      "jaxpr: benchmarks/common.jaxpr_flops of the same pieces (2MNK per matmul, one per "
      "elementwise output).")
  if "jaxpr_epoch" in workers["ours"].info["flops"]:
    say(f"ours, whole epoch's jaxpr (cells_program.make_cells_chunk): "
        f"{workers['ours'].info['flops']['jaxpr_epoch'] / 1e12:.3f} TFLOP")
  say(f"matmul peak: {peak:.0f} GFLOP/s (float32 jnp.dot of [n, n] x [n, n], n = 1024 and "
      "2048, the best call over 5 s each, at the start and at the end)")
  say(f"load average (1/5/15 min) at end: {work_lib.loadavg()}")


def seeds4(args, say):
  header(say, args, "seeds4")
  say(f"{args.spans} timed spans per process after {args.warmup} warm-up span(s); ours: one "
      "program of 4 cells; unifloral: 4 single-seed processes one after the other; ours 1: the "
      "same with our single-seed program")
  rows = {}
  w = Worker(args, "ours", seeds=4).ready()
  describe(say, "ours x4 (one program)", w.info)
  spans = [w.span() for _ in range(args.spans)]
  rows["ours, 4 seeds in one program"] = (spans, w.close())
  say(f"ours 4 in one: spans [{_fmt(spans)}] s")
  for which, label in (("unifloral", "unifloral, 4 single-seed runs in a row"),
                       ("ours", "ours, 4 single-seed runs in a row")):
    all_spans, wall = [], 0.0
    for seed in range(4):
      w = Worker(args, which, seed=seed).ready()
      if seed == 0:
        describe(say, f"{which} x1", w.info)
      spans = [w.span() for _ in range(args.spans)]
      wall += w.close()
      all_spans += spans
      say(f"{which} seed {seed}: spans [{_fmt(spans)}] s (load {work_lib.loadavg()})")
    rows[label] = (all_spans, wall)
  say()
  say(f"## 4 seeds x {args.spans} span(s) of {args.steps} steps: wall time of the timed spans")
  say("| | span seconds, total | per seed per span (s) | x unifloral | process wall incl. setup, "
      "compile, warm-up (s) |")
  say("|---|---|---|---|---|")
  base = sum(rows["unifloral, 4 single-seed runs in a row"][0])
  for label, (spans, wall) in rows.items():
    total = sum(spans)
    say(f"| {label} | {total:.1f} | {total / 4 / args.spans:.2f} | {total / base:.3f} | "
        f"{wall:.0f} |")
  say(f"load average (1/5/15 min) at end: {work_lib.loadavg()}")


def seeds4_turns(args, say):
  """4 seeds, all alive together, in turns: per round ours' 4-cell program runs one span, then
  unifloral's single-seed worker runs 4 spans (its 4 seeds' runs, one after the other: the same
  program, so one process stands for the 4), then ours' single-seed worker runs 4 spans. Setup
  and compilation are excluded (the `seeds4` design shows each process's whole wall time)."""
  header(say, args, "seeds4_turns")
  workers = {"ours, 4 seeds in one program": Worker(args, "ours", seeds=4),
             "unifloral, 4 single-seed runs in a row": Worker(args, "unifloral"),
             "ours, 4 single-seed runs in a row": Worker(args, "ours")}
  for name, w in workers.items():
    describe(say, name, w.ready().info)
  reps = {name: 1 if i == 0 else 4 for i, name in enumerate(workers)}
  times = {name: [] for name in workers}
  for r in range(args.rounds):
    for name, w in workers.items():
      times[name].append(sum(w.span() for _ in range(reps[name])))
    base = times["unifloral, 4 single-seed runs in a row"][-1]
    say(f"round {r + 1}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items())
        + "; x unifloral: " + ", ".join(f"{t[-1] / base:.3f}" for t in times.values())
        + f" (load {work_lib.loadavg()})")
  for w in workers.values():
    w.close()
  say()
  say(f"## 4 seeds x 1 span of {args.steps} steps, in turns: seconds per round")
  say("| | per round (s) | median (s) | per seed (s) | x unifloral, per round | median ratio |")
  say("|---|---|---|---|---|---|")
  base = times["unifloral, 4 single-seed runs in a row"]
  for name, t in times.items():
    ratios = [a / b for a, b in zip(t, base)]
    say(f"| {name} | {_fmt(t)} | {work_lib.median(t):.2f} | {work_lib.median(t) / 4:.2f} | "
        f"{_fmt(ratios)} | **{work_lib.median(ratios):.3f}** |")
  say(f"load average (1/5/15 min) at end: {work_lib.loadavg()}")


def smoke(args):
  """Ours only, tiny sizes, in this process: seconds."""
  from benchmarks.peers import ours
  work = work_lib.Work(steps=20, rollout_batch=64, rows=2000, critics=2, hidden=32, layers=3,
                       dyn_hidden=32, dyn_layers=2)
  side = ours.Ours(work, work_lib.synthetic_data(work.rows), seeds=1,
                   dyn_weight_decay=(2.5e-5, 5e-5, 1e-4))
  compile_s = side.compile()
  spans = [side.span() for _ in range(2)]
  print(f"smoke: ours compiled in {compile_s:.1f} s; 2 spans of {work.steps} steps: "
        f"{_fmt(spans)} s")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  work_lib.add_work_flags(parser)
  parser.add_argument("--unifloral", default=None, help="path of a unifloral checkout")
  parser.add_argument("--design", choices=("turns", "seeds4", "seeds4_turns"),
                      default="turns")
  parser.add_argument("--rounds", type=int, default=3,
                      help="turns / seeds4_turns: rounds (a span each, 4 for single seeds)")
  parser.add_argument("--spans", type=int, default=2, help="seeds4: timed spans per process")
  parser.add_argument("--warmup", type=int, default=1, help="untimed spans after compiling")
  parser.add_argument("--out", default=None, help="also write the record to this file")
  parser.add_argument("--smoke", action="store_true", help="ours only, tiny, seconds")
  parser.add_argument("--verbose", action="store_true", help="show the workers' stderr")
  parser.add_argument("--python", default=sys.executable, help="Python of our worker")
  parser.add_argument("--unifloral_python", default=sys.executable,
                      help="Python of unifloral's worker (e.g. a venv with another JAX)")
  parser.add_argument("--worker", choices=("ours", "unifloral"), help=argparse.SUPPRESS)
  parser.add_argument("--seeds", type=int, default=1, help=argparse.SUPPRESS)
  parser.add_argument("--flops", action="store_true", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.worker:
    return worker(args)
  if args.smoke:
    return smoke(args)
  if not args.unifloral:
    parser.error("--unifloral=/path/to/unifloral is needed (or --smoke for ours only)")
  say = Record(args.out)
  {"turns": turns, "seeds4": seeds4, "seeds4_turns": seeds4_turns}[args.design](args, say)


if __name__ == "__main__":
  main()
