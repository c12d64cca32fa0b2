"""One command records what a lent GPU can tell in its minutes (issue #36):

  python3 -m benchmarks.device.record --out=$OUT [--budget_s=480] [--smoke] [--kit=.device_record]

On the device: installs the kit's carried wheels (benchmarks.device.prepare made them), then runs
the parts in priority order, each in its own process with a time cap taken from what is left of
the budget (benchmarks/device/sizing.py: the rates they are sized from, with sources):

  a  the facts: GPU, driver, JAX and every package version, host cores     -> a_facts.txt
  b  the GPU tests: vmapped cells, sharding, moment matching (pytest)       -> b_gpu_tests.txt
  c  speed at the paper's settings: epochs at 1 / 4 / 16 / 48 cells, 1000
     gradient steps, the runner's chunk length, the evaluation's share      -> c_speed.md
  d  learning: MOMBO (elite_spread), MOBILE, MOPO, 4 seeds, >= 100 epochs    -> d_learning.md,
     on the kit's dataset, the paper's numbers beside them                     d_curves.png
  e  if time is left: Table 2 (experiments.uncertainty) on d's runs         -> e_uncertainty.md
  and record.json: each part's status, cap and wall time, the skipped parts and why, and the
  rates measured (the next record's sizing starts from them).

A part's output streams into its file as it comes, so a part killed at its cap keeps what it had
printed; a part that cannot fit in what is left is skipped and named as skipped (in record.json
and on stdout). At most 8 files, named in letters, digits, '.', '_' and '-'. Exit status 0 when
every part it started ended by itself (a part that ended with failures, e.g. a failing test, is
named in record.json with its exit status; only a part killed at its cap makes the exit 1).

--smoke: every part at tiny sizes on the CPU (under 2 minutes on the 2-core test machine; in the
test suite, with --lean_smoke: part c without its second compiled program, the gradient-step
table), reading a kit made by `prepare --smoke`. Standard library only until the wheels are
in: this file imports nothing of the project.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks.device import kit as kit_lib, sizing

FILES = {"a": ("a_facts.txt",), "b": ("b_gpu_tests.txt",), "c": ("c_speed.md",),
         "d": ("d_learning.md", "d_curves.png"), "e": ("e_uncertainty.md",)}
RECORD = "record.json"
MODULES = {"a": "facts", "b": "gpu_tests", "c": "speed", "d": "learning", "e": "table2"}
MAX_FILES = 8
NAME = re.compile(r"^[A-Za-z0-9._-]+$")
assert sum(len(v) for v in FILES.values()) + 1 <= MAX_FILES
assert all(NAME.match(n) for v in FILES.values() for n in v)
# Seconds a part is given after its soft deadline (passed to it) before it is killed.
GRACE_S = 10.0


def install_wheels(kit: str, site: str, say) -> bool:
  """pip-installs the kit's wheels into `site` (no index, no dependencies: the kit holds each one
  needed); False when there are none to install."""
  wheels = kit_lib.wheels(kit)
  if not wheels:
    return False
  here = "%d.%d" % sys.version_info[:2]
  if here != kit_lib.PYTHON_VERSION:   # the device's Python; elsewhere the packages are installed
    say(f"note: not installing the kit's wheels (built for Python {kit_lib.PYTHON_VERSION}, this "
        f"is {here}): the installed packages are used")
    return False
  t = time.time()
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                  "--no-compile", "--no-cache-dir", "--upgrade", "--target", site, *wheels],
                 check=True)
  say(f"installed {len(wheels)} wheels into {site} in {time.time() - t:.1f} s")
  return True


def child_env(args, site, work) -> dict:
  """The parts' environment: the installed wheels and this checkout first on the path, the kit's
  Minari root, unbuffered output."""
  env = dict(os.environ)
  path = [p for p in (site, kit_lib.ROOT, env.get("PYTHONPATH")) if p]
  env.update(PYTHONPATH=os.pathsep.join(path), PYTHONUNBUFFERED="1",
             MINARI_DATASETS_PATH=kit_lib.kit_path(args.kit, "minari"),
             MOMBO_DEVICE_WORK=work)
  return env


def run_part(part, plan, args, env, work, say) -> dict:
  """Runs one part's module with its cap; its stdout and stderr stream into its first file."""
  out_file = os.path.join(args.out, FILES[part][0])
  deadline = time.time() + plan.cap_s
  cmd = [sys.executable, "-m", f"benchmarks.device.{MODULES[part]}", f"--out={args.out}",
         f"--work={work}", f"--kit={kit_lib.kit_path(args.kit)}",
         f"--soft_s={max(plan.cap_s - GRACE_S, 1.0):.0f}"]
  if args.smoke:
    cmd.append("--smoke")
  if args.lean_smoke and part == "c":
    cmd.append("--no_steps")
  if plan.epochs is not None:
    cmd.append(f"--epochs={plan.epochs}")
  say(f"part {part}: cap {plan.cap_s:.0f} s" + (f", {plan.epochs} epochs" if plan.epochs else "")
      + f": {' '.join(cmd[1:])}")
  t = time.time()
  with open(out_file, "ab") as f:
    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=kit_lib.ROOT,
                            start_new_session=True)   # its own group: a kill takes its children
    try:
      rc = proc.wait(timeout=max(deadline - time.time(), 1.0))
      status = "ok" if rc == 0 else f"ended with exit status {rc}"
      killed = False
      try:   # what it left running (env workers, pytest's) must not hold the GPU for the next
        os.killpg(proc.pid, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        pass
    except subprocess.TimeoutExpired:
      _kill_group(proc)
      rc, killed = None, True
      status = f"killed at its {plan.cap_s:.0f} s cap"
      f.write(f"\n[record] part {part} {status}\n".encode())
  return {"status": status, "exit": rc, "killed": killed, "cap_s": round(plan.cap_s, 1),
          "wall_s": round(time.time() - t, 1), "epochs": plan.epochs,
          "files": [n for n in FILES[part] if os.path.exists(os.path.join(args.out, n))]}


def _kill_group(proc):
  """SIGTERM to the part's process group (launches checkpoint and stop), SIGKILL 10 s later."""
  try:
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=10)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
  except ProcessLookupError:
    pass


def read_rates(work, part) -> dict:
  path = os.path.join(work, f"rates_{part}.json")
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="Folder of the record's files ($OUT).")
  parser.add_argument("--budget_s", type=float, default=480.0,
                      help="Wall seconds for the whole record, setup included.")
  parser.add_argument("--smoke", action="store_true", help="Tiny sizes, on the CPU.")
  parser.add_argument("--kit", default=None, help="The prepared kit (default .device_record).")
  parser.add_argument("--lean_smoke", action="store_true",
                      help="With --smoke: part c compiles one program, not two (no gradient-step "
                      "table); the test suite's smoke, for time.")
  parser.add_argument("--parts", default="".join(sizing.PARTS),
                      help="Which parts to run, e.g. abc (the others are named as skipped).")
  parser.add_argument("--work", default=None,
                      help="Scratch of the parts (part d's runs); default a new temporary folder.")
  parser.add_argument("--site", default="/tmp/mombo_device_site",
                      help="Where the carried wheels are installed.")
  args = parser.parse_args(argv)
  if args.lean_smoke and not args.smoke:
    parser.error("--lean_smoke trims the smoke record: pass it with --smoke.")
  t0 = time.time()
  os.makedirs(args.out, exist_ok=True)
  work = args.work or tempfile.mkdtemp(prefix="mombo_device_work_")
  os.makedirs(work, exist_ok=True)
  say = lambda line: print(f"[record {time.time() - t0:5.0f} s] {line}", flush=True)  # noqa: E731
  record = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "command": " ".join(["python3 -m benchmarks.device.record"] + sys.argv[1:]),
            "budget_s": args.budget_s, "smoke": args.smoke,
            "manifest": kit_lib.read_manifest(args.kit), "parts": {}, "skipped": {},
            "rates": {}, "sizing": sizing.__doc__.split("\n\n")[1]}

  def write():
    with open(os.path.join(args.out, RECORD), "w") as f:
      json.dump(record, f, indent=1)

  if record["manifest"] is None:
    say(f"note: no kit at {kit_lib.kit_path(args.kit)}; run `python3 -m benchmarks.device.prepare`"
        " first (part d needs its dataset; the wheels are assumed installed)")
  try:
    site = args.site if install_wheels(args.kit, args.site, say) else None
  except subprocess.CalledProcessError as e:   # the parts run anyway; part a shows what is there
    say(f"error: installing the kit's wheels failed ({e}); the parts run without them")
    record["install_error"] = str(e)
    site = None
  env = child_env(args, site, work)
  measured, done = {}, []
  for part in sizing.PARTS:
    left = args.budget_s - (time.time() - t0)
    if part not in args.parts:
      plan = sizing.Plan(part, 0.0, skip="not asked for (--parts)")
    else:
      plan = sizing.plan(part, left, args.smoke, measured, tuple(done))
    done.append(part)
    if plan.skip:
      say(f"part {part}: SKIPPED: {plan.skip}")
      record["skipped"][part] = plan.skip
      write()
      continue
    result = run_part(part, plan, args, env, work, say)
    rates = read_rates(work, part)
    measured.update(rates)
    if part == "d":
      measured["d_ran"] = result["status"] == "ok" or bool(rates)
    record["parts"][part] = result
    record["rates"].update(rates)
    say(f"part {part}: {result['status']} after {result['wall_s']:.0f} s; files "
        f"{', '.join(result['files']) or '-'}")
    write()
  record["wall_s"] = round(time.time() - t0, 1)
  killed = [p for p, r in record["parts"].items() if r["killed"]]
  record["exit"] = 1 if killed else 0
  write()
  files = sorted(os.listdir(args.out))
  say(f"done in {record['wall_s']:.0f} s: ran {','.join(record['parts']) or '-'}; skipped "
      f"{','.join(record['skipped']) or '-'}; killed {','.join(killed) or '-'}; {len(files)} "
      f"files in {args.out}: {', '.join(files)}")
  return record["exit"]


if __name__ == "__main__":
  sys.exit(main())
