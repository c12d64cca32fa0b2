"""One training epoch (a rollout + a span of gradient steps) of this tree against another tree's,
side by side in ONE process, with a bit-identity check, plus achieved GFLOP/s per algorithm.

  python3 -m benchmarks.bench_epoch_phases --old_tree=/path/to/older/checkout \
      [--algos=mopo,mombo,mobile] [--seeds=1,4] [--steps=1000] [--rounds=3]
  python3 -m benchmarks.bench_epoch_phases --algos=mopo --steps=200        # this tree only

The work (issue #29's): num_critics 10, actor and critics 3x256, batch 256, rollouts of
50,000 x 5 every span retained 5 epochs, real ratio 0.05, a random 7-member 4x200 dynamics
ensemble, synthetic hopper-shaped data (obs 11, action 3; 200,000 rows), float32. Each setting is
cells_program.make_cells_chunk with one epoch per call, compiled before timing; the two trees' calls
alternate round by round (the order flipping each round), so both see the same load on a shared
machine. Per call: wall seconds and the process's CPU seconds. After every call the two trees'
metrics are compared bit for bit, and the states at the end (parameters, optimiser states, ring
buffer): `identical` says whether they agree exactly.

--old_tree: a checkout whose mombo_jax is copied into a temporary directory as package
`mombo_old` (its imports renamed), so both trees live in this process. GFLOP/s: FLOPs of one call
counted on its jaxpr (benchmarks/common.jaxpr_flops: scan bodies times their lengths) over the
median wall time, against this CPU's float32 matmul rate (a 2048^3 product, best of --peak_s).
"""
import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common

OBS, ACT = 11, 3


def copy_tree(tree: str) -> str:
  """tree/mombo_jax copied to a temporary dir as package mombo_old; returns the dir (on
  sys.path)."""
  tmp = tempfile.mkdtemp(prefix="bench_epoch_phases_")
  dst = os.path.join(tmp, "mombo_old")
  shutil.copytree(os.path.join(tree, "mombo_jax"), dst,
                  ignore=shutil.ignore_patterns("__pycache__"))
  for root, _, files in os.walk(dst):
    for name in files:
      if name.endswith(".py"):
        path = os.path.join(root, name)
        with open(path) as f:
          text = f.read()
        with open(path, "w") as f:
          f.write(text.replace("mombo_jax", "mombo_old"))
  sys.path.insert(0, tmp)
  return tmp


def _module(pkg: str, path: str):
  """pkg's module at its layered path (e.g. "core.train"), or at the flat one of older trees."""
  try:
    return importlib.import_module(f"{pkg}.{path}")
  except ModuleNotFoundError:
    return importlib.import_module(f"{pkg}.{path.rpartition('.')[2]}")


def build(pkg: str, algo: str, seeds: int, args) -> dict:
  """The compiled one-epoch chunk of package `pkg` and its arguments."""
  cfg = _module(pkg, "settings.config")
  buffer = _module(pkg, "core.buffer")
  dynamics = _module(pkg, "core.dynamics")
  train = _module(pkg, "core.train")
  try:                                       # the cells' program's own module since the split
    cells_program = _module(pkg, "core.cells_program")
  except ModuleNotFoundError:
    cells_program = train                    # older trees: it was in train.py
  config = cfg.make_config("hopper-random", algo, num_critics=args.critics,
                           critic_hidden=(256,) * 3, actor_hidden=(256,) * 3, batch_size=256,
                           rollout_batch_size=args.rollout, rollout_length=5,
                           buffer_retain_epochs=5, real_ratio=0.05,
                           steps_per_epoch=args.steps, num_seeds=seeds)
  rng = np.random.default_rng(0)
  n = args.real
  f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
  obs, nxt, rew = f(n, OBS) * 0.3, f(n, OBS) * 0.3, f(n)
  z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
  real = buffer.Batch(obs=obs, action=np.tanh(f(n, ACT)), reward=rew, next_obs=nxt, done=z(n),
                      obs_var=z(n, OBS), next_obs_mean=nxt, next_obs_var=z(n, OBS),
                      reward_mean=rew, reward_var=z(n))
  real = jax.tree.map(jnp.asarray, real)
  keys = jax.random.split(jax.random.PRNGKey(0), seeds)
  dyn = jax.vmap(lambda k: dynamics.init_state(k, OBS, ACT, config))(keys)
  stacked, cells = train.single_dataset(real, config, seeds)
  fn = cells_program.make_cells_chunk(config, seeds, 1)
  state = train.init_cells(keys, config, real, dyn)
  flops = common.jaxpr_flops(fn, state, stacked, keys, cells, 0, 1)
  b = dict(fn=fn, state=state, real=stacked, keys=keys, cells=cells, epoch=0, flops=flops,
           wall=[], cpu=[])
  t = time.perf_counter()
  b["metrics"] = call(b, record=False)
  b["first_s"] = time.perf_counter() - t
  return b


def call(b: dict, record: bool = True) -> dict:
  t, c = time.perf_counter(), time.process_time()
  b["state"], metrics = b["fn"](b["state"], b["real"], b["keys"], b["cells"], b["epoch"], 1)
  jax.block_until_ready((b["state"], metrics))
  if record:
    b["wall"].append(time.perf_counter() - t)
    b["cpu"].append(time.process_time() - c)
  b["epoch"] += 1
  return metrics


def same(a, b) -> bool:
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(la) == len(lb) and all(
      np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True) for x, y in zip(la, lb))


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--old_tree", default=None, help="checkout to compare with (its mombo_jax)")
  p.add_argument("--algos", default="mopo", help="comma-separated: mopo,mombo,mobile")
  p.add_argument("--seeds", default="1", help="comma-separated seed counts, e.g. 1,4")
  p.add_argument("--steps", type=int, default=1000, help="gradient steps per epoch (the span)")
  p.add_argument("--rollout", type=int, default=50_000, help="rollout start states")
  p.add_argument("--critics", type=int, default=10)
  p.add_argument("--real", type=int, default=200_000, help="rows of the synthetic dataset")
  p.add_argument("--rounds", type=int, default=3, help="timed calls per tree and setting")
  p.add_argument("--peak_s", type=float, default=5.0, help="seconds spent timing the matmul")
  args = p.parse_args()
  common.print_header("bench_epoch_phases")
  pkgs = ["mombo_jax"]
  if args.old_tree:
    copy_tree(args.old_tree)
    pkgs = ["mombo_old", "mombo_jax"]
    print(f"old tree: {os.path.abspath(args.old_tree)} (as mombo_old); new: "
          f"{os.path.dirname(os.path.dirname(os.path.abspath(importlib.import_module('mombo_jax').__file__)))}")
  peak = common.matmul_gflops(2048, 2048, seconds=args.peak_s, chain=4)
  print(f"float32 matmul rate (2048^3 products): {peak:.0f} GFLOP/s")
  print(f"work: critics {args.critics} x 3x256, actor 3x256, batch 256, rollout {args.rollout} x 5 "
        f"per epoch, retained 5, real ratio 0.05, dynamics 7 x 4x200, hopper dims; one epoch = "
        f"rollout + {args.steps} steps")
  print("\n| algo | seeds | tree | s / epoch (median wall) | CPU s | x old (wall) | x old (CPU) "
        "| GFLOP / epoch | GFLOP/s | % of matmul rate | identical |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for algo in args.algos.split(","):
    for seeds in map(int, args.seeds.split(",")):
      bs = {pkg: build(pkg, algo, seeds, args) for pkg in pkgs}
      identical = len(pkgs) == 1 or same(*(b["metrics"] for b in bs.values()))
      for r in range(args.rounds):
        ms = [call(bs[pkg]) for pkg in (pkgs if r % 2 == 0 else pkgs[::-1])]
        identical = identical and (len(ms) == 1 or same(*ms))
      if len(pkgs) == 2:
        identical = identical and same(*(b["state"] for b in bs.values()))
      base = bs[pkgs[0]]
      for pkg in pkgs:
        b = bs[pkg]
        wall, cpu = float(np.median(b["wall"])), float(np.median(b["cpu"]))
        rate = b["flops"] / wall / 1e9
        ratio = (f"{wall / np.median(base['wall']):.3f} | {cpu / np.median(base['cpu']):.3f}"
                 if len(pkgs) == 2 else "- | -")
        print(f"| {algo} | {seeds} | {pkg} | {wall:.2f} | {cpu:.2f} | {ratio} | "
              f"{b['flops'] / 1e9:.0f} | {rate:.1f} | {100 * rate / peak:.0f}% | "
              f"{'yes' if identical else 'NO'} |", flush=True)
      del bs
  print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
  main()
