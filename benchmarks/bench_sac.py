"""Benchmark: the online SAC behind the medium / expert datasets (mombo_jax.collection.online_sac),
on CPU.

  nice -n 10 python -m benchmarks.bench_sac --steps=250000 --workdir=/tmp/sac_long  # bench_sac.txt
  python -m benchmarks.bench_sac --steps=3000 --start_steps=1000 --eval_every=1000   # smoke test

Runs the collector's own `train_sac` (one gradient step per env step, in chunks of --train_every;
standard online hyperparameters `online_sac.OnlineSettings`, [256, 256] nets, batch 256) with the
collector's seeding,
so `--workdir=W` leaves a checkpoint that `python -m experiments.collect --env=<env>-medium-replay
--workdir=W --sac_steps=...` resumes. Prints every progress / evaluation line as it comes
(timestamped), then a table per checkpoint: interval steps/s with and without the evaluation time,
and the deterministic evaluation return (mean +- std over --eval_episodes episodes; also as a
D4RL-normalized score). The first interval includes jit compilation and the uniform-random
warm-up (no gradient steps), so it is not a steady-state rate.
"""
import argparse
import os
import platform
import re
import time

import jax
import numpy as np

from benchmarks import common
from mombo_jax.collection import online_sac, options, sac_run
from mombo_jax.data import scores
from mombo_jax.env import envs


def _load() -> str:
  one, five, fifteen = os.getloadavg()
  return f"{one:.2f} {five:.2f} {fifteen:.2f} (1/5/15 min; {os.cpu_count()} visible cores)"


def compute_bound(config, obs_dim: int, action_dim: int, seconds: float = 5.0) -> dict:
  """What one SAC update costs and what this machine can do at best.

  flops: XLA's cost analysis of the collector's compiled update (one step of the `train` scan).
  matmul_gflops: this machine's float32 matmul throughput at the widest hidden layer's shapes
    (benchmarks.common.matmul_gflops).
  updates_per_s_bound: matmul_gflops / flops, an upper bound for env steps/s with one update each.
  """
  from mombo_jax.core import sac
  _, train = online_sac._make_jitted(config)
  agent = sac.init_agent(jax.random.key(0), obs_dim, action_dim, config, 1)
  n = 1024
  replay = {"obs": np.zeros((n, obs_dim), np.float32),
            "action": np.zeros((n, action_dim), np.float32), "reward": np.zeros(n, np.float32),
            "next_obs": np.zeros((n, obs_dim), np.float32), "terminated": np.zeros(n, np.float32)}
  flops = common.xla_flops(train.lower(agent, replay, np.int32(n),
                                       jax.random.split(jax.random.key(1), 1)).compile())
  gflops = common.matmul_gflops(config.agent.batch_size, max(config.agent.critic_hidden), seconds)
  return dict(flops=flops, matmul_gflops=gflops, updates_per_s_bound=gflops * 1e9 / flops)


def main():
  defaults = options.Options()
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--env", default="hopper", choices=sorted(envs.GYM_IDS))
  p.add_argument("--steps", type=int, default=100_000, help="SAC env steps (= gradient steps).")
  p.add_argument("--start_steps", type=int, default=defaults.start_steps)
  p.add_argument("--eval_every", type=int, default=defaults.eval_every)
  p.add_argument("--eval_episodes", type=int, default=defaults.eval_episodes)
  p.add_argument("--medium_fraction", type=float, default=defaults.medium_fraction)
  p.add_argument("--hidden", type=int, nargs="+", default=list(defaults.hidden))
  p.add_argument("--batch_size", type=int, default=defaults.batch_size)
  p.add_argument("--seed", type=int, default=defaults.seed)
  p.add_argument("--workdir", default=None, help="Collector workdir for Orbax checkpoints "
                 "(<workdir>/<env>/sac); default: no checkpoints.")
  p.add_argument("--checkpoint_every", type=int, default=defaults.checkpoint_every)
  p.add_argument("--train_every", type=int, default=defaults.train_every,
                 help="Env steps between chunks of as many gradient steps (1: after each step).")
  args = p.parse_args()

  config = online_sac.online_config(args.env, args.hidden, args.batch_size)
  expert = scores.D4RL_REF_SCORES[args.env][1]
  print(f"# bench_sac  hardware: {common.cpu_name()} ({platform.machine()}, jax backend "
        f"{jax.default_backend()} {[d.platform for d in jax.devices()]})")
  print(f"# jax {jax.__version__}, numpy {np.__version__}, python {platform.python_version()}")
  print(f"# {envs.GYM_IDS[args.env]}: {args.steps} steps, warm-up {args.start_steps} uniform-random"
        f" steps, eval every {args.eval_every} steps ({args.eval_episodes} deterministic episodes),"
        f" hidden {args.hidden}, batch {args.batch_size}, gradient steps in chunks of "
        f"{args.train_every}, seed {args.seed} (collector's SAC seed "
        f"{args.seed + online_sac.SEED_OFFSETS['sac']}), checkpoints "
        f"{'in ' + args.workdir if args.workdir else 'off'}")
  print(f"# medium point: eval return >= {args.medium_fraction:.3g} x D4RL expert {expert} = "
        f"{args.medium_fraction * expert:.1f}")
  print(f"# load average before: {_load()}", flush=True)
  env = envs.make_env(args.env)
  bound = compute_bound(config, env.observation_space.shape[0], env.action_space.shape[0])
  env.close()
  print(f"# one SAC update: {bound['flops'] / 1e6:.0f} MFLOP (XLA cost analysis); this machine's "
        f"float32 matmul throughput at these shapes: {bound['matmul_gflops']:.1f} GFLOP/s "
        f"(best of repeated [{args.batch_size}, {max(args.hidden)}] x [{max(args.hidden)}, "
        f"{max(args.hidden)}] chains) -> at most {bound['updates_per_s_bound']:.0f} updates/s",
        flush=True)

  t_start = time.perf_counter()
  lines = []  # (seconds since start, line)

  def log(msg):
    t = time.perf_counter() - t_start
    lines.append((t, msg))
    print(f"[{online_sac._fmt_time(t)}] {msg}", flush=True)

  workdir = os.path.join(args.workdir, args.env, "sac") if args.workdir else None
  schedule = sac_run.SacSchedule(
      args.steps, args.start_steps, args.eval_every, args.eval_episodes,
      args.seed + online_sac.SEED_OFFSETS["sac"], args.train_every, args.checkpoint_every,
      log_every=args.eval_every)
  result = sac_run.train_sac(
      lambda: envs.make_env(args.env), config, schedule,
      sac_run.MediumPoint(args.medium_fraction * expert), workdir=workdir, log_fn=log)
  total = time.perf_counter() - t_start

  # Per checkpoint: the progress line is logged just before the evaluation, so the gap between
  # the two is the evaluation's time.
  progress = {int(m.group(1)): t for t, line in lines
              if (m := re.match(r"SAC step (\d+)/", line))}
  evals = {int(m.group(1)): (t, float(m.group(2)), float(m.group(3))) for t, line in lines
           if (m := re.match(r"\s*eval @ (\d+): return (\S+) \+- (\S+)", line))}
  print()
  print(f"{'step':>8} {'wall':>9} {'steps/s':>8} {'steps/s ex-eval':>16} {'eval s':>7} "
        f"{'eval return':>18} {'normalized':>10}")
  prev_step, prev_t = 0, 0.0
  for step in sorted(evals):
    t_eval, mean, std = evals[step]
    t_prog = progress.get(step, t_eval)
    eval_s = t_eval - t_prog
    prev_eval_s = (evals[prev_step][0] - progress.get(prev_step, evals[prev_step][0])
                   if prev_step in evals else 0.0)
    span = t_prog - prev_t
    rate = (step - prev_step) / max(span, 1e-9)
    rate_ex = (step - prev_step) / max(span - prev_eval_s, 1e-9)
    norm = float(scores.normalized_score(args.env, mean))
    mark = "  <- medium point" if step == result.medium_step else ""
    print(f"{step:>8} {online_sac._fmt_time(t_eval):>9} {rate:>8.1f} {rate_ex:>16.1f} "
          f"{eval_s:>7.1f} "
          f"{mean:>9.1f} +- {std:>6.1f} {norm:>10.1f}{mark}")
    prev_step, prev_t = step, t_prog
  best_step, best = result.best_eval
  steady = [s for s in sorted(evals) if s > max(args.start_steps, args.eval_every)]
  if steady:
    first = max(s for s in evals if s <= max(args.start_steps, args.eval_every))
    t0 = evals[first][0]
    t1 = progress.get(steady[-1], evals[steady[-1]][0])
    eval_time = sum(evals[s][0] - progress.get(s, evals[s][0]) for s in steady[:-1])
    print(f"# steady state (steps {first}..{steady[-1]}): "
          f"{(steady[-1] - first) / (t1 - t0):.1f} steps/s with evaluations, "
          f"{(steady[-1] - first) / (t1 - t0 - eval_time):.1f} steps/s of training alone")
    alone = (steady[-1] - first) / (t1 - t0 - eval_time)
    print(f"# = {alone * bound['flops'] / 1e9:.1f} GFLOP/s of SAC updates, "
          f"{100 * alone / bound['updates_per_s_bound']:.0f}% of the matmul bound above")
  print(f"# best eval return {best:.1f} at step {best_step} (normalized "
        f"{float(scores.normalized_score(args.env, best)):.1f}); final "
        f"{result.evals[-1][1]:.1f}; medium point "
        f"{'step ' + str(result.medium_step) if result.medium_step >= 0 else 'not reached'}")
  print(f"# total wall time {online_sac._fmt_time(total)} "
        f"({args.steps / total:.1f} steps/s overall)")
  print(f"# load average after: {_load()}")


if __name__ == "__main__":
  main()
