"""Benchmark: dynamics-ensemble training and one model rollout at full (paper) size.

  python -m benchmarks.bench_dynamics     # defaults as recorded in bench_dynamics.txt, ~4 min

Measures (compile time reported separately, never mixed into the steady-state numbers):
- seconds per training epoch and epochs/s of the 7-member 4 x 200 SiLU ensemble on 100k synthetic
  transitions with Hopper's dims (obs 11, action 3; 99k train rows -> 387 minibatches of 256 per
  epoch), for 1 seed and for 4 seeds in one program (vmapped: members x seeds in one call, as
  recorded in bench_dynamics.txt; looped on CPU since core/cell_layout: MOMBO_JAX_CELLS=vmap
  reproduces the record's setting);
- one rollout of 50,000 start states x k = 5 with a [256, 256] tanh-Gaussian actor into the paper's
  1.25M-row ring buffer (dynamics.step over all 7 members each step).
Synthetic data: only shapes matter for speed.
"""
import argparse
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax.core import buffer, critics, dynamics, rollout, termination, train
from mombo_jax.data.transitions import Transitions
from mombo_jax.dynamics import dynamics_training, training_data
from mombo_jax.settings import config as config_lib

OBS_DIM, ACTION_DIM = 11, 3


def _data(n, seed=0):
  rng = np.random.default_rng(seed)
  obs = rng.normal(size=(n, OBS_DIM)).astype(np.float32)
  act = rng.uniform(-1, 1, (n, ACTION_DIM)).astype(np.float32)
  nxt = obs + 0.05 * np.tanh(obs @ rng.normal(size=(OBS_DIM, OBS_DIM)) + act.sum(1, keepdims=True))
  rew = (obs[:, 0] + act[:, 0]).astype(np.float32)
  return Transitions(obs, act, rew, nxt.astype(np.float32), np.zeros(n, np.float32))


def _block(tree):
  return jax.block_until_ready(tree)


def bench_training(config, transitions, num_seeds, epochs):
  """(compile + first epoch s, steady seconds per epoch) of a whole epoch (run_epoch: its three
  device calls; training splits the minibatches into calls of ~1 s, the same work)."""
  inputs, targets = training_data.make_arrays(transitions)
  batched = num_seeds > 1
  fns = dynamics_training._compiled(dynamics_training._dyn_config(config), batched)
  init = fns.init
  epoch = lambda *args: dynamics_training.run_epoch(fns, *args)  # noqa: E731
  keys = jax.random.split(jax.random.PRNGKey(0), num_seeds)
  keys = keys if batched else keys[0]
  st = _block(init(keys, inputs, targets))
  never = jnp.asarray(np.iinfo(np.int32).max, jnp.int32)
  t0 = time.perf_counter()
  st, _ = _block(epoch(st, inputs, targets, never))       # compile + one epoch
  first = time.perf_counter() - t0
  times = []
  for _ in range(epochs):
    t0 = time.perf_counter()
    st, mse = _block(epoch(st, inputs, targets, never))
    times.append(time.perf_counter() - t0)
  assert np.all(np.isfinite(np.asarray(mse)))
  return first, float(np.median(times)), times


def bench_rollout(config, transitions, reps):
  """(compile + first s, steady seconds) of rollout.run with N =
  config.rollout.rollout_batch_size."""
  dyn = dynamics.init_state(jax.random.PRNGKey(0), OBS_DIM, ACTION_DIM, config)
  actor = critics.TanhGaussianActor(config.agent.actor_hidden, ACTION_DIM, config.agent.log_std_min,
                                    config.agent.log_std_max)
  actor_params = actor.init(jax.random.PRNGKey(1), jnp.zeros((1, OBS_DIM)))
  term_fn = termination.termination_fn("hopper")

  def policy_fn(obs, key):
    mean, log_std = actor.apply(actor_params, obs)
    return critics.sample_tanh_gaussian(mean, log_std, key)[0]

  run = jax.jit(lambda k, d, s, b: rollout.run(k, policy_fn, d, s, b, config, term_fn),
                donate_argnums=3)
  obs = jnp.asarray(transitions.observations)
  n = config.rollout.rollout_batch_size
  buf = buffer.init_ring(train.capacity(config), OBS_DIM, ACTION_DIM)
  t0 = time.perf_counter()
  start = obs[jax.random.randint(jax.random.PRNGKey(2), (n,), 0, obs.shape[0])]
  buf, m = _block(run(jax.random.PRNGKey(3), dyn, start, buf))
  first = time.perf_counter() - t0
  times = []
  for i in range(reps):
    t0 = time.perf_counter()
    buf, m = _block(run(jax.random.PRNGKey(4 + i), dyn, start, buf))
    times.append(time.perf_counter() - t0)
  return first, float(np.median(times)), times, int(buf.count), {k: float(v) for k, v in m.items()}


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--n", type=int, default=100_000, help="synthetic transitions")
  p.add_argument("--epochs", type=int, default=2, help="timed epochs for 1 seed (after compile)")
  p.add_argument("--epochs_seeds", type=int, default=1, help="timed epochs for 4 seeds")
  p.add_argument("--seeds", type=int, default=4)
  p.add_argument("--rollout_reps", type=int, default=2)
  p.add_argument("--hardware", default="2-core CPU, no GPU",
                 help="hardware description printed in the header")
  args = p.parse_args()

  config = config_lib.make_config("hopper-medium")      # paper sizes: 7 members, 4 x 200, k = 5
  cpu = platform.processor() or platform.machine()
  print(f"# bench_dynamics  hardware: {args.hardware} ({cpu}, "
        f"{os.cpu_count()} visible cores, jax backend {jax.default_backend()} "
        f"{[d.device_kind for d in jax.devices()]})")
  print(f"# jax {jax.__version__}, numpy {np.__version__}, python {platform.python_version()}")
  shape = config.dynamics
  print(f"# ensemble: {shape.dyn_members} members x {'x'.join(map(str, shape.dyn_hidden))} SiLU, "
        f"batch {config.dynamics_training.dyn_batch_size}; data: {args.n} synthetic transitions, "
        f"obs {OBS_DIM} + action {ACTION_DIM}")
  data = _data(args.n)
  n_train, n_hold = training_data.split_sizes(args.n, config)
  steps = -(-n_train // config.dynamics_training.dyn_batch_size)
  print(f"# per epoch: {n_train} train rows -> {steps} minibatch steps per member; "
        f"holdout {n_hold}")
  for seeds, epochs in ((1, args.epochs), (args.seeds, args.epochs_seeds)):
    first, per_epoch, times = bench_training(config, data, seeds, epochs)
    print(f"train  seeds={seeds}  members x seeds={config.dynamics.dyn_members * seeds:3d}  "
          f"compile+first epoch {first:7.2f} s  |  {per_epoch:7.2f} s/epoch  "
          f"{1 / per_epoch:6.3f} epochs/s  ({seeds / per_epoch:6.3f} seed-epochs/s)  "
          f"[timed epochs: {', '.join(f'{t:.2f}' for t in times)}]")
  first, per_roll, times, count, metrics = bench_rollout(config, data, args.rollout_reps)
  n_steps = config.rollout.rollout_batch_size * config.rollout.rollout_length
  print(f"rollout  N={config.rollout.rollout_batch_size} k={config.rollout.rollout_length} actor "
        f"{list(config.agent.actor_hidden)}  ring {train.capacity(config)} rows  "
        f"compile+first {first:7.2f} s  |  {per_roll:6.2f} s/rollout  "
        f"({n_steps / per_roll / 1e3:7.1f}k model steps/s)  "
        f"[timed: {', '.join(f'{t:.2f}' for t in times)}]; ring count after "
        f"{args.rollout_reps + 1} rollouts: {count}; rollout length "
        f"{metrics['length']:.2f} (untrained model: most branches leave hopper's healthy range)")


if __name__ == "__main__":
  main()
