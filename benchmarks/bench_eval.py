"""Evaluation against training: the time of one evaluation (every cell's 10 episodes of 1000 steps,
evaluate.Evaluator over env_pool's worker processes) at 1, 16 and 48 cells, next to the training
time of the eval_every epochs between two evaluations, and the fraction of a paper-setting run's
wall time it takes.

  python3 -m benchmarks.bench_eval > benchmarks/bench_eval.txt          # any host (~3 min here)
  python3 -m benchmarks.bench_eval --workers=1,4,8,16 --steps=100       # the 16-core GPU host

Measured, on this host:
1. one env step (gymnasium v5, one core, in-process; resets not timed; best of `--repeats`) per
   env, with random actions (bench_scale's measure) and with zero actions (section 3's policy):
   the floor of an evaluation's cost, envs x steps x this / cores;
2. the pool's per-step round trip to W workers with no env stepped: `ping` (a byte each way: the
   transport's floor) and `step` (the same plus the parent's writes and copies of the shared
   arrays), wall and the parent's cpu time;
3. one evaluation per env (`--envs`), cell count (`--cells`) and worker count (`--workers`, default
   1 .. this host's cores): Evaluator.run with the paper's actor ([256, 256]) whose mean head is
   zero (action 0: the hopper stands and halfcheetah never terminates, so every env is stepped
   at every step, as in an evaluation of policies that last the whole episode; the network's
   cost is the real one), for `--steps` time steps, scaled to the episodes' 1000 (an env's step
   costs about the same all episode); the reset of all envs (once per evaluation) is timed apart
   and added once. The jitted policy call alone is timed beside it.

Quoted, not measured: training time per epoch on an H100 (benchmarks/bench_scale_gpu.txt, MOMBO
lcb, the paper's epoch: 50000 x 5 rollout + 1000 gradient steps per cell), 48 cells interpolated
linearly between its 32 and 64 cells. Projected, not measured: the evaluation on the GPU host's 16
cores, from (1), (2) and (3)'s policy time (the model is printed with the numbers).
"""
import argparse
import math
import os
import time

import jax
import numpy as np

from benchmarks import common
from mombo_jax.core import actor_policy
from mombo_jax.env import env_pool, envs, evaluate
from mombo_jax.settings import config as config_lib

EPISODES, HORIZON = config_lib.Config().evaluation.eval_episodes, 1000
EVAL_EVERY = config_lib.Config().evaluation.eval_every
# benchmarks/bench_scale_gpu.txt: s / epoch of MOMBO lcb on one H100 by cell count.
H100_S_PER_EPOCH = {1: 0.17, 2: 0.19, 4: 0.26, 8: 0.37, 16: 0.54, 32: 0.94, 64: 1.86}
GPU_HOST_CORES = 16
OBS_DIMS = dict(envs.OBS_DIM)
ACT_DIMS = dict(envs.ACTION_DIM)


def h100_epoch_s(cells: int):
  """(s / epoch, how it was had): recorded, or interpolated linearly between recorded counts."""
  if cells in H100_S_PER_EPOCH:
    return H100_S_PER_EPOCH[cells], "recorded"
  lo = max(c for c in H100_S_PER_EPOCH if c < cells)
  hi = min(c for c in H100_S_PER_EPOCH if c > cells)
  t_lo, t_hi = H100_S_PER_EPOCH[lo], H100_S_PER_EPOCH[hi]
  return t_lo + (t_hi - t_lo) * (cells - lo) / (hi - lo), f"interpolated {lo}..{hi}"


def standing_actor(config, num_cells, env, seed=0):
  """Actor variables [C, ...]: random hidden layers of the config's sizes (numpy), mean head zero
  (so tanh(mean) = 0), log-std head random."""
  rng = np.random.default_rng(seed)
  hidden = tuple(config.agent.actor_hidden)
  ins = [OBS_DIMS[env], *hidden, hidden[-1]]
  outs = [*hidden, ACT_DIMS[env], ACT_DIMS[env]]
  params = {}
  for i, (n_in, n_out) in enumerate(zip(ins, outs)):
    scale = 0.0 if i == len(hidden) else n_in ** -0.5
    params[f"Dense_{i}"] = dict(
        kernel=(scale * rng.normal(size=(num_cells, n_in, n_out))).astype(np.float32),
        bias=np.zeros((num_cells, n_out), np.float32))
  return {"params": params}


# --- 1. one env step ------------------------------------------------------------------------------

def env_step_us(env_name, steps, repeats, actions):
  """Best (wall us, cpu us) per env.step of one gymnasium v5 env in this process, `actions`
  "random" (uniform in the bounds, bench_scale's; the env falls and is reset, resets not timed)
  or "zero" (the hopper stands); best of `repeats` x `steps` steps."""
  env = envs.make_env(env_name)
  env.action_space.seed(0)
  zero = np.zeros(env.action_space.shape, env.action_space.dtype)
  best = (math.inf, math.inf)
  try:
    for r in range(repeats):
      env.reset(seed=r)
      wall = cpu = 0.0
      for _ in range(steps):
        action = env.action_space.sample() if actions == "random" else zero
        t, c = time.perf_counter(), time.process_time()
        _, _, terminated, truncated, _ = env.step(action)
        wall, cpu = wall + time.perf_counter() - t, cpu + time.process_time() - c
        if terminated or truncated:
          env.reset()
      best = (min(best[0], wall / steps * 1e6), min(best[1], cpu / steps * 1e6))
  finally:
    env.close()
  return best


# --- 2. the transport -----------------------------------------------------------------------------

def round_trip_us(workers, num_envs, act_dim, steps):
  """(start s, ping (wall us, parent cpu us), empty step (wall us, parent cpu us)): the pool's
  start and its best per-step round trips."""
  t = time.perf_counter()
  pool = env_pool.EnvPool(envs.make_env("hopper"), num_envs, workers=workers)
  start = time.perf_counter() - t
  try:
    pool.reset(np.arange(num_envs))
    actions, idle = np.zeros((num_envs, act_dim), np.float32), np.zeros(num_envs, bool)
    ping = step = (math.inf, math.inf)
    for _ in range(3):
      for name, fn in (("ping", pool.ping), ("step", lambda: pool.step(actions, idle))):
        t, c = time.perf_counter(), time.process_time()
        for _ in range(steps):
          fn()
        got = ((time.perf_counter() - t) / steps * 1e6, (time.process_time() - c) / steps * 1e6)
        if name == "ping":
          ping = tuple(map(min, ping, got))
        else:
          step = tuple(map(min, step, got))
  finally:
    pool.close()
  return start, ping, step


# --- 3. one evaluation ----------------------------------------------------------------------------

def policy_ms(config, cells, env, repeats=20):
  """Best ms of the evaluation's jitted policy call on obs [C, episodes, obs_dim]."""
  params = standing_actor(config, cells, env)
  agent = config.agent
  fn = actor_policy.actor_functions(actor_policy.ActorShape.of(
      agent.actor_hidden, ACT_DIMS[env], agent.log_std_min, agent.log_std_max)).mode_per_seed
  obs = np.zeros((cells, EPISODES, OBS_DIMS[env]), np.float32)
  np.asarray(fn(params, obs))
  best = math.inf
  for _ in range(repeats):
    t = time.perf_counter()
    np.asarray(fn(params, obs))
    best = min(best, time.perf_counter() - t)
  return best * 1e3


def evaluation_s(config, cells, env, workers, steps, repeats):
  """(pool start s, reset s, s per time step): `steps`-step evaluations (Evaluator.run) of `cells`
  x EPISODES envs over `workers` processes, each after a reset of all envs timed alone; per time
  step: (run - that reset) / steps. Best of `repeats` each."""
  params = standing_actor(config, cells, env)
  t = time.perf_counter()
  evaluator = evaluate.Evaluator(config, env, cells, EPISODES, max_episode_steps=steps,
                                 workers=workers)
  start = time.perf_counter() - t
  per_step = reset = math.inf
  seeds = np.arange(cells * EPISODES)
  try:
    # The policy is compiled for this shape already (policy_ms).
    for r in range(repeats):
      t = time.perf_counter()
      evaluator.pool.reset(seeds + r)
      t_reset = time.perf_counter() - t
      t = time.perf_counter()
      evaluator.run(params, r + 1)
      reset = min(reset, t_reset)
      per_step = min(per_step, max(time.perf_counter() - t - t_reset, 0.0) / steps)
  finally:
    evaluator.close()
  return start, reset, per_step


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--cells", default="1,16,48")
  parser.add_argument("--workers", default=None, help="default: 1 .. this host's cores (powers "
                      "of 2 and the core count)")
  parser.add_argument("--envs", default="hopper,halfcheetah")
  parser.add_argument("--steps", type=int, default=50, help="time steps timed per evaluation")
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args()
  t_bench = time.time()
  cells_list = [int(c) for c in args.cells.split(",")]
  cores = env_pool.host_cores()
  if args.workers:
    workers_list = [int(w) for w in args.workers.split(",")]
  else:
    workers_list = sorted({w for w in (1, 2, 4, 8, 16) if w <= cores} | {cores})
  env_names = args.envs.split(",")
  config = config_lib.make_config("hopper-random")          # the paper's actor: [256, 256]

  common.print_header("bench_eval")
  print(f"cores this process may use: {cores}; gymnasium envs v5; {EPISODES} episodes per cell "
        f"of {HORIZON} steps, every {EVAL_EVERY} epochs (config defaults); actor "
        f"{list(config.agent.actor_hidden)}")

  print("\n## 1. One env step, one core (gymnasium's env in this process; resets not timed; best "
        f"of {args.repeats} x 1000 steps): random actions (uniform in the bounds, as "
        "bench_scale's; the hopper and walker fall and are reset) and zero actions (section 3's "
        "policy: the hopper stands, its foot always in contact)")
  print("| env | random: wall us / step | random: cpu us / step | zero: wall us / step | zero: "
        "cpu us / step |")
  print("|---|---|---|---|---|")
  step_us = {}
  for env in ("hopper", "walker2d", "halfcheetah"):
    rand = env_step_us(env, 1000, args.repeats, "random")
    zero = env_step_us(env, 1000, args.repeats, "zero")
    step_us[env] = rand[1]
    print(f"| {env} | {rand[0]:.0f} | {rand[1]:.0f} | {zero[0]:.0f} | {zero[1]:.0f} |", flush=True)

  n48 = max(cells_list) * EPISODES
  print(f"\n## 2. The pool's round trip per time step, {n48} envs (no env stepped; best of 3 x "
        "100): ping (a byte each way) and step (the same, plus the parent's writes and copies of "
        "the shared arrays); wall and the parent's cpu time")
  print("| workers | pool start s | ping wall us | ping parent cpu us | step wall us | step parent "
        "cpu us |")
  print("|---|---|---|---|---|---|")
  trips = {}
  for w in [w for w in workers_list if w > 1]:
    start, ping, step = round_trip_us(w, n48, ACT_DIMS["hopper"], 100)
    trips[w] = step
    print(f"| {w} | {start:.2f} | {ping[0]:.0f} | {ping[1]:.0f} | {step[0]:.0f} | {step[1]:.0f} |",
          flush=True)

  print(f"\n## 3. One evaluation: {EPISODES} episodes per cell, the paper's actor; {args.steps} "
        f"time steps timed (best of {args.repeats}), scaled to {HORIZON}; the reset (all envs, "
        "once per evaluation) timed apart")
  print("| env | cells | envs | workers | pool start s | policy call ms | reset ms | ms / time "
        f"step | s / evaluation (reset + {HORIZON} steps) | x 1 worker |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  evals, policy = {}, {}
  for env in env_names:
    for cells in cells_list:
      policy[env, cells] = policy_ms(config, cells, env)
      for w in workers_list:
        start, reset, per_step = evaluation_s(config, cells, env, w, args.steps, args.repeats)
        evals[env, cells, w] = reset + per_step * HORIZON
        speedup = evals[env, cells, 1] / evals[env, cells, w] if (env, cells, 1) in evals else 0
        print(f"| {env} | {cells} | {cells * EPISODES} | {w} | {start:.2f} | "
              f"{policy[env, cells]:.2f} | {reset * 1e3:.1f} | {per_step * 1e3:.1f} | "
              f"{evals[env, cells, w]:.1f} | {speedup:.2f} |", flush=True)

  print(f"\n## 4. Evaluation against training ({EVAL_EVERY} epochs between evaluations)")
  print("Training: s / epoch on one H100 quoted from benchmarks/bench_scale_gpu.txt (MOMBO lcb, "
        "the paper's epoch), not measured here. 'here': this host's evaluation at its best worker "
        "count (section 3) against the H100's training.")
  print(f"Projected for the {GPU_HOST_CORES}-core GPU host (not measured), at W = "
        f"env_pool.auto_workers(envs, {GPU_HOST_CORES}) workers: per time step, ceil(envs / W) x "
        "one env step's cpu time (section 1, random actions: a worker steps its envs in turn, the "
        "W side by side on idle cores) + the round trip (W x section 2's step parent cpu per "
        "worker at the most "
        "workers measured: the parent's serial part; + one wake-up: that row's wall - its parent "
        f"cpu) + the policy call, x {HORIZON} steps. The policy call: this host's "
        f"({jax.default_backend()}, section 3), or 0.2 ms, a jitted GPU call's dispatch and two "
        "small copies (assumed, not measured).")
  print(f"| env | cells | train s / {EVAL_EVERY} epochs (H100) | eval s here (workers) | fraction "
        f"here | W | projected envs + round trips s | + policy (this host) s | fraction | + "
        "policy (0.2 ms) s | fraction |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")

  def trip_ms(w):
    if w == 1 or not trips:
      return 0.0
    wall, cpu = trips[max(trips)]
    return (w * cpu / max(trips) + max(wall - cpu, 0.0)) / 1e3

  for env in env_names:
    for cells in cells_list:
      per_epoch, how = h100_epoch_s(cells)
      train_s = per_epoch * EVAL_EVERY
      w_best = min(workers_list, key=lambda w: evals[env, cells, w])
      here = evals[env, cells, w_best]
      envs_n = cells * EPISODES
      w = env_pool.auto_workers(envs_n, GPU_HOST_CORES)
      base = (math.ceil(envs_n / w) * step_us[env] / 1e3 + trip_ms(w)) * HORIZON / 1e3
      local = base + policy[env, cells] * HORIZON / 1e3
      gpu = base + 0.2 * HORIZON / 1e3
      print(f"| {env} | {cells} | {train_s:.1f} ({how}) | {here:.1f} ({w_best}) | "
            f"{here / (train_s + here):.0%} | {w} | {base:.1f} | {local:.1f} | "
            f"{local / (train_s + local):.0%} | {gpu:.1f} | {gpu / (train_s + gpu):.0%} |",
            flush=True)
  print(f"\nload average at end: {os.getloadavg()[0]:.1f}; benchmark wall time "
        f"{time.time() - t_bench:.0f} s")


if __name__ == "__main__":
  main()
