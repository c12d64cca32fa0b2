"""python3 -m benchmarks.fidelity --algo=mombo|mobile|mopo --reference=DIR [--steps=K]

Steps the released reference's update (adinlab/MOMBO at 079def7 for mombo, OfflineRL-Kit at
43ec147 for mobile and mopo; DIR a checkout of it) beside ours from the same weights, batches and
random draws, and prints per quantity the largest absolute and relative difference after K = 1,
10, 100, 1000 steps (those <= --steps, and --steps itself), in float32 and float64, with a verdict:
rounding, named (the reference's file:line, what ours does and why) or FAIL. Exit status 1 when
any row FAILs. README.md says more.
"""
from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time

import jax

from benchmarks.fidelity import reference, rows

CHECKPOINTS = (1, 10, 100, 1000)
KINDS = {"mombo": ("mombo", "mombo-lcb"), "mobile": ("mobile",), "mopo": ("mopo",)}


def parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python3 -m benchmarks.fidelity", description=__doc__.split(
      "\n\n")[1])
  p.add_argument("--algo", required=True, choices=sorted(KINDS))
  p.add_argument("--reference", required=True, metavar="DIR",
                 help="checkout of adinlab/MOMBO at 079def7 (mombo) or OfflineRL-Kit at 43ec147")
  p.add_argument("--steps", type=int, default=1000, metavar="K",
                 help="the last gradient step compared (default 1000)")
  p.add_argument("--dtypes", default="float32,float64", help="comma-separated (default both)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--out", default=None, help="also write the output to this file")
  return p


def checkpoints(steps: int):
  if steps < 1:
    raise SystemExit(f"--steps={steps}: pass a number of gradient steps >= 1.")
  return sorted({k for k in CHECKPOINTS if k <= steps} | {steps})


def _float64_modules(algo: str):
  """The reference's modules whose forward passes cast to torch.float32."""
  if algo == "mombo":
    return [sys.modules["models.actor_critic"], sys.modules["models.dynamics_model"]]
  return [sys.modules[f"offlinerlkit.modules.{m}"] for m in ("actor_module", "critic_module",
                                                           "dynamics_module")]


def _cpu() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return f"{names[0]} ({len(names)} logical cores)"
  except (OSError, IndexError):
    return platform.processor() or platform.machine()


def _dynamics_part(algo, path, dtype, seed):
  """fid-dyn's dynamics and rollout comparisons (benchmarks/fidelity/dynamics_side.py), if that
  module is here: (rows, stub notes); None where it is not."""
  try:
    module = importlib.import_module("benchmarks.fidelity.dynamics_side")
  except ModuleNotFoundError as e:
    if e.name != "benchmarks.fidelity.dynamics_side":
      raise
    return None
  result = module.compare(algo, path, dtype, seed)
  return result if isinstance(result, tuple) else (result, [])


def run(args) -> int:
  # float64 on our side needs x64, set before the run makes any array (not at import: the docs'
  # test imports this module to read its parser). The float32 run is checked to stay float32
  # (agent_side._same_dtype).
  jax.config.update("jax_enable_x64", True)
  path = os.path.abspath(args.reference)
  commit = reference.check(args.algo, path)
  steps = checkpoints(args.steps)
  dtypes = [d for d in args.dtypes.split(",") if d]
  if not set(dtypes) <= {"float32", "float64"} or not dtypes:
    raise SystemExit(f"--dtypes={args.dtypes}: choose from float32,float64.")
  # Their code needs torch (benchmarks/fidelity/requirements.txt), which the product does not:
  # imported once the arguments are checked.
  try:
    import torch  # noqa: E402
  except ModuleNotFoundError:
    raise SystemExit("error: benchmarks.fidelity needs torch (CPU), which the product does "
                     "not: pip install -r benchmarks/fidelity/requirements.txt --index-url "
                     "https://download.pytorch.org/whl/cpu") from None

  from benchmarks.fidelity import agent_side, stubs  # noqa: E402
  # One torch thread: torch's pool (a thread per core) beside XLA's on a busy shared CPU made
  # their learn() 5x slower (3 s a MOPO step at load 20 on 2 cores; 0.2 s with one thread).
  torch.set_num_threads(1)
  mods, notes = reference.load(args.algo, path)
  notes += [stubs.DRAWS_NOTE, agent_side.LR_NOTE]
  out, lines = [], []
  for dtype in sorted(dtypes, key=["float32", "float64"].index):
    if dtype == "float64":
      notes.append(stubs.float64_casts(_float64_modules(args.algo)))
      notes.append(stubs.float64_default())
    for kind in KINDS[args.algo]:
      for match_eps in ([False, True] if dtype == "float64" and kind in agent_side.POOLED
                        else [False]):
        start = time.time()
        part = agent_side.compare(kind, mods, dtype, steps, args.seed, match_eps)
        out += part
        lines.append(f"{part[0]['section']}: {time.time() - start:.0f} s")
    dyn = _dynamics_part(args.algo, path, dtype, args.seed)
    if dyn is not None:
      out += dyn[0]
      notes += [n for n in dyn[1] if n not in notes]
  out = rows.settle_float32(out)
  header = [
      f"# python3 -m benchmarks.fidelity --algo={args.algo} --reference=DIR --steps={args.steps}"
      f" --dtypes={args.dtypes} --seed={args.seed}",
      f"# reference: {reference.PINNED[args.algo].name} at {commit}",
      f"# machine: {_cpu()}; torch {torch.__version__}, jax {jax.__version__}, python "
      f"{platform.python_version()}",
      "# task settings: walker2d-medium (the references' rows; synthetic batches, a random "
      "untrained dynamics ensemble: benchmarks/fidelity/ours.py)",
      "# max rel = max |ours - theirs| / max |theirs| over all entries; verdict rounding below "
      f"{rows.ROUNDING['float32']:g} (float32) / {rows.ROUNDING['float64']:g} (float64)",
      "# stubs and stand-ins:"] + [f"#  - {n}" for n in notes]
  if not any(r["section"].startswith(("dynamics", "rollout")) for r in out):
    header.append("# dynamics and rollout comparisons: not in this record (dynamics_side.py, "
                  "issue #48's other half, adds them)")
  text = "\n".join(header + [rows.table(out), "", "# " + rows.summary(out)]
                   + [f"# time: {line}" for line in lines]) + "\n"
  sys.stdout.write(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  return 1 if any(r["verdict"] == "FAIL" for r in out) else 0


def main(argv=None) -> int:
  return run(parser().parse_args(argv))


if __name__ == "__main__":
  sys.exit(main())
