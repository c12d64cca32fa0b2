"""Scale: whole epochs of every algorithm and MOMBO target for 1..N cells in one compiled program,
each gradient step's FLOP rate, and the paper's D4RL table projected in device-hours.

On a GPU, at the paper's size (each command estimated at under 10 minutes on an H100; not yet run):
  python3 -m benchmarks.bench_scale --cells=1,4,16,64 --skip_projection   # steps, cell counts
  python3 -m benchmarks.bench_scale --skip_steps --skip_cells             # the projection
  python3 -m benchmarks.bench_scale --precision=default,highest,tensorfloat32 --skip_cells \
      --algos=mombo,mobile,mopo --project_envs=walker2d                  # precisions side by side
On this 2-core CPU, reduced epochs (benchmarks/bench_scale.txt, ~15 minutes for both):
  python3 -m benchmarks.bench_scale --steps=10 --rollout=2000 --cells=1,16 --skip_steps \
      --project_algos=mombo,mobile,mopo --project_envs=walker2d --warmup=0 --epoch_repeats=2
  python3 -m benchmarks.bench_scale --precision=default,highest,tensorfloat32 --scan_steps=20 \
      --skip_cells --skip_projection

A cell is one (dataset, beta, seed) run; the cells of one launch are the vmapped (and, over
several devices, sharded) leading axis of the train state. Paper-size networks (actor and critics
[256, 256], dynamics 7 x 4x200), batch 256; an epoch is one `--rollout` x k model rollout plus
`--steps` gradient steps (the paper: 50,000 x k and 1000). Data are random arrays (`--real_rows`
per dataset): speed does not depend on their values.

Algorithms (`--algos`): mombo (MOMBO's default target, elite_spread, the released code's),
mombo_lcb, mombo_mixture, mobile (N = 10), mopo. Reported, per `--precision` (the float32 matmul
precision XLA is asked for, applied when the timed programs are traced and compiled; the package's
programs and the timed steps take it as their Config's matmul_precision, which train.make_epoch
pins (issue #43): default = the Config's own, float32 since #43 (before: JAX's default, TF32 on a
GPU); highest = float32; tensorfloat32. Part 1's hand-written critic takes
jax.default_matmul_precision as named, its default JAX's):

1. precision: the relative error of a moment-matched critic's variances (moments.mm_linear +
   mm_relu, [256, 256]) against a float64 numpy reference, and the matmul throughput;
2. per gradient step (one cell, walker2d dims, `--scan_steps` steps per compiled scan; the
   precisions timed round-robin): ms per step, FLOPs per step (XLA's cost analysis of one step;
   the jaxpr count of benchmarks.common beside it, the count the epoch table uses), GFLOP/s, x
   plain SAC's rate and x the matmul bound;
3. per algorithm and cell count (`--cells`; C seeds of walker2d-medium, k = 5): compile time, s per
   epoch (best of `--epoch_repeats` after `--warmup` untimed calls), per cell, x one cell, memory
   analysis (arguments + temporaries), FLOPs per epoch (common.jaxpr_flops: the rollout's k steps
   and the epoch's gradient steps counted each, which XLA's cost analysis counts once) and GFLOP/s;
4. the projection: for each of `--project_algos` (default `--algos`; the total counts mombo,
   mobile and mopo, the issue's three; other MOMBO targets are printed beside it) the 12-task
   table (3 envs x 4 datasets x 4 seeds x 3000 epochs) as 3 launches, one per env, of 16 cells
   (4 datasets x 4 seeds in one program, each cell with its own dataset's settings from
   config.TASKS; the program's rollout scan runs the longest k of its cells). Each launch's
   program is compiled and timed as program.program_config builds it. Evaluation: 3000 / 10
   evaluations x 16 cells x 10 episodes x 1000 env steps at the time per step of gymnasium's v5
   env measured here (random actions, one core; steps timed, resets not), divided by
   `--eval_workers` (a projection: env_pool.EnvPool's workers, not timed here), plus the
   actor's jitted call per time step and group (4 groups x 1000 per evaluation) measured on this
   device. At reduced sizes (`--rollout` R / `--steps` S other than the paper's), each launch is
   timed as two programs, A = t(R start states, 1 step) and B = t(64, S steps), and the
   paper-size epoch is extrapolated as b x 50,000 + c x 1000, b (per start state) and c (per
   step) solved from A and B (paper_epoch; an estimate: on a GPU measure at the paper's size).
   The hours are device-hours of the backend that ran it: GPU-hours on a GPU only.

Every epoch row ends with the machine's 1-minute load average when its timing ended: on a shared
machine other jobs inflate the times.

Memory grows ~0.95 GiB per cell at paper size (the ring buffer: 5 epochs x 50,000 x 5 rows):
16 cells need ~18 GiB.
"""
import argparse
import dataclasses
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks.bench_train import ACT, OBS, _filled_ring, _real
from mombo_jax.core import (
  buffer,
  cells_program,
  dynamics,
  sac,
  targets,
  termination,
  train,
  xla_options,
)
from mombo_jax.data import names
from mombo_jax.env import envs
from mombo_jax.moment_matching import moments
from mombo_jax.settings import config as config_lib

# name -> (algo, MOMBO target; MOBILE and MOPO ignore the target), the order of the tables.
ALGOS = {"mombo": ("mombo", "elite_spread"), "mombo_lcb": ("mombo", "lcb"),
         "mombo_mixture": ("mombo", "mixture"), "mobile": ("mobile", "elite_spread"),
         "mopo": ("mopo", "elite_spread")}
LABELS = {"mombo": "MOMBO elite_spread", "mombo_lcb": "MOMBO lcb", "mombo_mixture": "MOMBO mixture",
          "mobile": "MOBILE (N=10)", "mopo": "MOPO"}
# The three algorithms (MOMBO at its default target) and its targets in device-hours.
TABLE_ALGOS = ("mombo", "mobile", "mopo")
TARGET_MOMBO_HOURS, TARGET_TOTAL_HOURS, TARGET_16_CELLS = 1.5, 4.0, 2.0
PRECISIONS = ("default", "highest", "tensorfloat32")
# --precision as the Config's matmul_precision (None: the Config's own) for what the package pins.
_RUN_PRECISION = {"default": None, "highest": "float32", "tensorfloat32": "tensorfloat32"}


def _at(config, precision):
  """config at --precision's matmul_precision (the package's programs pin their Config's)."""
  run = _RUN_PRECISION[precision]
  return config if run is None else config.replace(matmul_precision=run)

STEP_TYPES = [("SAC = MOPO's step (soft target, plain critics)", "mopo", "lcb"),
              ("MOMBO lcb", "mombo", "lcb"),
              ("MOMBO elite_spread", "mombo", "elite_spread"),
              ("MOMBO mixture", "mombo", "mixture"),
              ("MOBILE (N=10)", "mobile", "lcb")]

# The paper's table: per env, these datasets x SEEDS seeds x EPOCHS epochs, evaluated every
# EVAL_EVERY epochs on EPISODES episodes of at most HORIZON steps (config defaults).
QUALITIES = ("random", "medium", "medium-replay", "medium-expert")
SEEDS, EPOCHS = 4, config_lib.Config.epochs
_DEFAULT = config_lib.Config()
EVAL_EVERY, EPISODES, HORIZON = (_DEFAULT.evaluation.eval_every, _DEFAULT.evaluation.eval_episodes,
                                 1000)
PAPER_ROLLOUT, PAPER_STEPS = _DEFAULT.rollout.rollout_batch_size, _DEFAULT.steps_per_epoch


def _timed(fn):
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def _random_real(n, obs_dim, act_dim, rng) -> buffer.Batch:
  """Random transitions Batch [n, ...] of the given dims (speed does not depend on the values)."""
  f = lambda *s: rng.normal(size=s).astype(np.float32)  # noqa: E731
  z = lambda *s: np.zeros(s, np.float32)  # noqa: E731
  obs, next_obs, reward = f(n, obs_dim), f(n, obs_dim), f(n)
  return buffer.Batch(obs=obs, action=np.tanh(f(n, act_dim)), reward=reward, next_obs=next_obs,
                      done=z(n), obs_var=z(n, obs_dim), next_obs_mean=next_obs,
                      next_obs_var=z(n, obs_dim), reward_mean=reward, reward_var=z(n))


# --- 1. precision --------------------------------------------------------------------------------

def _relu_moments64(mean, var):
  """Moments of relu(X), X ~ N(mean, var), float64 numpy (Lemma 1 as written). Its cancellation
  for mean / std = a << 0 costs ~a^4 float64 eps relative in the variance: < 1e-10 for |a| < 30,
  far below float32's errors; the check compares entries whose variance is above VAR_FLOOR."""
  from scipy.special import ndtr
  s = np.sqrt(var)
  a = mean / s
  pdf = np.exp(-0.5 * a * a) / math.sqrt(2 * math.pi)
  h = a * ndtr(a) + pdf
  g = (a * a + 1) * ndtr(a) + a * pdf - h * h
  return s * h, var * g


# Variances below this are left out of the relative errors (float32's normal range ends at 1.2e-38;
# the float32 network flushes what lies below it to zero).
VAR_FLOOR = 1e-30


def precision_check(precisions, rng):
  """Relative error of a moment-matched [256, 256] critic's variances (obs 17 + action 6 inputs
  with variance, batch 256) under each matmul precision vs float64 numpy; and the matmul
  throughput under each."""
  # Inputs drawn in float64 and rounded to float32: the reference computes from exactly the
  # values the float32 network gets, so the errors are the computation's alone.
  r32 = lambda x: x.astype(np.float32).astype(np.float64)  # noqa: E731
  dims = [OBS + ACT, 256, 256, 1]
  kernels = [r32(rng.normal(size=(i, o)) / math.sqrt(i)) for i, o in zip(dims[:-1], dims[1:])]
  biases = [r32(0.1 * rng.normal(size=(o,))) for o in dims[1:]]
  mean0 = r32(rng.normal(size=(256, dims[0])))
  var0 = r32(rng.uniform(0.001, 0.1, size=(256, dims[0])))

  def ref():
    m, v, hidden = mean0, var0, []
    for i, (w, b) in enumerate(zip(kernels, biases)):
      m, v = m @ w + b, v @ (w * w)
      if i < len(kernels) - 1:
        m, v = _relu_moments64(m, v)
        hidden.append(v)
    return hidden + [v]

  def net(mean, var, kernels, biases):
    m, v, out = mean, var, []
    for i, (w, b) in enumerate(zip(kernels, biases)):
      m, v = moments.mm_linear(m, v, w, b)
      if i < len(kernels) - 1:
        m, v = moments.mm_relu(m, v)
        out.append(v)
    return out + [v]

  want = ref()
  f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
  args = (f32(mean0), f32(var0), [f32(w) for w in kernels], [f32(b) for b in biases])
  print("\n## Matmul precision: a moment-matched critic [256, 256] (mm_linear + mm_relu), batch "
        "256, input variance 1e-3..0.1; relative error of the variances vs float64 numpy")
  print("| precision | Var after layer 1: median / max rel. error | after layer 2 | output Var |"
        " matmul GFLOP/s [256, 256] |")
  print("|---|---|---|---|---|")
  for p in precisions:
    with jax.default_matmul_precision(p):
      got = jax.jit(net)(*args)
      gflops = common.matmul_gflops(256, 256, seconds=2.0)
    cols = []
    for g, w in zip(got, want):
      keep = w > VAR_FLOOR
      err = np.abs(np.asarray(g, np.float64)[keep] - w[keep]) / w[keep]
      cols.append(f"{np.median(err):.1e} / {np.max(err):.1e}")
    print(f"| {p} | " + " | ".join(cols) + f" | {gflops:.1f} |", flush=True)
  print(f"(variances > {VAR_FLOOR:g} only. The max sits where a = mean / std is large: an error "
        "d in a layer's mean (the matmul's rounding) moves relu's variance there by ~|a| d / std "
        "relative (moments.py's accuracy note); the median is the typical entry.)")


# --- 2. gradient steps ---------------------------------------------------------------------------

def bench_steps(args, rng, precisions):
  """Seconds and FLOPs per gradient step of each step type (one cell), under each precision: the
  precisions' programs of a step type are timed round-robin, so that a shared machine's load hits
  them alike."""
  real = _real(100_000, rng)
  matmul = {}
  for p in precisions:
    with jax.default_matmul_precision(_at(config_lib.Config(), p).matmul_precision):
      matmul[p] = common.matmul_gflops(256, 256)
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
      batch = buffer.sample_mixed(real, ring, k1, config.agent.batch_size,
                                  buffer.real_rows(config.agent.batch_size,
                                                   config.rollout.real_ratio))
      return sac.update(agent, batch, k2, target_fn, config)

    def steps(agent, ring, dyn, key, one=one):
      return jax.lax.scan(lambda a, k: one(a, ring, dyn, k), agent,
                          jax.random.split(key, args.scan_steps))

    key = jax.random.PRNGKey(2)
    counted = common.jaxpr_flops(one, agent, ring, dyn, key)
    compiled = {}
    for p in precisions:
      # The step at the precision a run of that setting computes it (the epoch pins its Config's).
      at_p = xla_options.at_precision(steps, _at(config, p).matmul_precision)
      compiled[p] = jax.jit(at_p).lower(agent, ring, dyn, key).compile()
      jax.block_until_ready(compiled[p](agent, ring, dyn, key))
    best = {p: float("inf") for p in precisions}
    for _ in range(args.repeats):
      for p in precisions:
        best[p] = min(best[p], _timed(
            lambda: jax.block_until_ready(compiled[p](agent, ring, dyn, key))))
    for p in precisions:
      # XLA's cost analysis counts the scan's body once: one step (plus the keys' split, integer
      # work), so no second compile of a single step is needed.
      flops = common.xla_flops(compiled[p])
      per_step = best[p] / args.scan_steps
      rows.append((name, p, per_step, flops, counted, flops / per_step / 1e9))
  sac_gflops = {p: g for name, p, *_, g in rows if name == STEP_TYPES[0][0]}
  print(f"\n## Gradient steps (one cell, batch 256, walker2d dims; best of {args.repeats} x "
        f"{args.scan_steps} steps" + (", precisions timed round-robin" if len(precisions) > 1
                                      else "") + ")")
  print("machine's float32 matmul throughput at [256, 256] x [256, 256]: "
        + ", ".join(f"{matmul[p]:.1f} GFLOP/s ({p})" for p in precisions))
  print("| step | matmul precision | ms / step | MFLOP / step (XLA) | MFLOP / step (jaxpr count) | "
        "GFLOP/s (XLA) | x SAC's GFLOP/s | x matmul bound |")
  print("|---|---|---|---|---|---|---|---|")
  for name, p, per_step, flops, counted, gflops in rows:
    print(f"| {name} | {p} | {1e3 * per_step:.2f} | {flops / 1e6:.0f} | {counted / 1e6:.0f} | "
          f"{gflops:.1f} | {gflops / sac_gflops[p]:.2f} | {gflops / matmul[p]:.2f} |", flush=True)


# --- 3. whole epochs -----------------------------------------------------------------------------

@dataclasses.dataclass
class Program:
  """One compiled epoch's arguments: C cells of D stacked datasets."""
  config: config_lib.Config   # the program's (program.program_config: the longest k)
  per_cell: tuple             # train.per_cell_settings of the cells' configs
  cells: train.Cell           # [C]
  real: buffer.Batch          # [D, N, ...]
  obs_dim: int
  act_dim: int

  @property
  def num_cells(self):
    return int(self.cells.dataset_index.shape[0])


def seeds_program(name, num_cells, rollout, steps, real_rows, rng) -> Program:
  """num_cells seeds of walker2d-medium (k = 5 for every algorithm): the cell-count table."""
  algo, target = ALGOS[name]
  config = config_lib.make_config("walker2d-medium", algo, target=target,
                                  rollout_batch_size=rollout, steps_per_epoch=steps)
  real = _random_real(real_rows, OBS, ACT, rng)
  stacked, cells = train.single_dataset(real, config, num_cells)
  return Program(config, (), cells, stacked, OBS, ACT)


def launch_configs(name, env, rollout, steps) -> list:
  """The configs of one launch's datasets (QUALITIES of env, each its own paper settings)."""
  algo, target = ALGOS[name]
  return [config_lib.make_config(f"{env}-{q}", algo, target=target, rollout_batch_size=rollout,
                                 steps_per_epoch=steps) for q in QUALITIES]


def launch_program(name, env, rollout, steps, real_rows, rng) -> Program:
  """One launch of the projection: QUALITIES x SEEDS cells of env in one program, as
  program.program_config and train.make_cells build it (dataset-major cells)."""
  configs = launch_configs(name, env, rollout, steps)
  program = configs[0].replace(rollout_length=max(c.rollout.rollout_length for c in configs))
  obs_dim, act_dim = envs.OBS_DIM[env], envs.ACTION_DIM[env]
  one = _random_real(real_rows, obs_dim, act_dim, rng)
  stacked = jax.tree.map(lambda x: np.broadcast_to(x, (len(configs),) + x.shape), one)
  cell_configs = [c for c in configs for _ in range(SEEDS)]
  cells = train.make_cells(np.repeat(np.arange(len(configs)), SEEDS), real_rows, cell_configs)
  return Program(program, train.per_cell_settings(configs), cells, stacked, obs_dim, act_dim)


@dataclasses.dataclass
class Timing:
  compile_s: float
  seconds: float       # best s per epoch
  mem_gb: float        # arguments + temporaries, XLA's memory analysis
  flops: float         # per epoch, common.jaxpr_flops
  load: float          # the machine's 1-minute load average when the timing ended


def time_epoch(program: Program, precision: str, repeats: int, warmup: int = 1) -> Timing:
  """Compile the program's epoch under `precision`, run it `warmup` times untimed, then time the
  best of `repeats` epochs. A function of its own so that one program's state is freed before the
  next is built."""
  config, c = _at(program.config, precision), program.num_cells
  keys = jax.random.split(jax.random.PRNGKey(0), c)
  dyn = jax.vmap(lambda k: dynamics.init_state(k, program.obs_dim, program.act_dim, config))(keys)
  first = jax.tree.map(lambda x: x[0], program.real)
  state = train.init_cells(keys, config, first, dyn)
  real = jax.tree.map(jnp.asarray, program.real)
  # its dots at config's precision
  fn = cells_program.make_cells_epoch(config, c, program.per_cell)
  flops = common.jaxpr_flops(fn, state, real, keys, program.cells)
  t0 = time.perf_counter()
  compiled = fn.lower(state, real, keys, program.cells).compile()
  compile_s = time.perf_counter() - t0
  mem = compiled.memory_analysis()
  mem_gb = ((mem.argument_size_in_bytes + mem.temp_size_in_bytes) / 2**30
            if mem is not None else float("nan"))
  holder = {"state": state}
  del state

  def run():
    holder["state"], _ = compiled(holder["state"], real, keys, program.cells)
    jax.block_until_ready(holder["state"])

  for _ in range(warmup):   # buffers allocated, caches warm
    run()
  best = min(_timed(run) for _ in range(repeats))
  return Timing(compile_s, best, mem_gb, flops, os.getloadavg()[0])


def _out_of_memory(e) -> bool:
  return "RESOURCE_EXHAUSTED" in str(e) or "out of memory" in str(e).lower()


def bench_cells(args, rng, precision) -> dict:
  """Whole epochs for each algorithm and cell count; returns {(name, cells): Timing}."""
  print(f"\n## Whole epochs, matmul precision {precision}: walker2d-medium (k = 5), {args.rollout} "
        f"x 5 rollout + {args.steps} gradient steps per cell{_reduced(args)}; "
        f"{jax.local_device_count()} device(s)")
  print("| algorithm | cells | compile s | s / epoch | s / epoch / cell | x 1 cell | memory "
        "(args + temp) | GFLOP / epoch | GFLOP/s | load |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  out = {}
  for name in args.algos:
    one = None
    for cells in args.cells:
      try:
        t = time_epoch(seeds_program(name, cells, args.rollout, args.steps, args.real_rows, rng),
                       precision, args.epoch_repeats, args.warmup)
      except Exception as e:  # past the device's memory: the algorithm's table ends, not the record
        if not _out_of_memory(e):
          raise
        print(f"| {LABELS[name]} | {cells} | out of device memory: "
              f"{str(e).splitlines()[0][:100]} ||||||||", flush=True)
        break
      one = one or t.seconds
      out[name, cells] = t
      print(f"| {LABELS[name]} | {cells} | {t.compile_s:.1f} | {t.seconds:.3f} | "
            f"{t.seconds / cells:.4f} | {t.seconds / one:.2f} | {t.mem_gb:.2f} GiB | "
            f"{t.flops / 1e9:.1f} | {t.flops / t.seconds / 1e9:.1f} | {t.load:.1f} |", flush=True)
  ratios = [(n, out[n, 16].seconds / out[n, 1].seconds) for n in args.algos
            if (n, 1) in out and (n, 16) in out]
  if ratios:
    print(f"\n16 cells vs 1 cell (the issue's target: <= {TARGET_16_CELLS:g}x one cell's epoch"
          f"{'' if _paper_size(args) else '; measured at the reduced epoch'}): "
          + "; ".join(f"{LABELS[n]} {r:.2f}x ({_verdict(r, TARGET_16_CELLS)})" for n, r in ratios))
  return out


def _paper_size(args) -> bool:
  return (args.rollout, args.steps) == (PAPER_ROLLOUT, PAPER_STEPS)


def _verdict(value, target) -> str:
  """met / missed against a GPU target, on a GPU only."""
  if jax.default_backend() != "gpu":
    return f"a GPU target: not comparable on {jax.default_backend()}"
  return "met" if value <= target else "missed"


def _reduced(args) -> str:
  if _paper_size(args):
    return " (the paper's size)"
  return (f" (REDUCED from the paper's {PAPER_ROLLOUT} x k + {PAPER_STEPS} steps: the times are "
          "of this reduced epoch)")


# --- 4. the projection ---------------------------------------------------------------------------

def env_step_seconds(env_name: str, steps: int, seed: int = 0) -> float:
  """Seconds per env.step of gymnasium's v5 env, random actions, one core; resets not timed (an
  evaluation episode of a trained policy runs its 1000 steps)."""
  env = envs.make_env(env_name)
  env.action_space.seed(seed)
  env.reset(seed=seed)
  spent = 0.0
  for _ in range(steps):
    action = env.action_space.sample()
    t0 = time.perf_counter()
    _, _, terminated, truncated, _ = env.step(action)
    spent += time.perf_counter() - t0
    if terminated or truncated:
      env.reset()
  env.close()
  return spent / steps


def policy_call_seconds(env_name: str, calls: int = 200) -> float:
  """Seconds per call of the evaluation's jitted actor (evaluate.Evaluator's: tanh(mean) of
  SEEDS actors on [SEEDS, EPISODES, obs]) on this device, observation copied in and action out."""
  from mombo_jax.core import actor_policy
  from mombo_jax.core.critics import TanhGaussianActor
  c = config_lib.Config()
  obs_dim, act_dim = envs.OBS_DIM[env_name], envs.ACTION_DIM[env_name]
  actor = TanhGaussianActor(c.agent.actor_hidden, act_dim, c.agent.log_std_min, c.agent.log_std_max)
  params = jax.vmap(lambda k: actor.init(k, jnp.zeros((1, obs_dim))))(
      jax.random.split(jax.random.PRNGKey(0), SEEDS))
  fn = actor_policy.actor_functions(actor_policy.ActorShape.of(
      c.agent.actor_hidden, act_dim, c.agent.log_std_min, c.agent.log_std_max)).mode_per_seed
  obs = np.zeros((SEEDS, EPISODES, obs_dim), np.float32)
  np.asarray(fn(params, jnp.asarray(obs)))
  t0 = time.perf_counter()
  for _ in range(calls):
    np.asarray(fn(params, jnp.asarray(obs)))
  return (time.perf_counter() - t0) / calls


def eval_hours(step_s, call_s, workers) -> float:
  """One launch's evaluations: EPOCHS / EVAL_EVERY x (SEEDS x len(QUALITIES) cells x EPISODES x
  HORIZON env steps / workers + len(QUALITIES) groups x HORIZON actor calls), in hours."""
  evaluations = EPOCHS // EVAL_EVERY
  env_steps = SEEDS * len(QUALITIES) * EPISODES * HORIZON
  return evaluations * (env_steps * step_s / workers + len(QUALITIES) * HORIZON * call_s) / 3600


# Start states of the step-heavy timing (t(R0, S)): enough rows in the ring for the batches' draws.
R0 = 64


def paper_epoch(args, name, env, precision, rng) -> tuple:
  """(paper-size s per epoch of the launch, its measured Timings, (b, c) or None).

  At the paper's size: the measurement. Else two programs of the launch: rollout-heavy
  A = t(R, 1 step) and step-heavy B = t(R0, S), each modelled as b x rollout + c x steps (b: s
  per start state, c: s per gradient step, all cells together), solved for b and c and
  extrapolated to b x 50,000 + c x 1000. Ratios of measured times, not differences of them: the
  noise of a shared machine stays a relative error and cannot flip a sign. Fixed per-epoch costs
  are folded into b and c (a small overestimate)."""
  def timed(rollout, steps):
    return time_epoch(launch_program(name, env, rollout, steps, args.real_rows, rng), precision,
                      args.epoch_repeats, args.warmup)

  if _paper_size(args):
    base = timed(args.rollout, args.steps)
    return base.seconds, [base], None
  r, s = args.rollout, args.steps
  roll, step = timed(r, 1), timed(R0, s)
  # A = b r + c, B = b R0 + c s: c from B less its rollout share, b from A less its one step.
  c = max((step.seconds - roll.seconds * R0 / r) / (s - R0 / r), 0.0)
  b = max(roll.seconds - c, 0.0) / r
  return b * PAPER_ROLLOUT + c * PAPER_STEPS, [roll, step], (b, c)


def project(args, rng, precision, cells_table):
  """The 12-task table per algorithm: 3 launches of 16 cells, training + evaluation."""
  backend = jax.default_backend()
  unit = "GPU-hours" if backend == "gpu" else f"{backend.upper()}-hours (NOT GPU-hours)"
  names = args.project_algos or args.algos
  print(f"\n## Projection, matmul precision {precision}: the D4RL table (3 envs x "
        f"{len(QUALITIES)} datasets x {SEEDS} seeds x {EPOCHS} epochs) as 3 launches of "
        f"{len(QUALITIES) * SEEDS} cells, on this machine ({backend}: "
        f"{jax.devices()[0].device_kind}), in {unit}")
  if _paper_size(args):
    print(f"Each launch's epoch measured at the paper's size ({PAPER_ROLLOUT} x k rollout + "
          f"{PAPER_STEPS} steps per cell).")
  else:
    print(f"REDUCED sizes: the paper's epoch ({PAPER_ROLLOUT} x k rollout + {PAPER_STEPS} steps "
          f"per cell) = b x {PAPER_ROLLOUT} + c x {PAPER_STEPS}, b (s per start state) and c (s "
          f"per gradient step, all cells together) solved from two programs of each launch, "
          f"A = t({args.rollout} start states, 1 step) and B = t({R0} start states, {args.steps} "
          "steps), each = b x rollout + c x steps: an extrapolation, linear in both. GFLOP/s: "
          "of A / B.")
  # Evaluation: per env, gymnasium step and the actor's call.
  step_s = {e: env_step_seconds(e, args.eval_steps) for e in names.ENVS}
  call_s = {e: policy_call_seconds(e) for e in names.ENVS}
  print("\nEvaluation cost per launch: "
        f"{EPOCHS // EVAL_EVERY} evaluations x ({SEEDS * len(QUALITIES)} cells x {EPISODES} "
        f"episodes x {HORIZON} env steps / {args.eval_workers} workers + {len(QUALITIES)} groups x "
        f"{HORIZON} actor calls); the workers are a projection (env_pool.EnvPool's workers, not "
        "timed here: the 1-worker hours are given too)")
  print("| env | gymnasium v5 step (one core) | actor call on this device | eval hours / launch "
        f"at {args.eval_workers} workers | at 1 worker |")
  print("|---|---|---|---|---|")
  for e in names.ENVS:
    print(f"| {e} | {1e6 * step_s[e]:.1f} us | {1e6 * call_s[e]:.0f} us | "
          f"{eval_hours(step_s[e], call_s[e], args.eval_workers):.3f} | "
          f"{eval_hours(step_s[e], call_s[e], 1):.3f} |", flush=True)

  measured = [e for e in names.ENVS if e in args.project_envs]
  order = measured + [e for e in names.ENVS if e not in measured]   # measured ones first
  paper = _paper_size(args)
  r, n = args.rollout, args.steps
  sizes = "measured s / epoch" if paper else (
      f"A: s / epoch at {r} start states, 1 step | B: at {R0}, {n} steps | b (us / start state) | "
      "c (ms / step)")
  print(f"\n| algorithm | env | rollout k of its cells (program K) | per-cell settings | {sizes} | "
        "paper-size s / epoch | GFLOP/s | train hours | eval hours | hours | load |")
  print("|---" * (11 if paper else 14) + "|")
  totals, checks = {}, []
  for name in names:
    epoch_s = {}
    for env in order:
      configs = launch_configs(name, env, args.rollout, args.steps)
      ks = [c.rollout.rollout_length for c in configs]
      per_cell = ",".join(train.per_cell_settings(configs)) or "none"
      if env in measured:
        try:
          seconds, timings, coef = paper_epoch(args, name, env, precision, rng)
        except Exception as e:
          if not _out_of_memory(e):
            raise
          print(f"| {LABELS[name]} | {env} | out of device memory: {str(e).splitlines()[0][:100]}"
                " ||||||||", flush=True)
          continue
        epoch_s[env] = seconds
        shown = " | ".join(f"{t.seconds:.3f}" for t in timings)
        if coef is not None:
          b, c = coef
          shown += f" | {1e6 * b:.1f} | {1e3 * c:.1f}"
          if (name, SEEDS * len(QUALITIES)) in cells_table and env == "walker2d":
            checks.append((name, b * args.rollout + c * args.steps,
                           cells_table[name, SEEDS * len(QUALITIES)].seconds))
        rate = " / ".join(f"{t.flops / t.seconds / 1e9:.1f}" for t in timings)
        load = " / ".join(f"{t.load:.1f}" for t in timings)
      else:
        source = measured[0]
        if source not in epoch_s:
          continue
        seconds = epoch_s[source]
        shown = " | ".join([f"({source}'s)"] + ["-"] * (0 if paper else 3))
        rate = load = "-"
      train_h = EPOCHS * seconds / 3600
      eval_h = eval_hours(step_s[env], call_s[env], args.eval_workers)
      totals[name] = totals.get(name, 0.0) + train_h + eval_h
      print(f"| {LABELS[name]} | {env} | {','.join(map(str, ks))} (K={max(ks)}) | {per_cell} | "
            f"{shown} | {seconds:.3f} | {rate} | {train_h:.3f} | {eval_h:.3f} | "
            f"{train_h + eval_h:.3f} | {load} |", flush=True)
  for name, model, seen in checks:
    print(f"\ncheck, {LABELS[name]}: the model's b x {args.rollout} + c x {args.steps} = "
          f"{model:.3f} s vs {seen:.3f} s measured at that size (the cells table's 16 cells of "
          "walker2d-medium: one dataset, k = 5 for all; same shapes)")
  if measured and set(measured) != set(names.ENVS):
    dims = ", ".join(f"{e} {envs.OBS_DIM[e]} / {envs.ACTION_DIM[e]}" for e in names.ENVS)
    print(f"\n(envs not measured here, --project_envs={','.join(measured)}: their launches are "
          f"costed at {measured[0]}'s epoch; every launch's program K is 5, and the envs differ "
          f"in obs / action dims: {dims}.)")
  print(f"\n{unit} for the whole table, training + evaluation:")
  for name in names:
    if name in totals:
      note = ""
      if name == "mombo":
        note = (f" (target <= {TARGET_MOMBO_HOURS:g} GPU-hours: "
                f"{_verdict(totals[name], TARGET_MOMBO_HOURS)})")
      elif name not in TABLE_ALGOS:
        note = " (an alternative MOMBO target: not in the total)"
      print(f"- {LABELS[name]}: {totals[name]:.2f}{note}")
  if all(n in totals for n in TABLE_ALGOS):
    total = sum(totals[n] for n in TABLE_ALGOS)
    print(f"- all three ({', '.join(LABELS[n] for n in TABLE_ALGOS)}): {total:.2f} "
          f"(target <= {TARGET_TOTAL_HOURS:g} GPU-hours: {_verdict(total, TARGET_TOTAL_HOURS)})")
  ratios = [(n, cells_table[n, 16].seconds / cells_table[n, 1].seconds) for n in names
            if (n, 1) in cells_table and (n, 16) in cells_table]
  for n, r in ratios:
    print(f"- 16 cells vs 1 cell, {LABELS[n]}: {r:.2f}x (target <= {TARGET_16_CELLS:g}x: "
          f"{_verdict(r, TARGET_16_CELLS)}"
          + ("" if _paper_size(args) else "; measured at the reduced epoch") + ")")
  if not ratios:
    print("- 16 cells vs 1 cell: not measured (--cells needs 1 and 16)")


def main():
  ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
  words = lambda s: [x for x in s.split(",") if x]  # noqa: E731
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--cells", type=ints, default=[1, 4, 16])
  parser.add_argument("--algos", type=words, default=list(ALGOS),
                      help=f"Comma list of {', '.join(ALGOS)}.")
  parser.add_argument("--steps", type=int, default=PAPER_STEPS, help="Gradient steps per epoch.")
  parser.add_argument("--rollout", type=int, default=PAPER_ROLLOUT, help="Rollout start states.")
  parser.add_argument("--real_rows", type=int, default=200_000,
                      help="Rows of each (random) dataset.")
  parser.add_argument("--scan_steps", type=int, default=1000,
                      help="Gradient steps per timed scan in the step table.")
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--epoch_repeats", type=int, default=1)
  parser.add_argument("--precision", type=words, default=["default"],
                      help=f"Comma list of matmul precisions: {', '.join(PRECISIONS)}.")
  parser.add_argument("--eval_workers", type=int, default=16,
                      help="Cores stepping the evaluation envs (a projection).")
  parser.add_argument("--eval_steps", type=int, default=3000,
                      help="Env steps timed per env for the evaluation cost.")
  parser.add_argument("--project_envs", type=words, default=list(names.ENVS),
                      help="Envs whose launches are compiled and timed; the others are costed at "
                           "the first one's epoch.")
  parser.add_argument("--project_algos", type=words, default=None,
                      help="Algorithms of the projection (default: --algos).")
  parser.add_argument("--warmup", type=int, default=1,
                      help="Untimed epochs after compiling, before the timed ones.")
  parser.add_argument("--skip_precision_check", action="store_true")
  parser.add_argument("--skip_steps", action="store_true")
  parser.add_argument("--skip_cells", action="store_true")
  parser.add_argument("--skip_projection", action="store_true")
  args = parser.parse_args()
  for flag, values, allowed in (("--algos", args.algos, ALGOS), ("--precision", args.precision,
                                                                 PRECISIONS),
                                ("--project_envs", args.project_envs, names.ENVS),
                                ("--project_algos", args.project_algos or args.algos, ALGOS)):
    bad = [v for v in values if v not in allowed]
    if bad or not values:
      parser.error(f"{flag}: {','.join(bad) or 'empty'}; choose from {', '.join(allowed)}.")
  if min(args.cells + [args.steps, args.rollout, args.scan_steps, args.eval_workers,
                       args.epoch_repeats, args.repeats, args.eval_steps]) < 1 or args.warmup < 0:
    parser.error("--cells, --steps, --rollout, --scan_steps, --eval_workers, --repeats, "
                 "--epoch_repeats and --eval_steps must be >= 1, --warmup >= 0.")
  common.print_header("bench_scale")
  print(f"precision(s): {', '.join(args.precision)}" + (
      "" if args.skip_cells and args.skip_projection else
      f"; epoch: {args.rollout} x k rollout + {args.steps} gradient steps per cell"
      f"{_reduced(args)}"))
  t0 = time.time()
  rng = np.random.default_rng(0)
  if not args.skip_precision_check:
    precision_check(args.precision, rng)
  if not args.skip_steps:
    bench_steps(args, rng, args.precision)
  for precision in args.precision:
    cells_table = {} if args.skip_cells else bench_cells(args, rng, precision)
    if not args.skip_projection:
      project(args, rng, precision, cells_table)
  print(f"\nload average at end: {os.getloadavg()[0]:.1f}; benchmark wall time "
        f"{time.time() - t0:.0f} s")


if __name__ == "__main__":
  main()
