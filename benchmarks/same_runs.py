"""Runs unchanged by a refactor: tiny runs trained by two checkouts of the code give byte-identical
metrics.csv and summary.json and equal checkpoint arrays, and a run stopped by the older code
resumes under the newer to the straight run's files.

  python3 benchmarks/same_runs.py --base=/path/to/older/checkout --new=. --out=/tmp/same_runs

Each checkout trains, in one process of its own (PYTHONPATH=<checkout>, so compilations are shared
between its cases), on the same locally built 2,000-step hopper-random (one Minari folder under
--out, built by the base's collector), through the API both share (config.make_config,
run_specs.RunSpec, launch.LaunchOptions, launch.train_runs, run_state.restore):

  plain       MOMBO, 2 seeds, 3 epochs, evaluated every epoch
  grid        MOMBO --betas=0.5,1 (two workdirs in one program, their dynamics shared)
  resume      MOMBO stopped after 2 epochs (stop_after), then the same launch again
  mopo        MOPO, as plain
  mobile      MOBILE, as plain
  handover    the base's resume case stopped after 2 epochs, then resumed by --new's code

Compared: every workdir's metrics.csv and summary.json byte for byte, and every array of its last
checkpoint (np.array_equal, NaNs equal); handover against the base's plain run. Prints one line per
comparison and exits 1 on any difference. A step already done in --out (<step>.done) is not
repeated: --only_base trains the base's runs ahead, a later call the new code's. CPU: about 3 min
per checkout on the busy 2-core machine of issue #50 (benchmarks/same_runs.txt).
"""
import argparse
import filecmp
import json
import os
import subprocess
import sys

import numpy as np

TINY = dict(epochs=3, steps_per_epoch=5, rollout_batch_size=32, eval_every=1, eval_episodes=1,
            num_seeds=2)
CASES = ("plain", "grid", "resume", "mopo", "mobile")

# What one checkout runs (in its own process): the cases, each workdir's last checkpoint saved to
# <workdir>/arrays.npz for the comparison. Only names that both checkouts define.
_TRAIN = r"""
import json, os, sys
import jax, numpy as np
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import launch, run_state
from mombo_jax.run.run_specs import RunSpec
from mombo_jax.settings import config as config_lib

out, cases, tiny, stop_first = sys.argv[1], sys.argv[2].split(","), json.loads(sys.argv[3]), \
    sys.argv[4] == "1"

def config(algo, **kw):
  return config_lib.make_config("hopper-random", algo, preset="tiny", **dict(tiny, **kw))

def dump(workdir):
  state, _ = run_state.restore(Workdir(workdir))
  leaves = jax.tree_util.tree_flatten_with_path(state)[0]
  np.savez(os.path.join(workdir, "arrays.npz"),
           **{jax.tree_util.keystr(p): np.asarray(x) for p, x in leaves})

def train(specs, **options):
  return launch.train_runs(specs, launch.LaunchOptions(**options))

for case in cases:
  root = os.path.join(out, case)
  if case == "grid":
    dyn = os.path.join(root, "dynamics")
    specs = [RunSpec(config("mombo", beta=b), "hopper-random", os.path.join(root, f"beta{b:g}"),
                     dyn) for b in (0.5, 1.0)]
  else:
    specs = [RunSpec(config("mombo" if case in ("plain", "resume", "handover") else case),
                     "hopper-random", root)]
  if case in ("resume", "handover") and stop_first:
    assert train(specs, stop_after=2) == [None]
    if case == "handover":
      continue                       # the other checkout resumes it
  train(specs)
  for s in specs:
    dump(s.workdir)
"""

_BUILD = r"""
from mombo_jax.collection import recipes
recipes.build_random("hopper-random", steps=2000, seed=0, log_fn=lambda *a: None)
"""


def _python(code_root, args, minari):
  env = dict(os.environ, PYTHONPATH=os.path.abspath(code_root), MINARI_DATASETS_PATH=minari,
             JAX_DEFAULT_MATMUL_PRECISION="float32")
  env.pop("MOMBO_JAX_COMPILATION_CACHE", None)
  subprocess.run([sys.executable, "-c", *args], check=True, env=env, cwd=os.path.abspath(code_root))


def _workdirs(root):
  for dirpath, _, files in os.walk(root):
    if "summary.json" in files:
      yield os.path.relpath(dirpath, root)


def _compare(a, b) -> list:
  """The differences between workdirs a and b (empty: the same run)."""
  out = []
  for name in ("metrics.csv", "summary.json"):
    if not filecmp.cmp(os.path.join(a, name), os.path.join(b, name), shallow=False):
      out.append(f"{name} differs")
  x, y = np.load(os.path.join(a, "arrays.npz")), np.load(os.path.join(b, "arrays.npz"))
  if sorted(x.files) != sorted(y.files):
    out.append(f"checkpoint leaves differ: {sorted(set(x.files) ^ set(y.files))}")
  for k in sorted(set(x.files) & set(y.files)):
    if x[k].shape != y[k].shape or not np.array_equal(x[k], y[k], equal_nan=True):
      out.append(f"checkpoint array {k} differs")
  return out


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--base", required=True, help="the older checkout (e.g. a worktree of ffc5631)")
  p.add_argument("--new", default=".", help="the newer checkout")
  p.add_argument("--out", required=True, help="an empty folder for the runs")
  p.add_argument("--cases", default=",".join(CASES))
  p.add_argument("--only_base", action="store_true", help="train the base's runs only (a later "
                 "call with the same --out trains the new code's and compares)")
  args = p.parse_args()
  minari = os.path.join(args.out, "minari")
  os.makedirs(minari, exist_ok=True)
  out = os.path.abspath(args.out)
  handover = os.path.join(out, "handover")
  steps = [("base", args.base, os.path.join(out, "base"), args.cases, "1"),
           # a run stopped by the base's code, resumed by the new
           ("handover-stop", args.base, handover, "handover", "1"),
           ("new", args.new, os.path.join(out, "new"), args.cases, "1"),
           ("handover-resume", args.new, handover, "handover", "0")]
  if not os.path.exists(os.path.join(out, "built")):
    _python(args.base, [_BUILD], minari)
    open(os.path.join(out, "built"), "w").close()
  for name, code, folder, cases, stop_first in steps:
    done = os.path.join(out, f"{name}.done")    # --only_base now, the new code later
    if os.path.exists(done) or (args.only_base and code is args.new):
      continue
    _python(code, [_TRAIN, folder, cases, json.dumps(TINY), stop_first], minari)
    open(done, "w").close()
  if args.only_base:
    return 0

  failed = 0
  base, new = os.path.join(args.out, "base"), os.path.join(args.out, "new")
  pairs = [(os.path.join(base, w), os.path.join(new, w), w) for w in sorted(_workdirs(base))]
  pairs.append((os.path.join(base, "plain"), os.path.join(handover, "handover"),
                "handover (base stopped, new resumed) vs base plain"))
  for a, b, what in pairs:
    diff = _compare(a, b)
    failed += bool(diff)
    print(f"{what}: " + ("; ".join(diff) if diff else
                         "metrics.csv, summary.json byte-identical, every checkpoint array equal"))
  print(f"{len(pairs) - failed} of {len(pairs)} the same")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
