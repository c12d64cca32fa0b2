"""One command records what a lent GPU can tell in one call (issues #36, #43):

  python3 -m benchmarks.device.record --out=$OUT --plan=speed|learning [--budget_s=480] [--smoke]

On the device: installs the kit's carried wheels (benchmarks.device.prepare made them), then runs
one plan's parts in order, each in its own process with a time cap fixed before the first part
starts (benchmarks/device/sizing.py: the plans, the rates they are sized from, with sources):

  plan speed
  a  the facts: GPU, driver, JAX and every package version, host cores     -> a_facts.txt
  b  the GPU tests: vmapped cells, sharding, moment matching (pytest)       -> b_gpu_tests.txt
  c  speed at the paper's settings: epochs at 16 / 1 / 48 / 4 cells, the
     goals; MOMBO's epoch traced at 1, 16 and 48 cells (jax.profiler),       -> c_speed.md,
     summarised per phase and kernel                                           c_profile.md
  v  variants timed in the same call: the regression anchor (MOMBO lcb),
     the matmul precision, the rollout's pieces, the critic's matmul        -> v_variants.md
  plan learning
  a  the facts                                                              -> a_facts.txt
  d  learning: MOMBO (elite_spread), MOBILE, MOPO, 4 seeds, the same epochs  -> d_learning.md,
     on the kit's dataset, the paper's numbers beside them                     d_curves.png
  e  Table 2 (experiments.uncertainty) on d's runs                          -> e_uncertainty.md
  m  the mixed cell: the three at the paper's mixed settings (actor 5x1024), -> m_mixed.md
     4 seeds each, a few epochs: the rate that sizes the paper's mixed table
  and record.json: the plan, each part's status, cap and wall time, the skipped parts and why,
  and the rates measured (the next record's sizing starts from them).

A part's output streams into its file as it comes, so a part killed at its cap keeps what it had
printed. A part once planned runs: its cap is planned up front, and a part that ends early leaves
its spare to the next; a part whose measured rates disagree with the plan shrinks its work (fewer
rows, fewer epochs), never the next part's. At most 8 files (7 planned), named in letters,
digits, '.', '_' and '-'. Exit status 0 when every part it started ended by itself (a part that
ended with failures, e.g. a failing test, is named in record.json with its exit status; only a
part killed at its cap makes the exit 1).

--smoke: the plan's parts at tiny sizes on the CPU, reading a kit made by `prepare --smoke` (the
test suite's, with --lean_smoke: part b one test, part c without its chunk lengths, evaluation
share and gradient-step table, part v its baseline only). Standard library only until the wheels
are in: this file imports nothing of the project.
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

FILES = {"a": ("a_facts.txt",), "b": ("b_gpu_tests.txt",), "c": ("c_speed.md", "c_profile.md"),
         "v": ("v_variants.md",), "d": ("d_learning.md", "d_curves.png"),
         "e": ("e_uncertainty.md",), "m": ("m_mixed.md",)}
RECORD = "record.json"
MODULES = {"a": "facts", "b": "gpu_tests", "c": "speed", "v": "variants", "d": "learning",
           "e": "table2", "m": "mixed_cell"}
MAX_FILES = 8
NAME = re.compile(r"^[A-Za-z0-9._-]+$")
# Each plan keeps within 7 files (the device returns 8: one to spare).
assert all(sum(len(FILES[p]) for p in parts) + 1 <= MAX_FILES - 1
           for parts in sizing.PLANS.values())
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
  Minari root, unbuffered output, a compilation cache in the work folder."""
  env = dict(os.environ)
  path = [p for p in (site, kit_lib.ROOT, env.get("PYTHONPATH")) if p]
  env.update(PYTHONPATH=os.pathsep.join(path), PYTHONUNBUFFERED="1",
             MINARI_DATASETS_PATH=kit_lib.kit_path(args.kit, "minari"),
             MOMBO_DEVICE_WORK=work)
  # One persistent compilation cache for the parts: a program compiled twice (part c's MOMBO at
  # 16 cells and part v's baseline; the smoke's MOPO) is compiled once.
  env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(work, "jax_cache"))
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
  if args.lean_smoke and part in ("b", "c", "v"):
    cmd.append("--lean")
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


def _cannot_run(part, work):
  """Why a part cannot run (None: it can): part e needs part d's runs, from this call or an
  earlier one's --work (rates_d.json names them)."""
  if part == "e" and not read_rates(work, "d").get("d_root"):
    return f"part d left no runs in {work} (rates_d.json): run part d first, with this --work"
  return None


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
                      "table) and part v times one variant; the test suite's smoke, for time.")
  parser.add_argument("--plan", choices=sorted(sizing.PLANS), default="speed",
                      help="Which plan: speed (a, b, c, v) or learning (a, d, e, m); "
                      "`prepare --check` names the one the newest committed record lacks.")
  parser.add_argument("--parts", default=None,
                      help="A subset of the plan's parts, e.g. de (the others are named as "
                      "skipped); default all of them.")
  parser.add_argument("--work", default=None,
                      help="Scratch of the parts (part d's runs); default a new temporary folder.")
  parser.add_argument("--site", default="/tmp/mombo_device_site",
                      help="Where the carried wheels are installed.")
  args = parser.parse_args(argv)
  if args.lean_smoke and not args.smoke:
    parser.error("--lean_smoke trims the smoke record: pass it with --smoke.")
  planned = sizing.PLANS[args.plan]
  asked = planned if args.parts is None else tuple(args.parts)
  if not set(asked) <= set(planned):
    parser.error(f"--parts={args.parts}: plan {args.plan} has the parts {''.join(planned)} "
                 f"(the other plan: --plan={'learning' if args.plan == 'speed' else 'speed'}).")
  t0 = time.time()
  os.makedirs(args.out, exist_ok=True)
  work = args.work or tempfile.mkdtemp(prefix="mombo_device_work_")
  os.makedirs(work, exist_ok=True)
  say = lambda line: print(f"[record {time.time() - t0:5.0f} s] {line}", flush=True)  # noqa: E731
  record = {"started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "command": " ".join(["python3 -m benchmarks.device.record"] + sys.argv[1:]),
            "plan": args.plan, "budget_s": args.budget_s, "smoke": args.smoke,
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
  plans = sizing.plan_parts(args.plan, args.budget_s, args.smoke)
  record["planned"] = {p: {"cap_s": round(q.cap_s, 1), "epochs": q.epochs}
                       for p, q in plans.items()}
  for i, part in enumerate(planned):
    if part not in asked:
      record["skipped"][part] = "not asked for (--parts)"
      say(f"part {part}: SKIPPED: not asked for (--parts)")
      write()
      continue
    plan = plans[part]
    # A part that ended early leaves its spare to the next; a part never starts with less than
    # the caps of the later parts leave it.
    later = sum(plans[p].cap_s for p in planned[i + 1:] if p in asked)
    left = args.budget_s - (time.time() - t0)
    if plan.skip:
      say(f"part {part}: SKIPPED: {plan.skip}")
      record["skipped"][part] = plan.skip
      write()
      continue
    plan = sizing.Plan(part, max(left - later, 1.0), epochs=plan.epochs)
    why = _cannot_run(part, work)
    if why:
      say(f"part {part}: SKIPPED: {why}")
      record["skipped"][part] = why
      write()
      continue
    result = run_part(part, plan, args, env, work, say)
    rates = read_rates(work, part)
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
