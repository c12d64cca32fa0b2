"""Training speed: gradient steps per target (MOMBO lcb / elite_spread / mixture, MOBILE, plain SAC)
and whole epochs (rollout + 1000 steps) for 1 and 4 vmapped seeds.

  python3 -m benchmarks.bench_train [--steps=1000] [--skip_epochs] > benchmarks/bench_train.txt

Paper-size networks (actor and critics [256, 256], dynamics 7 x 4x200), walker2d dimensions
(obs 17, action 6), batch 256, real ratio 0.05. Data are random arrays: speed does not depend on
their values, and the rollout writes fixed shapes. Each timing is the best of `--repeats` runs after
a warm-up (compilation) run; ratios are between timings of this same process.
"""
import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from mombo_jax.core import buffer, cells_program, dynamics, sac, targets, termination, train
from mombo_jax.settings import config as config_lib

OBS, ACT = 17, 6


def _real(n, rng):
  f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
  z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
  obs, next_obs, reward = f(n, OBS), f(n, OBS), f(n)
  return buffer.Batch(obs=jnp.asarray(obs), action=jnp.asarray(np.tanh(f(n, ACT))),
                      reward=jnp.asarray(reward), next_obs=jnp.asarray(next_obs),
                      done=jnp.asarray(z(n)), obs_var=jnp.asarray(z(n, OBS)),
                      next_obs_mean=jnp.asarray(next_obs), next_obs_var=jnp.asarray(z(n, OBS)),
                      reward_mean=jnp.asarray(reward), reward_var=jnp.asarray(z(n)))


def _filled_ring(config, rng, n):
  ring = buffer.init_ring(train.capacity(config), OBS, ACT)
  rows = _real(n, rng)
  rows = rows.replace(obs_var=jnp.full_like(rows.obs_var, 0.01),
                      next_obs_var=jnp.full_like(rows.obs_var, 0.01),
                      reward_var=jnp.full_like(rows.reward, 0.01))
  return buffer.add(ring, rows, jnp.ones((n,), bool))


def _best(fn, repeats):
  fn()  # compile
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def bench_steps(args, rng):
  """Seconds per `args.steps` gradient steps for each target, one seed."""
  real = _real(100_000, rng)
  results = {}
  variants = [("sac (soft target, plain critics)", "mopo", "lcb"),
              ("mombo lcb", "mombo", "lcb"),
              ("mombo elite_spread", "mombo", "elite_spread"),
              ("mombo mixture", "mombo", "mixture"),
              ("mobile (N=10)", "mobile", "lcb")]
  for name, algo, target in variants:
    config = config_lib.make_config("walker2d-medium", algo, target=target,
                                    rollout_batch_size=10_000, rollout_length=5)
    ring = _filled_ring(config, rng, 50_000)
    agent = sac.init_agent(jax.random.PRNGKey(0), OBS, ACT, config, total_steps=10**6)
    dyn = dynamics.init_state(jax.random.PRNGKey(1), OBS, ACT, config)
    term_fn = termination.termination_fn("walker2d")

    @jax.jit
    def steps(agent, ring, dyn, key, config=config):
      target_fn = targets.bind(config, dyn, term_fn)

      def body(agent, k):
        k1, k2 = jax.random.split(k)
        batch = buffer.sample_mixed(real, ring, k1, config.agent.batch_size,
                                    buffer.real_rows(config.agent.batch_size,
                                                     config.rollout.real_ratio))
        return sac.update(agent, batch, k2, target_fn, config)

      return jax.lax.scan(body, agent, jax.random.split(key, args.steps))

    key = jax.random.PRNGKey(2)
    results[name] = _best(lambda: jax.block_until_ready(steps(agent, ring, dyn, key)),
                          args.repeats)
  base = results["sac (soft target, plain critics)"]
  print(f"\n## Gradient steps: seconds per {args.steps} steps (one seed, batch 256)")
  print(f"| target | s / {args.steps} steps | x SAC |")
  print("|---|---|---|")
  for name, t in results.items():
    print(f"| {name} | {t:.2f} | {t / base:.2f} |")


def bench_epochs(args, rng):
  """Whole epochs: rollout (50,000 x k) + steps_per_epoch gradient steps, 1 and 4 vmapped seeds."""
  real = _real(200_000, rng)
  print(f"\n## Whole epochs: MOMBO lcb, rollout {args.rollout} start states x k=5 + "
        f"{args.steps} gradient steps")
  print("| seeds | s / epoch | s / epoch / seed | x 1 seed |")
  print("|---|---|---|---|")
  one = None
  for seeds in (1, 4):
    config = config_lib.make_config("walker2d-medium", "mombo", rollout_batch_size=args.rollout,
                                    steps_per_epoch=args.steps, rollout_length=5)
    keys = jax.random.split(jax.random.PRNGKey(0), seeds)
    dyn = jax.vmap(lambda k: dynamics.init_state(k, OBS, ACT, config))(keys)
    state = train.init_cells(keys, config, real, dyn)
    epoch = cells_program.make_cells_epoch(config, seeds)
    stacked, cell_args = train.single_dataset(real, config, seeds)
    holder = {"state": state}

    def run():
      holder["state"], m = epoch(holder["state"], stacked, keys, cell_args)
      jax.block_until_ready(holder["state"])

    t = _best(run, args.epoch_repeats)
    one = one or t
    print(f"| {seeds} | {t:.2f} | {t / seeds:.2f} | {t / one:.2f} |")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--rollout", type=int, default=50_000)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--epoch_repeats", type=int, default=1)
  parser.add_argument("--skip_epochs", action="store_true")
  parser.add_argument("--skip_steps", action="store_true")
  args = parser.parse_args()
  common.print_header("bench_train")
  t0 = time.time()
  rng = np.random.default_rng(0)
  if not args.skip_steps:
    bench_steps(args, rng)
  if not args.skip_epochs:
    bench_epochs(args, rng)
  print(f"\nload average at end: {os.getloadavg()[0]:.1f}; benchmark wall time "
        f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
  main()
