"""Part v of the device record (plan speed): variants of the paper's epoch timed in one call, each
beside the baseline measured in the same part:

- the regression anchor: MOMBO `lcb` at 1 and 16 cells, beside the 2026-11-23 rows (0.17 / 0.54 s,
  benchmarks/bench_scale_gpu.txt: sizing.ANCHOR_LCB_S);
- MOMBO `elite_spread` at 16 cells: the baseline (this checkout's defaults on the device), the
  matmul precision (Config matmul_precision "float32", the references', against "tensorfloat32"),
  the rollout's pieces (MOMBO_JAX_PREDICT_ROWS none / 10000 / 1000) and the critic's matmul
  (MOMBO_JAX_CRITIC_MATMUL rewrite / jax).

Each variant is its own process (the environment variables are read when a program is traced, and
a setting must not leak into the next program): up to WAVE of them compile side by side (the
host's cores; compilation is most of a variant's time), then take turns on the device under a
file lock, so no two timings overlap. A variant whose setting this checkout does not have (the
Config field or the environment variable, added by issue #43 item 2's other branches) is named as
skipped, with the reason. Writes v_variants.md (through stdout) and its rates (record.json).
"""
import fcntl
import json
import os
import subprocess
import sys
import time

from benchmarks.device import kit as kit_lib, sizing

# name: (bench_scale algorithm, cells, environment, Config settings)
VARIANTS = {
    "anchor lcb, 1 cell": ("mombo_lcb", 1, {}, {}),
    "anchor lcb, 16 cells": ("mombo_lcb", 16, {}, {}),
    "baseline": ("mombo", 16, {}, {}),
    "precision float32": ("mombo", 16, {}, {"matmul_precision": "float32"}),
    "precision tensorfloat32": ("mombo", 16, {}, {"matmul_precision": "tensorfloat32"}),
    "pieces none": ("mombo", 16, {"MOMBO_JAX_PREDICT_ROWS": "none"}, {}),
    "pieces 10000": ("mombo", 16, {"MOMBO_JAX_PREDICT_ROWS": "10000"}, {}),
    "pieces 1000": ("mombo", 16, {"MOMBO_JAX_PREDICT_ROWS": "1000"}, {}),
    "critic matmul jax": ("mombo", 16, {"MOMBO_JAX_CRITIC_MATMUL": "jax"}, {}),
    "critic matmul rewrite": ("mombo", 16, {"MOMBO_JAX_CRITIC_MATMUL": "rewrite"}, {}),
}
# The smoke's: MOPO at 2 cells, the baseline and one environment variable (--lean: the baseline
# only: the machinery, one compile).
SMOKE_VARIANTS = {"baseline": ("mopo", 2, {}, {}),
                  "pieces none": ("mopo", 2, {"MOMBO_JAX_PREDICT_ROWS": "none"}, {})}
WAVE = 5                 # variants compiled side by side (16 host cores; ~8 GiB each at 16 cells)
REPEATS = 2              # timed epochs after a warm-up, best of


def say(line=""):
  print(line, flush=True)


def missing_setting(env: dict, settings: dict):
  """Why this checkout cannot run a variant (None: it can): a Config setting it lacks, or an
  environment variable no file of the package reads."""
  if settings:
    from mombo_jax.settings import config as config_lib  # the project, only where asked
    try:
      config_lib.make_config("walker2d-medium", "mombo").replace(**settings)
    except (ValueError, TypeError) as e:
      return f"the Config has no {', '.join(settings)} setting in this checkout ({e})"
  root = os.path.join(kit_lib.ROOT, "mombo_jax")
  for var in env:
    found = False
    for top, _, names in os.walk(root):
      for n in names:
        if n.endswith(".py"):
          with open(os.path.join(top, n)) as f:
            if var in f.read():
              found = True
    if not found:
      return f"no file of mombo_jax reads {var} in this checkout"
  return None


def one(args):
  """A child: compile the variant, wait for the device, time it, write its json."""
  # The child's imports: the parent plans with the standard library only (record.py's rule).
  import numpy as np

  from benchmarks.device import speed
  variants = SMOKE_VARIANTS if args.smoke else VARIANTS
  algo, cells, _, settings = variants[args.one]
  sz = sizing.sizes(args.smoke)
  lock = open(os.path.join(args.work, "variants.lock"), "w")

  def ready():
    fcntl.flock(lock, fcntl.LOCK_EX)     # released when this process exits

  t = speed.time_program(algo, cells, sz, np.random.default_rng(0), speed.max_epochs(args.smoke),
                         repeats=REPEATS, settings=settings, ready=ready)
  with open(os.path.join(args.work, f"variant_{_slug(args.one)}.json"), "w") as f:
    json.dump(t, f)


def _slug(name):
  return "".join(c if c.isalnum() else "_" for c in name)


def main():
  args = kit_lib.part_args(__doc__, {
      "--one": dict(default=None, help="(internal) time one variant, by name"),
      "--lean": dict(action="store_true", help="The test suite's smoke: one variant.")})
  if args.one:
    return one(args)
  t_end = time.time() + args.soft_s
  variants = dict(SMOKE_VARIANTS if args.smoke else VARIANTS)
  if args.lean:
    variants = {"baseline": variants["baseline"]}
  say(f"# Device record, part v: variants of the epoch, timed in one call "
      f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
  say(f"each a process of its own, up to {WAVE} compiled side by side, timed in turn (best of "
      f"{REPEATS} after a warm-up); soft deadline {args.soft_s:.0f} s")
  runnable, rows = {}, {}
  for name, (algo, cells, env, settings) in variants.items():
    why = missing_setting(env, settings)
    if why:
      rows[name] = f"skipped: {why}"
    else:
      runnable[name] = (algo, cells, env, settings)
  names = list(runnable)
  for start in range(0, len(names), WAVE):
    wave, procs = names[start:start + WAVE], {}
    left = t_end - time.time()
    if left < 20:
      for name in wave:
        rows[name] = f"skipped: {left:.0f} s of the part's deadline left"
      continue
    for name in wave:
      env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false", **runnable[name][2])
      cmd = [sys.executable, "-m", "benchmarks.device.variants", f"--one={name}",
             f"--out={args.out}", f"--work={args.work}"] + (["--smoke"] if args.smoke else [])
      log = open(os.path.join(args.work, f"variant_{_slug(name)}.log"), "w")
      procs[name] = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                     cwd=kit_lib.ROOT)
    for name, proc in procs.items():
      try:
        rc = proc.wait(timeout=max(t_end - time.time(), 1.0))
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = "killed at the part's deadline"
      path = os.path.join(args.work, f"variant_{_slug(name)}.json")
      if os.path.exists(path):
        with open(path) as f:
          rows[name] = json.load(f)
      else:
        with open(os.path.join(args.work, f"variant_{_slug(name)}.log")) as f:
          last = (f.read().strip().splitlines() or ["(no output)"])[-1]
        rows[name] = f"failed ({rc}): {last[:150]}"
  table(rows, variants, args)


def table(rows, variants, args):
  base = rows.get("baseline")
  base_s = base["seconds"] if isinstance(base, dict) else None
  say("\n| variant | algorithm | cells | environment / settings | compile s | s / epoch | "
      "x the baseline | memory GiB |")
  say("|---|---|---|---|---|---|---|---|")
  rates = {}
  for name, (algo, cells, env, settings) in variants.items():
    what = ", ".join([f"{k}={v}" for k, v in env.items()]
                     + [f"{k}={v}" for k, v in settings.items()]) or "defaults"
    r = rows.get(name, "not run")
    if not isinstance(r, dict):
      say(f"| {name} | {algo} | {cells} | {what} | {r} | | | |")
      continue
    ratio = (f"{r['seconds'] / base_s:.3f}" if base_s and cells == variants["baseline"][1]
             and algo == variants["baseline"][0] else "-") if "baseline" in variants else "-"
    say(f"| {name} | {algo} | {cells} | {what} | {r['compile_s']:.1f} | {r['seconds']:.3f} | "
        f"{ratio} | {r['mem_gb']:.2f} |")
    rates[name] = round(r["seconds"], 4)
  anchor = {c: rows.get(f"anchor lcb, {c} cell" + ("s" if c > 1 else "")) for c in (1, 16)}
  if any(isinstance(a, dict) for a in anchor.values()):
    say("\nthe regression anchor, MOMBO lcb, beside benchmarks/bench_scale_gpu.txt (2026-11-23): "
        + "; ".join(f"{c} cell(s) {a['seconds']:.3f} s against {sizing.ANCHOR_LCB_S[c]:.2f} s "
                    f"({a['seconds'] / sizing.ANCHOR_LCB_S[c]:.2f}x)"
                    for c, a in anchor.items() if isinstance(a, dict)))
  say(f"\npart v ended; load {os.getloadavg()[0]:.1f}")
  kit_lib.write_rates(args.work, "v", {"variants_s": rates})


if __name__ == "__main__":
  main()
