"""What each of issue #29's CPU changes buys, alone and together, per algorithm.

Run (repo root):  python3 -m benchmarks.bench_epoch_changes [--algos=mopo,mombo,mobile]
                  [--steps=200] [--rollout_batch=10000] [--rounds=5] [--out=FILE]

One process builds one epoch program (cells_program.make_cells_chunk, 1 cell, what runs use) per
variant and calls them in alternation, round after round (the order reversed every other round),
so that load drifts fall on all variants alike; the record is each variant's median seconds and
the median of its per-round ratios to `before`. Variants (each change is a program argument,
rewrites.Rewrites and cpu_dots; the first two are chosen per backend since issue 43,
core/rewrites.py):
  before  the three changes off: the layers' gradients by JAX's own transpose rule
          (critic_matmul 'jax', MOMBO_JAX_CRITIC_MATMUL=jax), XLA's default CPU dots
          (MOMBO_JAX_CPU_DOTS=xla), the rollout's predictions and actor in one piece
          (predict_rows None, MOMBO_JAX_PREDICT_ROWS=none)
  matmul  critics.matmul's backward only (x^T g and g kernel^T, Eigen's standard dot form)
  eigen   xla_options' CPU dots only (no YNNPACK)
  pieces  the rollout in pieces of rewrites.PREDICT_ROWS (1000) rows only
  after   all three (what the package runs on CPU)
Also: how many leaves of each variant's state after one epoch differ from `before`'s (the changes
round differently), the compiled programs' transpose and YNNPACK-fusion counts, and GFLOP/s of
`after` (FLOPs from the epoch's jaxpr, benchmarks.common.jaxpr_flops) against this CPU's matmul
rate at a critic layer's shape (common.matmul_gflops). Work: 10 critics, actor and critics 3x256,
batch 256, real ratio 0.05, rollouts of --rollout_batch x 5 (retained 5 epochs), a random
7-member 4x200 ensemble, synthetic hopper-shaped data (200,000 rows), float32, one seed.
"""
import argparse
import os
import time
import types

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from mombo_jax.core import buffer, cells_program, dynamics, rewrites, train
from mombo_jax.settings import config as config_lib

OBS, ACT, ROWS = 11, 3, 200_000
VARIANTS = {  # name: (critics.matmul, eigen dots, pieces)
    "before": (False, False, False), "matmul": (True, False, False), "eigen": (False, True, False),
    "pieces": (False, False, True), "after": (True, True, True)}


def synthetic(rows):
  rng = np.random.default_rng(0)
  obs = (0.1 * rng.standard_normal((rows, OBS))).astype(np.float32)
  return types.SimpleNamespace(
      observations=obs, actions=rng.uniform(-1, 1, (rows, ACT)).astype(np.float32),
      rewards=rng.standard_normal(rows).astype(np.float32),
      next_observations=(obs + 0.01 * rng.standard_normal((rows, OBS))).astype(np.float32),
      terminals=np.zeros(rows, bool))


def build(algo, args, real, cells=1):
  """(config, state [cells] on the host, stacked datasets, Cell [cells], run keys [cells]) of the
  benchmarks' work at `cells` seeds."""
  hidden = (256,) * 3
  config = config_lib.make_config(
      "hopper-medium", algo, num_critics=10, actor_hidden=hidden, critic_hidden=hidden,
      batch_size=256, steps_per_epoch=args.steps, rollout_batch_size=args.rollout_batch,
      rollout_length=5, buffer_retain_epochs=5, real_ratio=0.05, dyn_members=7, dyn_elites=5,
      dyn_hidden=(200,) * 4, num_seeds=cells, seed=0)
  keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(cells))
  init_keys, run_keys = (jax.vmap(jax.random.fold_in, (0, None))(keys, i) for i in (1, 2))
  dyn = jax.jit(jax.vmap(lambda k: dynamics.init_state(k, OBS, ACT, config)))(init_keys)
  state = jax.device_get(jax.jit(train.init_cells, static_argnums=1)(init_keys, config, real,
                                                                     dyn))
  stacked, cell = train.single_dataset(real, config, cells)
  return config, state, stacked, cell, run_keys


def compile_variant(name, config, state, stacked, cells, keys):
  new_dw, eigen, pieces = VARIANTS[name]
  choices = rewrites.Rewrites(predict_rows=rewrites.PREDICT_ROWS if pieces else None,
                              critic_matmul="rewrite" if new_dw else "jax")
  chunk = cells_program.make_cells_chunk(config, 1, 1, cpu_dots="eigen" if eigen else "xla",
                                         choices=choices)
  args = (jax.tree.map(jnp.asarray, state), stacked, keys, cells, 0, 1)
  compiled = chunk.lower(*args).compile()
  flops = common.jaxpr_flops(chunk.__wrapped__, *args) if name == "after" else None
  text = compiled.as_text()
  counts = dict(transposes=sum(" transpose(" in line for line in text.splitlines()),
                ynn=text.count("__ynn_fusion"))
  return compiled, counts, flops


def run_algo(algo, args, real, out):
  config, state, stacked, cells, keys = build(algo, args, real)
  v = {}
  for name in VARIANTS:
    compiled, counts, flops = compile_variant(name, config, state, stacked, cells, keys)
    first, _ = jax.block_until_ready(compiled(jax.tree.map(jnp.asarray, state), stacked, keys,
                                              cells, 0, 1))
    v[name] = dict(fn=compiled, state=first, first=jax.device_get(first), times=[], epoch=1,
                   flops=flops, **counts)
  ref = v["before"]["first"]
  for x in v.values():
    x["leaves"] = len(jax.tree.leaves(ref))
    x["differ"] = x["leaves"] - common.equal_leaves(x.pop("first"), ref)

  def one_epoch(name, x):
    x["state"], _ = jax.block_until_ready(x["fn"](x["state"], stacked, keys, cells, x["epoch"], 1))

  common.alternate(v, args.rounds, one_epoch, algo, out)
  rows = []
  for name, x in v.items():
    ratio = common.median_ratio(x["times"], v["before"]["times"])
    rows.append(f"| {algo} | {name} | {np.median(x['times']):.2f} | **{ratio:.3f}** | "
                f"{x['transposes']} | {x['ynn']} | {x['differ']} of {x['leaves']} |")
  after = v["after"]
  gflops = after["flops"] / np.median(after["times"]) / 1e9
  return rows, gflops, after["flops"]


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--algos", default="mopo,mombo,mobile")
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--rollout_batch", type=int, default=10_000)
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--out", default=None)
  args = p.parse_args()
  lines = []

  def out(line):
    print(line, flush=True)
    lines.append(line)

  out("# benchmarks/bench_epoch_changes.py: issue #29's CPU changes, alone and together")
  out(f"command: python3 -m benchmarks.bench_epoch_changes --algos={args.algos} "
      f"--steps={args.steps} --rollout_batch={args.rollout_batch} --rounds={args.rounds}")
  out(f"machine: {common.cpu_name()}; jax {jax.__version__}; load at "
      f"start {os.getloadavg()[0]:.1f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
  out(f"work per epoch: {args.steps} gradient steps + a {args.rollout_batch} x 5 rollout, "
      "10 critics, 3x256, batch 256, 7-member 4x200 random ensemble, 1 seed")
  peak = common.matmul_gflops(256, 256)
  real = buffer.from_transitions(synthetic(ROWS))
  table, rates = [], []
  for algo in args.algos.split(","):
    rows, gflops, flops = run_algo(algo, args, real, out)
    table += rows
    rates.append(f"| {algo} | {flops / 1e9:.0f} | {gflops:.0f} | {100 * gflops / peak:.0f}% |")
  out("")
  out("| algorithm | variant | median s per epoch | ratio to before (median of rounds) | "
      "transposes in the program | YNNPACK fusions | state leaves differing from before |")
  out("|---|---|---|---|---|---|---|")
  for row in table:
    out(row)
  out("")
  out(f"matmul rate of this CPU at a critic layer's shape ([256, 256] x [256, 256] chains, "
      f"plain jax.jit, XLA's default dots): {peak:.0f} GFLOP/s")
  out("| algorithm | GFLOP per epoch (jaxpr) | GFLOP/s of `after` | of the matmul rate |")
  out("|---|---|---|---|")
  for row in rates:
    out(row)
  out(f"load at end {os.getloadavg()[0]:.1f}")
  if args.out:
    with open(args.out, "w") as fh:
      fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
  main()
