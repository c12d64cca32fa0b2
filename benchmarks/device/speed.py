"""Part c of the device record: speed at the paper's settings, measured in this order (what is most
worth having first; each row is printed, and its rate saved, as soon as it is measured, and a row
that would not end before the part's soft deadline is named as skipped):

1. whole epochs (50,000 x 5 rollout + 1000 gradient steps per cell, walker2d-medium dims) of
   MOMBO `elite_spread`, MOBILE and MOPO at 16 cells, then at 1, 48 and 4 cells (the goals
   first: 16 against 1 cell, 48 cells for the paper's table), each count its own table: compile s,
   s per epoch (best of 2 after a warm-up), per cell, memory (XLA's arguments + temporaries). Each
   program is the runner's own device call, cells_program.make_cells_chunk, called with one epoch
   and its metrics pulled to the host as launch.Launch.step does; cells vmapped (the GPU's layout).
   MOMBO's program at 1, 16 and 48 cells (sizing.PROFILE_CELLS) is then traced for one more epoch
   (jax.profiler) and the trace summarised on the spot into c_profile.md
   (benchmarks/device/trace_summary.py: per phase, kernels per gradient step, the top kernels); then
   the goals (sizing.GOALS) against what was measured;
2. the runner's chunk length (program.CALL_SECONDS, 3 s): MOPO at 16 cells, the epochs of one
   3-second call against a call of CHUNK_LONG epochs (one compile serves both: n is traced);
3. the evaluation's share of wall time at 16 cells: one evaluation (16 cells x 10 episodes x 1000
   steps, evaluate.Evaluator over env_pool's workers as the runner sizes them; benchmarks/bench_eval
   .evaluation_s, its steps scaled to 1000) against each algorithm's eval_every epochs of 16-cell
   training from (1), in series and overlapped as Launch.train_epochs overlaps them (a computed
   share: the parts are measured, the overlapped launch is not timed whole);
4. 1000 gradient steps of each algorithm, one cell (benchmarks/bench_scale.bench_steps).
2., 3. and 4. (measured on 2026-11-27, or not needed by the goals) only with time left.

Programs come from benchmarks/bench_scale (seeds_program: C seeds of walker2d-medium, random data,
paper networks). The part's rates go to the record's record.json ("epoch_s", ...), from which part
d is sized.
"""
import functools
import os
import time

from benchmarks.device import kit as kit_lib, sizing

CHUNK_LONG = 20          # the longer chunk: epochs per call (a span to the next evaluation)


def max_epochs(smoke: bool) -> int:
  """The programs' max_epochs (part of the compiled program: part v passes the same, so that its
  baseline is part c's program, found in the compilation cache)."""
  return 4 if smoke else CHUNK_LONG
LABELS = {"mombo": "MOMBO elite_spread", "mobile": "MOBILE (N=10)", "mopo": "MOPO"}


def say(line=""):
  print(line, flush=True)


def time_program(name, cells, sz, rng, max_epochs, then=None, repeats=2, settings=None,
                 ready=None):
  """Compile the C-cell chunk program of `name`, run one warm-up epoch, time the best of
  `repeats` one-epoch calls. Returns dict(compile_s, seconds, mem_gb); `then(run, seconds,
  compiled)` is called while the program and its state are alive (the chunk-length measurement,
  the profile). settings: Config settings over the program's (Config.replace); ready(): called
  between the compile and the first run (part v: wait for its turn on the device)."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from benchmarks import bench_scale
  from mombo_jax.core import cells_program, dynamics, rewrites, train
  from mombo_jax.settings import environment
  program = bench_scale.seeds_program(name, cells, sz.rollout, sz.steps, sz.real_rows, rng)
  if settings:
    program.config = program.config.replace(**settings)
  config = program.config
  keys = jax.random.split(jax.random.PRNGKey(0), cells)
  dyn = jax.vmap(lambda k: dynamics.init_state(k, program.obs_dim, program.act_dim, config))(keys)
  first = jax.tree.map(lambda x: x[0], program.real)
  holder = {"state": train.init_cells(keys, config, first, dyn), "epoch": 0}
  del dyn
  real = jax.tree.map(jnp.asarray, program.real)
  # The rollout's pieces and the critic's matmul as the environment asks (part v's variants set
  # MOMBO_JAX_PREDICT_ROWS / MOMBO_JAX_CRITIC_MATMUL; unset: the backend's defaults).
  choices = rewrites.choose(environment.predict_rows(), environment.critic_matmul())
  fn = cells_program.make_cells_chunk(config, cells, max_epochs, program.per_cell, choices=choices)
  t = time.perf_counter()
  compiled = fn.lower(holder["state"], real, keys, program.cells, np.int32(0),
                      np.int32(1)).compile()
  compile_s = time.perf_counter() - t
  mem = compiled.memory_analysis()
  mem_gb = ((mem.argument_size_in_bytes + mem.temp_size_in_bytes) / 2**30 if mem is not None
            else float("nan"))

  def run(n):
    t = time.perf_counter()
    holder["state"], metrics = compiled(holder["state"], real, keys, program.cells,
                                        np.int32(holder["epoch"]), np.int32(n))
    jax.device_get(metrics)           # the runner's one pull per call
    holder["epoch"] += n
    return time.perf_counter() - t

  if ready is not None:
    ready()
  run(1)
  seconds = min(run(1) for _ in range(repeats))
  if then is not None:
    then(run, seconds, compiled)
  return dict(compile_s=compile_s, seconds=seconds, mem_gb=mem_gb)


def main():
  args = kit_lib.part_args(__doc__, {"--lean": dict(
      action="store_true", help="Leave out 2., 3. and 4. (a second compiled program, an env "
      "pool): the test suite's smoke (record --lean_smoke).")})
  t_end = time.time() + args.soft_s
  sz = sizing.sizes(args.smoke)
  # 48 cells need most of the GPU's memory (64 cells of MOMBO lcb: 71 GiB, bench_scale_gpu.txt,
  # recorded with this fraction); JAX's default preallocation stops at 75%.
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", ".95")
  import jax
  import numpy as np

  from benchmarks import bench_eval, bench_scale, common
  from mombo_jax.env import env_pool
  from mombo_jax.run import program
  from mombo_jax.settings import config as config_lib
  rng = np.random.default_rng(0)
  rates = {"epoch_s": {}, "compile_s": {}, "mem_gb": {}}
  save = lambda: kit_lib.write_rates(args.work, "c", rates)  # noqa: E731
  say(f"# Device record, part c: speed ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
  say(f"hardware: {common.cpu_name()}; devices: {jax.device_count()} x "
      f"{jax.devices()[0].device_kind} ({jax.default_backend()}); jax {jax.__version__}")
  say(f"epoch: {sz.rollout} x 5 rollout + {sz.steps} gradient steps per cell"
      + (" (SMOKE: tiny sizes)" if sz.smoke else " (the paper's)")
      + f"; soft deadline {args.soft_s:.0f} s")

  def fits(estimate_s, what) -> bool:
    if time.time() + estimate_s <= t_end:
      return True
    say(f"| {what} | skipped: ~{estimate_s:.0f} s would pass the part's deadline |")
    return False

  # 1. whole epochs, one table per cell count; after the first (16 cells): 2. and 3.
  from mombo_jax.core import cell_layout
  from mombo_jax.settings import environment
  chunk_rows = []
  chunk_at = (16, "mopo") if not sz.smoke else (sz.cells[0], sz.algos_c[-1])
  long_n = max_epochs(sz.smoke)

  def chunk_length(run, seconds, compiled):
    n3 = program.chunk_length(0, 10**9, long_n, seconds)
    for n in dict.fromkeys((n3, long_n)):
      chunk_rows.append((n, run(n) / n))

  profile_path = os.path.join(args.out, "c_profile.md")
  profiled = "mombo" if "mombo" in sz.algos_c else sz.algos_c[0]
  with open(profile_path, "w") as f:
    f.write(f"# Device record, part c: where {LABELS[profiled]}'s epoch spends its device time\n"
            f"{sz.rollout} x "
            f"5 rollout + {sz.steps} gradient steps per cell; one epoch traced by jax.profiler "
            "after the timed ones, summarised by benchmarks/device/trace_summary.py (phases: "
            "the named scopes of core/train.py and core/sac.py)\n\n")

  def profile(cells):
    def then(run, seconds, compiled):
      from benchmarks.device import trace_summary  # noqa: I001, the profile's only
      folder = os.path.join(args.work, f"trace_{cells}")
      t = time.time()
      try:
        with jax.profiler.trace(folder):
          run(1)
        summary = trace_summary.summarise(folder, compiled.as_text(), sz.steps)
      except Exception as e:  # a profiler the device lacks (CUPTI) costs the profile, not part c
        with open(profile_path, "a") as f:
          f.write(f"### {LABELS[profiled]}, {cells} cell(s): no profile ({type(e).__name__}: "
                  f"{str(e).splitlines()[0][:200] if str(e) else ''})\n\n")
        return
      with open(profile_path, "a") as f:
        f.write(trace_summary.markdown(summary, f"{LABELS[profiled]}, {cells} cell(s): "
                                      f"{seconds:.3f} s per epoch (timed, untraced)")
                + f"\n(traced and summarised in {time.time() - t:.1f} s)\n\n")
      rates.setdefault("profile", {})[str(cells)] = {
          "phases_ms": {p: round(ms, 2) for p, (ms, _) in summary["phases"].items()},
          "kernels_per_step": round(summary["per_step"], 1)}
    return then

  def epochs_table(cells):
    how = cell_layout.layout(environment.cells())
    say(f"\n## 1. Whole epochs at {cells} cell(s) in one program (cells: {how})")
    say("| algorithm | cells | compile s | s / epoch | s / epoch / cell | memory (args + temp) |")
    say("|---|---|---|---|---|---|")
    for name in sz.algos_c:
      profiled_here = name == profiled and cells in sz.profile_cells
      estimate = (sizing.COMPILE_S + (4 + 4 * profiled_here) * sizing.epoch_s(name, cells, rates)
                  + 10 * profiled_here if not sz.smoke else 5.0)
      if not fits(estimate, f"{LABELS[name]} | {cells}"):
        continue
      try:
        then = (profile(cells) if name == profiled and cells in sz.profile_cells else None)
        t = time_program(name, cells, sz, rng, long_n, then, repeats=1 if cells >= 48 else 2)
      except Exception as e:  # past the device's memory: named, and the table goes on
        if not bench_scale._out_of_memory(e):
          raise
        say(f"| {LABELS[name]} | {cells} | out of device memory: {str(e).splitlines()[0][:90]} |"
            " | | |")
        continue
      say(f"| {LABELS[name]} | {cells} | {t['compile_s']:.1f} | {t['seconds']:.3f} | "
          f"{t['seconds'] / cells:.4f} | {t['mem_gb']:.2f} GiB |")
      for key, value in (("epoch_s", t["seconds"]), ("compile_s", t["compile_s"]),
                         ("mem_gb", t["mem_gb"])):
        rates[key].setdefault(name, {})[str(cells)] = round(value, 4)
      save()

  def chunk_table():
    if not chunk_rows:
      return
    cells, name = chunk_at
    say(f"\n## 2. The runner's chunk length: {LABELS[name]}, {cells} cells, one call of n epochs "
        f"(program.CALL_SECONDS = {program.CALL_SECONDS:g} s gives n = {chunk_rows[0][0]})")
    say("| epochs per call | s / epoch | x the longest call's |")
    say("|---|---|---|")
    for n, per in chunk_rows:
      say(f"| {n} | {per:.4f} | {per / chunk_rows[-1][1]:.3f} |")
    rates["chunk_s_per_epoch"] = {str(n): round(per, 5) for n, per in chunk_rows}
    save()

  def evaluation_share(cells):
    trained = {n: rates["epoch_s"].get(n, {}).get(str(cells)) for n in sz.algos_c}
    if not any(trained.values()) or not fits(2 * sizing.EVAL_S + 15 if not sz.smoke else 5,
                                             f"evaluation at {cells} cells"):
      return
    config = config_lib.make_config("hopper-medium-replay", "mopo")
    episodes = bench_eval.EPISODES
    workers = env_pool.auto_workers(cells * episodes)
    start, reset, per_step = bench_eval.evaluation_s(config, cells, "hopper", workers,
                                                     sz.eval_steps, 1)
    one = reset + per_step * bench_eval.HORIZON
    rates["eval_s"] = {str(cells): round(one, 2)}
    say(f"\n## 3. The evaluation's share of wall time at {cells} cells")
    say(f"one evaluation, {cells} cells x {episodes} episodes x {bench_eval.HORIZON} steps of "
        f"hopper over {workers} worker(s): {one:.2f} s ({sz.eval_steps} steps timed, scaled; "
        f"pool start {start:.2f} s, once per launch)")
    say("| algorithm | eval_every (its reference's) | training between evaluations s | share in "
        "series | share overlapped (Launch.train_epochs) |")
    say("|---|---|---|---|---|")
    for name, per in trained.items():
      if not per:
        continue
      every = config_lib.make_config("hopper-medium-replay", name).evaluation.eval_every
      span = every * per
      left = max(0.0, one - span)
      say(f"| {LABELS[name]} | {every} | {span:.1f} | {one / (one + span):.3f} | "
          f"{left / (span + left):.3f} |")
    save()

  for cells in sz.cells:
    epochs_table(cells)
  goals(rates, sz)
  # 2. and 3. with what is left: one more 16-cell program of MOPO for the chunk lengths.
  cells, name = chunk_at
  if not args.lean and fits(sizing.COMPILE_S + 25 * sizing.epoch_s(name, cells, rates)
                            if not sz.smoke else 5.0, f"chunk length: {LABELS[name]} | {cells}"):
    time_program(name, cells, sz, rng, long_n, chunk_length)
    chunk_table()
  if not args.lean:
    evaluation_share(sz.cells[0])

  # 4. 1000 gradient steps of each algorithm (bench_scale's step table, these algorithms only).
  kinds = {"mopo": "SAC = MOPO's step", "mombo": "MOMBO elite_spread", "mobile": "MOBILE"}
  keep = [t for t in bench_scale.STEP_TYPES
          if any(t[0].startswith(kinds[n]) for n in sz.algos_c)]
  if args.lean:
    say("\n## Gradient steps: not timed (--lean)")
  elif fits(len(keep) * (10 if not sz.smoke else 25), f"{sz.scan_steps} gradient steps"):
    bench_scale.STEP_TYPES[:] = keep
    common.matmul_gflops = functools.partial(common.matmul_gflops, seconds=1.0)
    steps_args = type("Args", (), dict(scan_steps=sz.scan_steps, repeats=1))
    bench_scale.bench_steps(steps_args, rng, ["default"])
  say(f"\npart c ended with {max(t_end - time.time(), 0):.0f} s of its soft deadline left; load "
      f"{os.getloadavg()[0]:.1f}")
  save()


def goals(rates, sz):
  """The speed goals of issue #43 (sizing.GOALS) against this part's epochs."""
  seen = rates["epoch_s"]
  say("\n## The goals (issue #43, one H100) against the epochs above")
  say("| goal | measured | met |")
  say("|---|---|---|")
  lo, hi = sz.cells[min(1, len(sz.cells) - 1)], sz.cells[0]
  for name in sz.algos_c:
    a, b = seen.get(name, {}).get(str(lo)), seen.get(name, {}).get(str(hi))
    ratio = b / a if a and b else None
    say(f"| {LABELS[name]}: {hi}-cell epoch <= {sizing.GOALS['ratio_16_1']:g}x its {lo}-cell | "
        + (f"{ratio:.2f}x ({b:.3f} / {a:.3f} s)" if ratio else "not measured") + " | "
        + ("-" if ratio is None else "yes" if ratio <= sizing.GOALS["ratio_16_1"] else "NO") + " |")
  m = seen.get("mombo", {}).get(str(hi))
  say(f"| MOMBO elite_spread at {hi} cells <= {sizing.GOALS['mombo_16_s']:g} s | "
      + (f"{m:.3f} s" if m else "not measured") + " | "
      + ("-" if not m else "yes" if m <= sizing.GOALS["mombo_16_s"] else "NO") + " |")
  top = max(sz.cells)
  at = {n: seen.get(n, {}).get(str(top)) for n in sz.algos_c}
  if all(at.values()) and set(at) == set(sizing.ALGOS):
    hours = sizing.table_hours(at, top)
    say(f"| the paper's D4RL table (12 x 4 seeds x 3000 epochs, three algorithms) from the "
        f"{top}-cell epochs <= {sizing.GOALS['table_hours']:g} device-hours | {hours:.2f} h | "
        + ("yes" if hours <= sizing.GOALS["table_hours"] else "NO") + " |")
    rates["table_hours"] = round(hours, 2)
  else:
    say(f"| the paper's D4RL table <= {sizing.GOALS['table_hours']:g} device-hours from "
        f"{top}-cell epochs | not every algorithm measured at {top} cells | - |")


if __name__ == "__main__":
  main()
