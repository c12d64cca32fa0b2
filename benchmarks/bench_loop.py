"""Host overhead of the training loop: what a real launch (mombo_jax.run.launch.train_runs) spends
per epoch beyond the compiled epoch's own time.

  python3 -m benchmarks.bench_loop --out=/tmp/bench_loop.txt               # ~4-8 min, 2 cores
  benchmarks/compare_loop.sh OLD_TREE NEW_TREE OUT    # this script on two source trees in a row

Per setting (steps_per_epoch, "tiny" preset, hopper-random, --seeds cells):
- device ms / epoch: the state built as the runner builds it, the compiled epoch
  (make_cells_epoch of cells_program, or of train in older trees, or train.make_seeds_epoch)
  called N2 times back to back with keys made beforehand, blocked at the end;
- T(N): wall time of one run's launch.train_runs (runner.train_run in older trees) for N epochs
  (eval_every = N: one evaluation and one checkpoint, at the end) in a fresh workdir, the dataset
  and the dynamics ensembles built once beforehand and reused, compilation served by a persistent
  compilation cache that untimed warm-up launches of both N filled (the compile time the launch
  logs is listed to show it); the actor's lr schedule spans N2 epochs in both (schedule_epochs),
  so the N1 launch trains the N2 launch's first epochs;
- marginal ms / epoch = (T(N2) - T(N1)) / (N2 - N1);
- host overhead = marginal - device, in ms and as a % of the device time;
- chunk ms / epoch (trees with make_cells_chunk, the rewrite's several epochs per device
  call): one call of it running N2 epochs, per epoch; "n/a" in older trees.
Each of --repeats repeats runs launch N1, launch N2, then the device timings, so that a repeat's
timings see about the same load; the table gives medians over the repeats (host overhead: the
median of the repeats' differences).

The fixed costs of a launch (data and dynamics loading, compilation, the evaluation, the
checkpoint, summary and plot) cancel in the difference; what remains is what the loop adds per
epoch (dispatch, key folding, the per-epoch pulls of metrics to the host, Python). The evaluation
is timed on its own (the `eval s` column, where the runner has an evaluation function): its cost
depends on the actor's episode lengths, so it is the one fixed cost that may not cancel exactly; the
`excl. eval` column takes it out.

Run it from the root of the tree to measure: that tree's mombo_jax is the one imported (printed in
the header with the tree's git version). On a shared machine the timings are noisy: the header and
the last line give the load average.
"""
import argparse
import contextlib
import importlib
import io
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import mombo_jax
from benchmarks import common
from mombo_jax.core import buffer, train

try:
  from mombo_jax.core import cells_program as cells  # the cells' program's own module
except ImportError:
  cells = train                                        # older trees: it was in train.py

try:
  from mombo_jax.run import host_run, launch as runner  # the launch object's tree (issue #44)
except ImportError:                                     # an older tree: runner.train_run
  from mombo_jax.run import runner
  host_run = None
try:
  from mombo_jax.run import evaluation  # its own module since issue #50
except ImportError:
  evaluation = host_run
from mombo_jax.settings import config as config_lib

SCRIPT = os.path.join("benchmarks", "bench_loop.py")


class _Record:
  """benchmarks.common.Record, kept here: compare_loop.sh runs this file inside older trees, whose
  common.py may lack it. Prints lines and appends them to --out as they come."""

  def __init__(self, path):
    self.file = open(path, "w") if path else None

  def __call__(self, line=""):
    print(line, flush=True)
    if self.file:
      self.file.write(line + "\n")
      self.file.flush()


def _git(root, *args):
  try:
    return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True,
                          check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def tree_version(root) -> str:
  """'<short HEAD>, clean' or '<short HEAD>, dirty (...)' of the git tree at root; this script
  itself (copied into a tree to measure it) does not count."""
  head = _git(root, "rev-parse", "--short", "HEAD")
  if head is None:
    return "not a git tree"
  lines = [l for l in _git(root, "status", "--porcelain", "--untracked-files=all").splitlines()
           if l[3:] != SCRIPT]
  modified = sum(not l.startswith("??") for l in lines)
  untracked = len(lines) - modified
  return head + (", clean" if not lines else
                 f", dirty ({modified} tracked file(s) changed, {untracked} untracked)")


def _round(xs):
  return "[" + ", ".join(f"{x:.2f}" for x in xs) + "]"


def loadavg() -> str:
  with open("/proc/loadavg") as f:
    return " ".join(f.read().split()[:3])


def _first(module, *names):
  """module's first attribute of `names` (the loop's rewrite renames seeds -> cells)."""
  return next(getattr(module, n) for n in names if hasattr(module, n))


def _epoch_fn(config):
  """The compiled epoch of config.num_seeds cells: make_cells_epoch (new) or make_seeds_epoch."""
  if hasattr(cells, "make_cells_epoch"):
    return cells.make_cells_epoch(config, config.num_seeds)
  return train.make_seeds_epoch(config)


def _module(*names):
  """The first of mombo_jax's modules `names` that this tree has (the package's rooms were split:
  launch.py's parts moved to run_dataset, dynamics_store, ...), or None."""
  for name in names:
    try:
      return importlib.import_module(f"mombo_jax.{name}")
    except ImportError:
      pass
  return None


def _dynamics(config, transitions, dataset, dyn_dir):
  """The seeds' saved ensembles, as the runner gets them (dynamics_store.get_dynamics; older
  trees: workdir.get_dynamics, or launch.get_dynamics of another signature before the rewrite)."""
  launch = _module("launch")
  if launch is not None and hasattr(launch, "get_dynamics"):
    seed_keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(config.seed,
                                                        config.seed + config.num_seeds))
    return launch.get_dynamics(config, transitions, jax.vmap(jax.random.fold_in, (0, None))(
        seed_keys, 0), dyn_dir, dataset)
  store = _module("dynamics.dynamics_store", "run.dynamics_store", "dynamics_store")
  if store is None or not hasattr(store, "get_dynamics"):
    store = _module("records.workdir", "workdir")
  return store.get_dynamics(config, transitions, dataset, dyn_dir)


def device_timer(config, dataset, dyn_dir, build_steps, epochs):
  """The state built as the runner builds it (one group: config.num_seeds seeds of `dataset`) and
  both programs compiled; returns time() -> (ms per epoch of the compiled epoch called `epochs`
  times back to back, blocked at the end; ms per epoch of one make_cells_chunk call running
  `epochs` epochs, or None where the tree has none). Each call trains the same state on."""
  with contextlib.redirect_stdout(io.StringIO()):
    # run_dataset.load_or_build; an older tree's launch.load_dataset.
    load = (getattr(_module("run.run_dataset", "run_dataset"), "load_or_build", None)
            or _module("launch").load_dataset)
    transitions = load(dataset, config, "random", build_steps)
    dyn = _dynamics(config, transitions, dataset, dyn_dir)
  s = config.num_seeds
  seed_keys = jax.vmap(jax.random.PRNGKey)(jnp.arange(config.seed, config.seed + s))
  init_keys, keys = (jax.vmap(jax.random.fold_in, (0, None))(seed_keys, i) for i in (1, 2))
  placement = _module("core.placement") or train     # train's own placement before #37
  shard = _first(placement, "shard_cells", "shard_seeds")
  real = buffer.from_transitions(transitions)
  stacked, sizes = buffer.stack([real])
  held = {"state": shard(_first(train, "init_cells", "init_seeds")(init_keys, config, real, dyn))}
  cells = shard(train.make_cells([0] * s, np.asarray(sizes)[[0] * s], config))
  stacked, keys = placement.replicate(stacked), shard(keys)
  fold = jax.jit(jax.vmap(jax.random.fold_in, in_axes=(0, None)))
  epoch_keys = jax.block_until_ready([fold(keys, e) for e in range(epochs)])
  epoch = _epoch_fn(config)
  chunk = (cells.make_cells_chunk(config, s, epochs) if hasattr(cells, "make_cells_chunk")
           else None)

  def run_epochs():
    state = held["state"]
    for k in epoch_keys:
      state, metrics = epoch(state, stacked, k, cells)
    held["state"] = jax.block_until_ready(state)
    jax.block_until_ready(metrics)

  def run_chunk():
    held["state"], metrics = jax.block_until_ready(
        chunk(held["state"], stacked, keys, cells, 0, epochs))

  def per_epoch_ms(fn):
    t0 = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - t0) / epochs

  def time_both():
    return per_epoch_ms(run_epochs), per_epoch_ms(run_chunk) if chunk else None

  time_both()  # compiles
  return time_both


def launch_seconds(config, dataset, workdir, dyn_dir, build_steps, log_path):
  """(wall s of one run's launch in a fresh workdir, compile s it logged or nan, s in its
  evaluations or nan); its log goes to log_path, the workdir is removed."""
  evals = []
  # The evaluation function: evaluation.returns_all now, host_run.returns_all,
  # group_run.evaluate or runner._evaluate in older checkouts.
  host, name = ((evaluation, "returns_all") if evaluation is not None
                else (runner.group_run, "evaluate") if hasattr(runner, "group_run")
                else (runner, "_evaluate"))
  original = getattr(host, name, None)
  if original is not None:
    def timed(*args, **kwargs):
      t = time.perf_counter()
      try:
        return original(*args, **kwargs)
      finally:
        evals.append(time.perf_counter() - t)
    setattr(host, name, timed)
  shutil.rmtree(workdir, ignore_errors=True)
  log = io.StringIO()
  try:
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(log):
      if hasattr(runner, "LaunchOptions"):
        runner.train([runner.RunSpec(config, dataset, workdir, dyn_dir)],
                     runner.LaunchOptions(build_missing="random", build_steps=build_steps))
      else:                      # an older tree: runner.train_run, or runner.train
        train_run = getattr(runner, "train_run", None) or runner.train
        train_run(config, dataset, workdir, dynamics_dir=dyn_dir, build_missing="random",
                  build_steps=build_steps)
    seconds = time.perf_counter() - t0
  finally:
    if original is not None:
      setattr(host, name, original)
    with open(log_path, "w") as f:
      f.write(log.getvalue())
  shutil.rmtree(workdir, ignore_errors=True)
  compiled = re.findall(r"Compiled .*? in ([\d.]+) s", log.getvalue())
  return (seconds, sum(map(float, compiled)) if compiled else float("nan"),
          sum(evals) if original is not None else float("nan"))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default=None, help="also write the output to this file")
  parser.add_argument("--steps", default="5,50", help="steps_per_epoch settings, comma-separated")
  parser.add_argument("--epochs", default="20,520;10,110",
                      help="N1,N2: the two launches' epoch counts; one pair for every --steps "
                           "setting, or one per setting separated by ';'")
  parser.add_argument("--seeds", type=int, default=2)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--dataset", default="hopper-random")
  parser.add_argument("--build_steps", type=int, default=5000,
                      help="steps of the collector's build when the dataset is missing")
  parser.add_argument("--scratch", default=None,
                      help="workdirs, dynamics, compilation cache, logs (default: a temporary "
                           "folder, removed at the end)")
  args = parser.parse_args()
  steps_list = [int(x) for x in args.steps.split(",")]
  pairs = [tuple(int(x) for x in p.split(",")) for p in args.epochs.split(";")]
  pairs = pairs * len(steps_list) if len(pairs) == 1 else pairs
  if len(pairs) != len(steps_list) or any(len(p) != 2 or not 0 < p[0] < p[1] for p in pairs):
    parser.error("--epochs: N1,N2 with 0 < N1 < N2, once or once per --steps value (';')")
  scratch = args.scratch or tempfile.mkdtemp(prefix="bench_loop_")
  os.makedirs(scratch, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", os.path.join(scratch, "jax_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

  say = _Record(args.out)
  root = os.path.dirname(os.path.dirname(os.path.abspath(mombo_jax.__file__)))
  t_start = time.time()
  with contextlib.redirect_stdout(io.StringIO()) as header:
    common.print_header("bench_loop")
  say(f"# Recorded output of: python3 -m benchmarks.bench_loop --steps={args.steps} "
      f"--epochs='{args.epochs}' --seeds={args.seeds} --repeats={args.repeats}")
  for line in header.getvalue().splitlines():
    if not line.startswith("load average"):
      say(line)
  say(f"code: {root} at {tree_version(root)} (mombo_jax imported from {mombo_jax.__file__})")
  say(f"load average (1/5/15 min) at start: {loadavg()}  -- a shared {os.cpu_count()}-core "
      "machine: other jobs may run, timings are noisy")
  say(f"setup: {args.dataset}, mombo, preset tiny, {args.seeds} seeds; launches of N1 and N2 "
      "epochs (eval_every = N) per steps_per_epoch: "
      + ", ".join(f"{s}: {a}, {b}" for s, (a, b) in zip(steps_list, pairs))
      + f"; {args.repeats} repeats, medians")

  dyn_dir = os.path.join(scratch, "dynamics")
  logs = os.path.join(scratch, "logs")
  os.makedirs(logs, exist_ok=True)
  make = lambda steps, n, n2: config_lib.make_config(  # noqa: E731
      args.dataset, "mombo", "tiny", steps_per_epoch=steps, num_seeds=args.seeds, epochs=n,
      eval_every=n, schedule_epochs=n2)
  rows = []
  for steps, (n1, n2) in zip(steps_list, pairs):
    tag = f"s{steps}"
    # Untimed: build the dataset (once) and the dynamics (once), fill the compilation cache for
    # both launches' programs.
    for n in (n1, n2):
      launch_seconds(make(steps, n, n2), args.dataset, os.path.join(scratch, "warm"), dyn_dir,
                     args.build_steps, os.path.join(logs, f"{tag}_warm_n{n}.log"))
    timer = device_timer(make(steps, n2, n2), args.dataset, dyn_dir, args.build_steps, n2)
    runs, device, chunk, marginal = {n1: [], n2: []}, [], [], []
    for rep in range(args.repeats):
      for n in (n1, n2):
        name = f"{tag}_n{n}_r{rep}"
        runs[n].append(launch_seconds(make(steps, n, n2), args.dataset,
                                      os.path.join(scratch, name), dyn_dir, args.build_steps,
                                      os.path.join(logs, name + ".log")))
      marginal.append(1e3 * (runs[n2][-1][0] - runs[n1][-1][0]) / (n2 - n1))
      d, c = timer()
      device.append(d)
      chunk.append(c)
    chunk = None if None in chunk else chunk
    rows.append(dict(steps=steps, n1=n1, n2=n2, device=device, chunk=chunk, marginal=marginal,
                     runs=runs))
    say(f"  steps_per_epoch={steps}: T(N1) s {_round(r[0] for r in runs[n1])}, T(N2) s "
        f"{_round(r[0] for r in runs[n2])}, marginal ms/epoch {_round(marginal)}, device ms/epoch "
        f"{_round(device)}, host overhead ms/epoch "
        f"{_round(m - d for m, d in zip(marginal, device))}"
        + (f", chunk ms/epoch {_round(chunk)}" if chunk else ""))

  say()
  say(f"## Host overhead per epoch ({args.seeds} cells; medians of {args.repeats})")
  say("| steps / epoch | N1, N2 | device ms / epoch | marginal ms / epoch | "
      "host overhead ms / epoch | overhead % of device | overhead excl. eval ms / epoch | "
      "T(N1) s | T(N2) s | "
      "compile s logged (N1 / N2) | eval s (N1 / N2) | chunk ms / epoch |")
  say("|---|---|---|---|---|---|---|---|---|---|---|---|")
  med = statistics.median
  for r in rows:
    dev, marg = med(r["device"]), med(r["marginal"])
    over = med(m - d for m, d in zip(r["marginal"], r["device"]))
    # The same with each launch's evaluation time taken out (nan where it was not timed).
    n = r["n2"] - r["n1"]
    over_ex = med(1e3 * ((y[0] - y[2]) - (x[0] - x[2])) / n - d
                  for x, y, d in zip(r["runs"][r["n1"]], r["runs"][r["n2"]], r["device"]))
    a, b = r["runs"][r["n1"]], r["runs"][r["n2"]]
    chunk = f"{med(r['chunk']):.2f}" if r["chunk"] else "n/a"
    say(f"| {r['steps']} | {r['n1']}, {r['n2']} | {dev:.2f} | {marg:.2f} | {over:.2f} | "
        f"{100 * over / dev:.0f}% | {over_ex:.2f} | {med(x[0] for x in a):.2f} | "
        f"{med(x[0] for x in b):.2f} | {med(x[1] for x in a):.2f} / {med(x[1] for x in b):.2f} | "
        f"{med(x[2] for x in a):.2f} / {med(x[2] for x in b):.2f} | "
        f"{chunk} |")
  say()
  say("device: the compiled epoch called N2 times back to back; marginal: (T(N2) - T(N1)) / "
      "(N2 - N1) of one-run launches; host overhead: median over the repeats of "
      "marginal - "
      "device of the same repeat (each repeat: launch N1, launch N2, device timing), % of the "
      "median device time; excl. eval: the same with each launch's evaluation time (eval s) "
      "taken out of its T. chunk: one call of make_cells_chunk running N2 epochs (n/a: the "
      "tree has none).")
  say()
  say(f"load average (1/5/15 min) at end: {loadavg()}; benchmark wall time "
      f"{time.time() - t_start:.0f} s")
  if not args.scratch:
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
  main()
