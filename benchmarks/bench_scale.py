"""Scale: whole epochs for 1..N cells in one compiled program, and how close each train step comes
to this machine's matmul throughput (FLOPs from XLA's cost analysis).

  python3 -m benchmarks.bench_scale > benchmarks/bench_scale.txt          # CPU, 1..8 cells, ~20 min
  python3 -m benchmarks.bench_scale --cells=1,2,4,8,16,32,64              # a GPU

Memory grows ~0.95 GiB per cell (the synthetic ring buffer: 5 epochs x 50,000 x 5 rows): 16 cells
need ~15 GiB.

A cell is one (dataset, beta, seed) run; the cells of one launch are the vmapped (and, over
several devices, sharded) leading axis of the train state, as experiments.run trains its seeds.
Paper-size networks (actor and critics [256, 256], dynamics 7 x 4x200), walker2d dimensions,
batch 256, real ratio 0.05; an epoch is one 50,000 x k=5 model rollout plus 1000 gradient steps.
Data are random arrays: speed does not depend on their values.

Reported:
- per step type (SAC, MOMBO lcb / elite_spread, MOBILE): seconds per gradient step, FLOPs per step
  (XLA cost analysis of one step), achieved GFLOP/s, and the fraction of plain SAC's achieved
  GFLOP/s (the issue's target: >= 70% for MOMBO lcb and elite_spread on CPU) and of the machine's
  matmul throughput at these shapes (benchmarks.common.matmul_gflops);
- per cell count: compile time, seconds per epoch (best of --repeats after the compiling call),
  seconds per epoch per cell, the ratio to one cell, and XLA's memory analysis of the compiled
  epoch (arguments + temporaries);
- a projection of the paper's D4RL table (12 tasks x 4 seeds x 3000 epochs) from the measured
  per-epoch time of the largest cell count.
"""
import argparse
import os
import time

import jax
import numpy as np

from benchmarks import common
from benchmarks.bench_train import ACT, OBS, _filled_ring, _real
from mombo_jax import buffer, config as config_lib, dynamics, sac, targets, termination, train

STEP_TYPES = [("SAC (soft target, plain critics)", "mopo", "lcb"),
              ("MOMBO lcb", "mombo", "lcb"),
              ("MOMBO elite_spread", "mombo", "elite_spread"),
              ("MOBILE (N=10)", "mobile", "lcb")]


def bench_steps(args, rng, matmul):
  """Seconds and FLOPs per gradient step of each step type (one cell)."""
  real = _real(100_000, rng)
  rows = []
  for name, algo, target in STEP_TYPES:
    config = config_lib.make_config("walker2d-medium", algo, target=target,
                                    rollout_batch_size=10_000, rollout_length=5)
    ring = _filled_ring(config, rng, 50_000)
    agent = sac.init_agent(jax.random.PRNGKey(0), OBS, ACT, config, total_steps=10**6)
    dyn = dynamics.init_state(jax.random.PRNGKey(1), OBS, ACT, config)
    term_fn = termination.termination_fn("walker2d")

    def one(agent, ring, dyn, k, config=config):
      target_fn = targets.bind(config, dyn, term_fn)
      k1, k2 = jax.random.split(k)
      batch = buffer.sample_mixed(real, ring, k1, config.batch_size,
                                  buffer.real_rows(config.batch_size, config.real_ratio))
      return sac.update(agent, batch, k2, target_fn, config)

    def steps(agent, ring, dyn, key, one=one):
      return jax.lax.scan(lambda a, k: one(a, ring, dyn, k), agent,
                          jax.random.split(key, args.steps))

    key = jax.random.PRNGKey(2)
    flops = common.xla_flops(jax.jit(one).lower(agent, ring, dyn, key).compile())
    compiled = jax.jit(steps).lower(agent, ring, dyn, key).compile()
    jax.block_until_ready(compiled(agent, ring, dyn, key))
    best = min(_timed(lambda: jax.block_until_ready(compiled(agent, ring, dyn, key)))
               for _ in range(args.repeats))
    per_step = best / args.steps
    rows.append((name, per_step, flops, flops / per_step / 1e9))
  sac_gflops = rows[0][3]
  print(f"\n## Gradient steps (one cell, batch 256; best of {args.repeats} x {args.steps} steps)")
  print(f"machine's float32 matmul throughput at [256, 256] x [256, 256]: {matmul:.1f} GFLOP/s")
  print("| step | ms / step | MFLOP / step | GFLOP/s | x SAC's GFLOP/s | x matmul bound |")
  print("|---|---|---|---|---|---|")
  for name, per_step, flops, gflops in rows:
    print(f"| {name} | {1e3 * per_step:.2f} | {flops / 1e6:.0f} | {gflops:.1f} | "
          f"{gflops / sac_gflops:.2f} | {gflops / matmul:.2f} |")


def _timed(fn):
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def bench_cells(args, rng):
  """Whole epochs of MOMBO lcb for each cell count; returns the last (cells, s / epoch)."""
  real = _real(200_000, rng)
  print(f"\n## Whole epochs, MOMBO lcb: {args.rollout} x 5 rollout + {args.steps} gradient steps "
        f"per cell; {jax.local_device_count()} device(s)")
  print("| cells | compile s | s / epoch | s / epoch / cell | x 1 cell | memory (args + temp) |")
  print("|---|---|---|---|---|---|")
  one, last, times = None, None, {}
  for cells in args.cells:
    try:
      compile_s, t, mem_gb = _epoch_timing(args, real, cells)
    except Exception as e:  # a cell count past the device's memory ends the table, not the record
      if "RESOURCE_EXHAUSTED" not in str(e) and "out of memory" not in str(e).lower():
        raise
      print(f"| {cells} | out of device memory: {str(e).splitlines()[0][:120]} |||||", flush=True)
      break
    one = one or t
    last = (cells, t)
    times[cells] = t
    print(f"| {cells} | {compile_s:.1f} | {t:.2f} | {t / cells:.3f} | {t / one:.2f} | "
          f"{mem_gb:.2f} GiB |", flush=True)
  if 16 in times and 1 in times:
    print(f"\n16 cells: {times[16]:.2f} s per epoch = {times[16] / times[1]:.2f} x one cell "
          "(issue #10's GPU targets: <= 1.5 x one cell, <= 2.5 s on an H100-class GPU)")
  return last


def _epoch_timing(args, real, cells):
  """(compile seconds, best seconds per epoch, GiB of arguments + temporaries) for `cells` cells;
  a function of its own so that one cell count's state is freed before the next is built."""
  config = config_lib.make_config("walker2d-medium", "mombo", rollout_batch_size=args.rollout,
                                  steps_per_epoch=args.steps, rollout_length=5, num_seeds=cells)
  keys = jax.random.split(jax.random.PRNGKey(0), cells)
  dyn = jax.vmap(lambda k: dynamics.init_state(k, OBS, ACT, config))(keys)
  state = train.init_cells(keys, config, real, dyn)
  stacked, cell_args = train.single_dataset(real, config)
  t0 = time.perf_counter()
  compiled = train.make_cells_epoch(config, cells).lower(state, stacked, keys, cell_args).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  mem_gb = ((mem.argument_size_in_bytes + mem.temp_size_in_bytes) / 2**30
            if mem is not None else float("nan"))
  holder = {"state": state}
  del state

  def run():
    holder["state"], _ = compiled(holder["state"], stacked, keys, cell_args)
    jax.block_until_ready(holder["state"])

  run()   # first call: buffers allocated, caches warm
  return compile_s, min(_timed(run) for _ in range(args.epoch_repeats)), mem_gb


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cells", type=lambda s: [int(x) for x in s.split(",")],
                      default=[1, 2, 4, 8])
  parser.add_argument("--steps", type=int, default=1000, help="Gradient steps per epoch.")
  parser.add_argument("--rollout", type=int, default=50_000, help="Rollout start states.")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--epoch_repeats", type=int, default=1)
  parser.add_argument("--skip_steps", action="store_true")
  parser.add_argument("--skip_cells", action="store_true")
  args = parser.parse_args()
  common.print_header("bench_scale")
  t0 = time.time()
  rng = np.random.default_rng(0)
  if not args.skip_steps:
    bench_steps(args, rng, common.matmul_gflops(256, 256))
  if not args.skip_cells:
    cells, seconds = bench_cells(args, rng)
    epochs = 12 * 4 * 3000
    hours = epochs / cells * seconds / 3600
    print(f"\nProjection, the paper's D4RL table (12 tasks x 4 seeds x 3000 epochs = {epochs} "
          f"cell-epochs) at {seconds / cells:.2f} s per cell-epoch ({cells} cells per program): "
          f"{hours:.1f} hours on this machine ({jax.default_backend()}).")
  print(f"\nload average at end: {os.getloadavg()[0]:.1f}; benchmark wall time "
        f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
  main()
