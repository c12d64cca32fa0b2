"""The work both implementations do in benchmarks/peers (issue #29): sizes, the synthetic data and
the FLOP / timing helpers. Imports jax and numpy only (no mombo_jax, no unifloral), so a worker
of either side can use it, whatever Python environment it runs in.

One span = one rollout (rollout_batch start states x rollout_length steps of the model, written
to the synthetic buffer) + `steps` gradient steps on mixed batches: what unifloral's MOPO runs per
rollout_interval (EmptyJackson/unifloral algorithms/mopo.py make_train_step) and what one epoch of
ours runs (mombo_jax/core/train.py make_epoch).
"""
import argparse
import dataclasses
import math
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

OBS, ACT = 11, 3        # hopper's observation and action sizes


@dataclasses.dataclass(frozen=True)
class Work:
  """The settings the issue names (#29): unifloral's MOPO defaults (algorithms/mopo.py Args:
  num_critics 10, batch 256, rollout_interval 1000, rollout_length 5, rollout_batch_size 50,000,
  model_retain_epochs 5, dataset_sample_ratio 0.05) and its 3x256 actor and critics
  (TanhGaussianActor / SoftQNetwork: `for _ in range(3): nn.Dense(256)`); the dynamics ensemble
  as algorithms/dynamics.py Args (num_ensemble 7, n_layers 4, layer_size 200)."""
  steps: int = 1000            # gradient steps per span (unifloral's rollout_interval)
  rollout_batch: int = 50_000
  rollout_length: int = 5
  retain_epochs: int = 5
  real_ratio: float = 0.05
  batch: int = 256
  critics: int = 10
  hidden: int = 256
  layers: int = 3
  members: int = 7             # dynamics ensemble members (both run all 7: see theirs.py)
  elites: int = 5              # ours: the elites the rollout samples from (MOPO's penalty: all 7)
  dyn_hidden: int = 200
  dyn_layers: int = 4
  penalty: float = 0.5         # MOPO lambda (unifloral's step_penalty_coef default)
  rows: int = 1_000_000        # real transitions (hopper-medium has ~1M)
  seed: int = 0


def add_work_flags(parser: argparse.ArgumentParser):
  """--steps, --rollout_batch, --rows, --seed: the Work fields a user may shrink."""
  w = Work()
  parser.add_argument("--steps", type=int, default=w.steps,
                      help="gradient steps per span (= rollout interval)")
  parser.add_argument("--rollout_batch", type=int, default=w.rollout_batch,
                      help="rollout start states per span")
  parser.add_argument("--rows", type=int, default=w.rows, help="synthetic real transitions")
  parser.add_argument("--seed", type=int, default=w.seed)


def work_from(args) -> Work:
  return Work(steps=args.steps, rollout_batch=args.rollout_batch, rows=args.rows, seed=args.seed)


def synthetic_data(rows: int, seed: int = 0) -> dict:
  """Hopper-shaped transitions (numpy float32; terminals bool, as d4rl.qlearning_dataset gives):
  observations, actions, rewards, next_observations, terminals. Values do not change the work
  (every shape is fixed); they are kept hopper-like (height ~1.25, small angles) so that the
  termination functions see plausible states."""
  rng = np.random.default_rng(seed)
  obs = (0.1 * rng.standard_normal((rows, OBS))).astype(np.float32)
  obs[:, 0] += 1.25
  nxt = (obs + 0.01 * rng.standard_normal((rows, OBS))).astype(np.float32)
  return dict(observations=obs,
              actions=rng.uniform(-1, 1, (rows, ACT)).astype(np.float32),
              rewards=rng.standard_normal(rows).astype(np.float32),
              next_observations=nxt, terminals=np.zeros(rows, bool))


def xla_cost(compiled) -> dict:
  """{'flops', 'bytes'} of one call of a compiled function (XLA's cost analysis; a while loop's
  body counts once, so callers count loop bodies on their own or unroll them)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return {"flops": float(cost.get("flops", 0.0)),
          "bytes": float(cost.get("bytes accessed", 0.0))}


class unrolled_scans:
  """Context: jax.lax.scan called with unroll=True (for XLA's cost analysis only, which counts a
  loop body once): a short scan (the rollout's 5 steps) then counts in full. Nothing timed runs
  under it."""

  def __enter__(self):
    self.orig = jax.lax.scan

    def scan(f, init, xs=None, length=None, reverse=False, unroll=1, **kw):
      return self.orig(f, init, xs, length, reverse=reverse, unroll=True, **kw)
    jax.lax.scan = scan
    return self

  def __exit__(self, *exc):
    jax.lax.scan = self.orig


def timed(fn, *args):
  """(seconds, result) of fn(*args) blocked until ready."""
  t = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return time.perf_counter() - t, out


def peak_rss_gb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def matmul_peak_gflops(sizes=(1024, 2048), seconds: float = 5.0) -> float:
  """This CPU's float32 matmul rate (GFLOP/s): the best single timed jitted [n, n] @ [n, n]
  product (all threads XLA uses) over `seconds` per size (the best call: on a shared machine
  the quietest moment)."""
  return max(_matmul_best(n, seconds) for n in sizes)


def _matmul_best(n, seconds):
  a = jnp.ones((n, n), jnp.float32)
  b = jnp.full((n, n), 1.0 / n, jnp.float32)
  f = jax.jit(jnp.dot)
  f(a, b).block_until_ready()
  best, end = 0.0, time.perf_counter() + seconds
  while time.perf_counter() < end:
    t = time.perf_counter()
    f(a, b).block_until_ready()
    best = max(best, 2.0 * n ** 3 / (time.perf_counter() - t))
  return best / 1e9


def loadavg() -> str:
  with open("/proc/loadavg") as f:
    return " ".join(f.read().split()[:3])


def median(xs):
  xs = sorted(xs)
  n = len(xs)
  return float("nan") if n == 0 else (xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2]))


def gflops(flops: float, seconds: float) -> float:
  return flops / seconds / 1e9 if seconds > 0 and math.isfinite(flops) else float("nan")
