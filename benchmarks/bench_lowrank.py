"""The low-rank moment mode (issue #49 item 1) against MOMBO's diagonal: an epoch's FLOPs and CPU
time at the paper's sizes, and accuracy against Monte Carlo on a trained critic, per rank.

  python3 -m benchmarks.bench_lowrank [--parts=flops,time,accuracy] [--ranks=1,2,...]
      [--run=runs/hopper-random/mombo-elite_spread/s0x2] [--out=benchmarks/bench_lowrank.txt]

Part 1, FLOPs (counted on the jaxpr, benchmarks/common.jaxpr_flops' rules; tracing only): one
cell's epoch = one rollout + 1000 gradient steps, as benchmarks/bench_phase_counts.py counts it
(its `pieces`: random networks at make_config's paper settings for hopper-medium-replay (S=11,
A=3) and walker2d-medium-replay (S=17, A=6): critics 2 x [256, 256], batch 256, 5 elites, rollout
50,000 x 5), MOMBO elite_spread and lcb, per --moments mode; x diag = the epoch's FLOPs over the
diagonal mode's (the budget: <= 2x on hopper, <= 3x on walker2d).
Part 2, CPU time: the same pieces, jitted as the package compiles them; per mode one gradient step
(buffer.sample_mixed + sac.update: the moment-matched target is in it) timed --rounds times,
the modes alternating (common.alternate), and the rollout (the same for every mode) once; an
epoch = rollout + 1000 x the step's median, in process CPU seconds (both cores; steadier than wall
time on this shared machine) and wall seconds.
Part 3, accuracy (analysis/critic_moments.py): bench_trained_critic's protocol and states (seed 0
of --run, --num_states dataset states drawn with seed 0, the best elite's next-state Gaussian at
a ~ pi(s), a' = pi(mean)), per target critic: the mean error |mean - MC mean| / MC std and std / MC
std of the diagonal, each low-rank rank, and the full mode, against --samples Monte Carlo draws;
the target: std within 0.8-1.25x, mean error <= 0.05.
"""
import argparse
import functools
import os
import time

import jax
import numpy as np

from benchmarks import bench_phase_counts, common
from benchmarks.common import Record, record_start
from mombo_jax.settings import config as config_lib

ENVS = {"hopper": ("hopper-medium-replay", 11, 3), "walker2d": ("walker2d-medium-replay", 17, 6)}
BUDGET = {"hopper": 2.0, "walker2d": 3.0}


@functools.lru_cache(maxsize=None)
def _pieces(env, target, moments):
  dataset, obs, act = ENVS[env]
  bench_phase_counts.OBS, bench_phase_counts.ACT = obs, act       # pieces' state / action dims
  config = config_lib.make_config(dataset, "mombo", target=target, moments=moments)
  return config, bench_phase_counts.pieces(config)


def epoch_flops(env, target, moments):
  """(rollout, one step, epoch) jaxpr FLOPs of one cell's epoch."""
  config, ((roll, roll_args), (step, step_args)) = _pieces(env, target, moments)
  rollout = _rollout_flops(env, target)
  one = common.jaxpr_flops(step, *step_args)
  return rollout, one, rollout + config.steps_per_epoch * one


@functools.lru_cache(maxsize=None)
def _rollout_flops(env, target):
  """The rollout's FLOPs (the moment mode is not in it: the same for every mode)."""
  _, ((roll, roll_args), _) = _pieces(env, target, "diagonal")
  with bench_phase_counts.one_piece():
    return common.jaxpr_flops(roll, *roll_args)


def part_flops(out, modes, targets, envs):
  out("")
  out("## Part 1: jaxpr FLOPs of one epoch (rollout + 1000 steps), paper sizes")
  out("| env | target | moments | step GFLOP | epoch GFLOP | x diag | budget |")
  out("|---|---|---|---|---|---|---|")
  for env in envs:
    for target in targets:
      base = None
      for mode in modes:
        _, one, epoch = epoch_flops(env, target, mode)
        base = base or epoch
        ratio = epoch / base
        out(f"| {env} | {target} | {mode} | {one / 1e9:.3f} | {epoch / 1e9:.1f} | {ratio:.2f} | "
            f"{'ok' if ratio <= BUDGET[env] else 'over'} (<= {BUDGET[env]:g}x) |")


def part_time(out, modes, target, envs, rounds):
  out("")
  out(f"## Part 2: CPU time of one epoch ({target}; rollout once + 1000 x the step's median over "
      f"{rounds} alternating rounds), paper sizes")
  out("| env | moments | step ms (CPU) | step ms (wall) | epoch CPU s | epoch wall s | "
      "x diag (CPU) "
      "| x diag (wall) | budget |")
  out("|---|---|---|---|---|---|---|---|---|")
  for env in envs:
    config, ((roll, roll_args), _) = _pieces(env, target, "diagonal")
    roll_j = jax.jit(roll)
    jax.block_until_ready(roll_j(*roll_args))
    t, c = time.perf_counter(), time.process_time()
    jax.block_until_ready(roll_j(*roll_args))
    roll_wall, roll_cpu = time.perf_counter() - t, time.process_time() - c
    variants = {}
    for mode in modes:
      _, (_, (step, step_args)) = _pieces(env, target, mode)
      fn = jax.jit(step)
      jax.block_until_ready(fn(*step_args))                        # compiled before timing
      variants[mode] = dict(fn=fn, args=step_args, times=[], cpu=[], epoch=0)

    def run(name, x, reps=5):
      c = time.process_time()
      for _ in range(reps):
        jax.block_until_ready(x["fn"](*x["args"]))
      x["cpu"].append((time.process_time() - c) / reps)

    common.alternate(variants, rounds, run, env, lambda line: None)
    base = None
    for mode, x in variants.items():
      wall = np.median(x["times"]) / 5
      cpu = np.median(x["cpu"])
      epoch_cpu = roll_cpu + config.steps_per_epoch * cpu
      epoch_wall = roll_wall + config.steps_per_epoch * wall
      base = base or (epoch_cpu, epoch_wall)
      ok = epoch_cpu / base[0] <= BUDGET[env]
      out(f"| {env} | {mode} | {1e3 * cpu:.1f} | {1e3 * wall:.1f} | {epoch_cpu:.1f} | "
          f"{epoch_wall:.1f} | {epoch_cpu / base[0]:.2f} | {epoch_wall / base[1]:.2f} | "
          f"{'ok' if ok else 'over'} (<= {BUDGET[env]:g}x) |")
    out(f"{env}: rollout {roll_cpu:.1f} CPU s, {roll_wall:.1f} wall s (every mode's); load "
        f"{os.getloadavg()[0]:.1f}")


def part_accuracy(out, run_dir, num_states, samples, ranks):
  from mombo_jax.analysis import critic_moments, mm_vs_mc
  trained, transitions = mm_vs_mc.load_seed(run_dir, log=out)
  rng = np.random.default_rng(0)
  idx = rng.choice(len(transitions.observations), num_states, replace=False)
  obs = np.asarray(transitions.observations[idx], np.float32)
  modes = (["diagonal"] + [f"lowrank{k}" for k in ranks] + [f"lowrank{k}pca" for k in ranks]
           + ["lowrank", "full"])
  r = critic_moments.moments_vs_mc(trained.nets[0], obs, jax.random.PRNGKey(0), samples,
                                   modes=modes)
  out("")
  out(f"## Part 3: accuracy on {run_dir} (seed 0), {num_states} states x "
      f"{r['mc_mean'].shape[0]} target critics, {samples} Monte Carlo samples each")
  out("| moments | mean err / MC std: median | max | std / MC std: median | min | max | target |")
  out("|---|---|---|---|---|---|---|")
  for mode in modes:
    err = np.abs(r[f"{mode}_mean"] - r["mc_mean"]) / r["mc_std"]
    ratio = r[f"{mode}_std"] / r["mc_std"]
    ok = err.max() <= 0.05 and 0.8 <= ratio.min() and ratio.max() <= 1.25
    out(f"| {mode} | {np.median(err):.3g} | {err.max():.3g} | {np.median(ratio):.3g} | "
        f"{ratio.min():.3g} | {ratio.max():.3g} | {'met' if ok else 'not met'} |")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--parts", default="flops,time,accuracy")
  p.add_argument("--envs", default="hopper,walker2d")
  p.add_argument("--targets", default="elite_spread,lcb")
  p.add_argument("--flops_modes", default="diagonal,lowrank1,lowrank2,lowrank4,lowrank6,lowrank8,"
                 "lowrank11,lowrank")
  p.add_argument("--time_modes", default="diagonal,lowrank4,lowrank")
  p.add_argument("--rounds", type=int, default=6)
  p.add_argument("--run", default="runs/hopper-random/mombo-elite_spread/s0x2")
  p.add_argument("--num_states", type=int, default=4)
  p.add_argument("--samples", type=int, default=100_000)
  p.add_argument("--ranks", default="1,2,3,4,6,8")
  p.add_argument("--out", default=None)
  args = p.parse_args()
  out = Record(args.out)
  record_start(out, "bench_lowrank", "the low-rank moment mode against the diagonal", args)
  parts, envs = args.parts.split(","), args.envs.split(",")
  if "flops" in parts:
    part_flops(out, args.flops_modes.split(","), args.targets.split(","), envs)
  if "time" in parts:
    part_time(out, args.time_modes.split(","), args.targets.split(",")[0], envs, args.rounds)
  if "accuracy" in parts:
    part_accuracy(out, args.run, args.num_states, args.samples,
                  [int(k) for k in args.ranks.split(",")])
  out(f"load at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
  main()
