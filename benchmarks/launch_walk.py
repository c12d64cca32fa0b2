"""The walk of one run from launch.train_runs through the package's modules: how often control
enters each module from another one, and how often it climbs (enters a module of a higher layer
than the caller's, .importlinter's order: a callback or a closure handed down and called back).

  python3 benchmarks/launch_walk.py --out=/tmp/walk [--code=/path/to/a/checkout]

Trains one tiny fresh MOMBO run (2 seeds, 2 epochs, hopper-random, the 2,000-step build of
tests/conftest.py made in --out's Minari folder if missing) under sys.setprofile in the main
thread, counting each call whose function lives in mombo_jax/ and whose nearest mombo_jax caller
lives in another module (one entry of that module). --code runs another checkout's package (its
launch.train_runs, RunSpec and make_config: every checkout since issue #44 has them), so two
checkouts' walks compare; the output names the checkout. Prints the modules entered, the entries,
the climbs, and the entries of the modules issue #50 names (dynamics_store, reuse, workdir).
"""
import argparse
import collections
import json
import os
import subprocess
import sys

_WALK = r"""
import collections, json, os, sys
import mombo_jax
from mombo_jax.collection import recipes
from mombo_jax.run import launch
from mombo_jax.run.run_specs import RunSpec
from mombo_jax.settings import config as config_lib

out = sys.argv[1]
root = os.path.dirname(os.path.abspath(mombo_jax.__file__))
if not os.path.isdir(os.path.join(os.environ["MINARI_DATASETS_PATH"], "mombo")):
  recipes.build_random("hopper-random", steps=2000, seed=0, log_fn=lambda *a: None)
config = config_lib.make_config("hopper-random", "mombo", preset="tiny", epochs=2, num_seeds=2,
                                steps_per_epoch=5, rollout_batch_size=32, eval_every=1,
                                eval_episodes=1)
entries = collections.Counter()
edges = collections.Counter()

def module(code):
  path = code.co_filename
  if not path.startswith(root):
    return None
  return os.path.relpath(path, root)[:-3].replace(os.sep, ".")

def caller(frame):
  frame = frame.f_back
  while frame is not None:
    m = module(frame.f_code)
    if m is not None:
      return m
    frame = frame.f_back
  return None

def profile(frame, event, arg):
  if event != "call":
    return
  m = module(frame.f_code)
  if m is None:
    return
  c = caller(frame)
  if c is not None and c != m:
    entries[m] += 1
    edges[(c, m)] += 1

sys.setprofile(profile)
try:
  launch.train_runs([RunSpec(config, "hopper-random", os.path.join(out, "run"))],
                    launch.LaunchOptions())
finally:
  sys.setprofile(None)
print("WALK " + json.dumps(dict(entries=dict(entries),
                                edges=[[a, b, n] for (a, b), n in edges.items()])))
"""

# The package's layers, lowest first (.importlinter): a call into a higher one is a climb.
LAYERS = ("errors", "signals", "core|storage", "data", "settings", "env", "collection",
          "records", "dynamics", "run", "report", "analysis")


def layer(module: str) -> int:
  top = module.split(".")[0]
  for i, names in enumerate(LAYERS):
    if top in names.split("|"):
      return i
  return -1


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--out", required=True)
  p.add_argument("--code", default=".", help="the checkout whose package walks")
  args = p.parse_args()
  out = os.path.abspath(args.out)
  os.makedirs(out, exist_ok=True)
  env = dict(os.environ, PYTHONPATH=os.path.abspath(args.code),
             MINARI_DATASETS_PATH=os.path.join(out, "minari"))
  done = subprocess.run([sys.executable, "-c", _WALK, out], env=env, check=True,
                        capture_output=True, text=True, cwd=os.path.abspath(args.code))
  walk = json.loads(next(line for line in done.stdout.splitlines()
                         if line.startswith("WALK "))[5:])
  entries = collections.Counter(walk["entries"])
  climbs = sum(n for a, b, n in walk["edges"] if layer(b) > layer(a))
  rev = subprocess.run(["git", "-C", args.code, "log", "-1", "--format=%h %s"],
                       capture_output=True, text=True).stdout.strip()
  print(f"checkout: {rev}")
  print(f"modules entered: {len(entries)}; entries: {sum(entries.values())}; climbs (into a "
        f"higher layer): {climbs}")
  for m in ("dynamics.dynamics_store", "dynamics.reuse", "records.workdir"):
    print(f"  entries of {m}: {entries.get(m, 0)}")
  print("climbs: " + ", ".join(f"{a} -> {b} x{n}" for a, b, n in sorted(walk["edges"])
                               if layer(b) > layer(a)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
