"""Part d of the device record: learning. MOMBO (`elite_spread`, the paper's), MOBILE and MOPO on
the kit's dataset, and MOMBO `elite_spread` at --moments=lowrank (issue #49: the next state's
correlations carried through the critic, docs/moment_matching.md; the paper's numbers stand
beside it as MOMBO's), 4 seeds each in one program per algorithm, each with its reference's settings
(mombo_jax/settings/references.py), side by side on the one GPU, for the epochs the record's
plan sizes up front (benchmarks/device/sizing.py, from the newest record's rates: the same number
for the three; the paper preset keeps the actor's schedule at the paper's 3000
epochs, so the run is a prefix of the paper's), evaluated every 10 epochs on 10 episodes (all
three alike: MOBILE's and MOPO's cadence here; MOMBO's reference evaluates every 50). Writes
d_learning.md (final / AULC / per seed beside the paper's Table 1, and the curves as numbers) and
d_curves.png.

The dataset: hopper-medium-replay, chosen by the paper's Table 1 as the issue asks (where MOMBO's
lead over both baselines is largest against their standard deviations, among the datasets
`prepare` can build on 2 cores in about an hour). The margin is (MOMBO's mean - a baseline's) /
sqrt(MOMBO's std^2 + the baseline's std^2), taken against the nearer baseline. A run of 100-300
epochs is a prefix of the paper's 3000, so the area under the learning curve (AULC) is the
metric it can speak to; the final score is at 3M steps. AULC margins: walker2d-medium 2.94,
walker2d-random 1.87, hopper-medium 1.78, walker2d-medium-expert 1.34, halfcheetah-random 1.22,
hopper-medium-replay 1.12 (87.3 +- 2.0 against MOPO's 81.7 +- 4.6 and MOBILE's 78.7 +- 4.0), the
others under 0.7; final margins: halfcheetah-random 1.54, halfcheetah-medium-expert 1.41, the rest
under 0.6. Every dataset above hopper-medium-replay is a 1M-transition (or 2M) recipe: the
collector's Minari files take ~160 bytes per hopper transition (measured: 3.19 MB for 20,000
steps of hopper-medium), so 1M rows are ~160 MB (xz: ~100 MB), past the 64 MiB a `run` call
carries, and walker2d-medium-expert needs an expert SAC run of hours. medium-replay is the SAC
run's replay buffer up to its medium point (~220k hopper transitions, ~35 MB), and of the three
medium-replay datasets hopper's has the largest margin by AULC (walker2d's 0.13, halfcheetah's
0.05; by the final score none has a lead: -0.18, -0.22, -0.02). Its build was measured: 49 min on
the 2-core Xeon, loaded (benchmarks/datasets/build_log.txt; 26 min for an earlier 200k build,
benchmarks/learning/README.md). `choose()` recomputes the choice from the paper's numbers
(mombo_jax.report.paper_results; tests/test_device_record.py checks it is prepare's dataset).

One set of dynamics ensembles (one per seed) is trained first and shared by the three, so they
differ only in their targets: capped at 30 epochs (sizing.DYN_MAX_EPOCHS), OfflineRL-Kit's
run_mobile.py default (MOBILE's reference here, and adinlab/MOMBO's on walker2d-medium), since one
shared set needs one setting and MOMBO's and MOPO's references train to convergence (~270 epochs:
66 s on the H100 for 3 seeds), which the budget cannot hold beside 100 epochs of the three.
At the part's soft deadline the launches still running are stopped with SIGTERM (they checkpoint,
and their rows so far are written), and the table and the AULCs are taken at the last epoch all
three evaluated (common_epoch): an AULC over a longer horizon is not comparable with one over a
shorter (the 2026-11-27 record ranked 210, 160 and 230 epochs against each other).
"""
import math
import os
import signal
import subprocess
import sys
import time

from benchmarks.device import kit as kit_lib, sizing

# The datasets prepare can build on 2 cores in about an hour and carry in 64 MiB (docstring).
CANDIDATES = ("hopper-medium-replay", "walker2d-medium-replay", "halfcheetah-medium-replay")
LABEL = {"mombo": "mombo-elite_spread", "mobile": "mobile", "mopo": "mopo",
         "mombo-lowrank": "mombo-elite_spread-lowrank"}
NAME = {"mombo": "MOMBO", "mobile": "MOBILE", "mopo": "MOPO", "mombo-lowrank": "MOMBO (lowrank)"}
PAPER_NAME = {"mombo-lowrank": "MOMBO"}       # whose paper numbers stand beside a launch
# Each launch's algorithm and flags beside the shared ones.
ALGO = {"mombo-lowrank": "mombo"}
FLAGS = {"mombo": ["--target=elite_spread"],
         "mombo-lowrank": ["--target=elite_spread", "--moments=lowrank"]}
TABLE_S = 30.0           # kept from the soft deadline for the table and the figure


def margin(dataset: str, metric: str = "aulc") -> float:
  """MOMBO's lead in the paper's Table 1 against the nearer of MOPO and MOBILE, in units of
  sqrt(std_MOMBO^2 + std_baseline^2)."""
  from mombo_jax.report import paper_results
  mean, std = paper_results.score(dataset, "MOMBO", metric)
  return min((mean - b[0]) / math.hypot(std, b[1])
             for b in (paper_results.score(dataset, x, metric) for x in ("MOPO", "MOBILE")))


def choose() -> str:
  """The dataset of part d: the candidate with the largest AULC margin (docstring)."""
  return max(CANDIDATES, key=margin)


def say(line=""):
  print(line, flush=True)


def launch(cmd, log_path, env):
  return subprocess.Popen(cmd, stdout=open(log_path, "w"), stderr=subprocess.STDOUT, env=env,
                          cwd=kit_lib.ROOT)


def tail(path, n=15) -> str:
  try:
    with open(path) as f:
      return "".join(f.readlines()[-n:])
  except OSError:
    return ""


def main():
  args = kit_lib.part_args(__doc__)
  t0 = time.time()
  t_end = t0 + args.soft_s
  sz = sizing.sizes(args.smoke)
  manifest, dataset = kit_lib.manifest_and_dataset(args.kit)
  epochs = args.epochs or sz.min_epochs
  preset = "tiny" if args.smoke else "paper"
  dyn_epochs = 1 if args.smoke else sizing.DYN_MAX_EPOCHS
  root = os.path.join(args.work, "learning")
  dyn = os.path.join(root, dataset, "dynamics")
  py = [sys.executable, "-m"]
  small = ["--allow_small_dataset"] if manifest.get("smoke") else []
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")   # three processes, one GPU
  say(f"# Device record, part d: learning on {dataset} ({manifest.get('minari_id')}, "
      f"{manifest.get('transitions')} transitions)")
  say(f"{', '.join(NAME[a] for a in sz.algos_d)}; {sz.seeds} seeds each; {epochs} epochs x "
      f"{'the preset' if args.smoke else 1000} gradient steps, preset {preset} (actor schedule: "
      f"the paper's 3000 epochs); evaluation every {sz.eval_every} epochs; one set of dynamics "
      f"({dyn_epochs} epochs at most) shared. Started "
      f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")
  t = time.time()
  os.makedirs(root, exist_ok=True)
  cmd = py + ["experiments.train_dynamics", f"--env={dataset}", f"--seeds={sz.seeds}",
              f"--workdir={dyn}", f"--preset={preset}", f"--max_epochs={dyn_epochs}"]
  with open(root + "_dynamics.log", "w") as log:
    rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                        cwd=kit_lib.ROOT).returncode
  dyn_s = time.time() - t
  say(f"dynamics: {sz.seeds} ensembles in {dyn_s:.0f} s (exit {rc})")
  if rc != 0:
    say(tail(root + "_dynamics.log"))
    raise SystemExit(1)
  workers = max(1, (os.cpu_count() or 3) // len(sz.algos_d))
  procs, workdirs = {}, {}
  t = time.time()
  for algo in sz.algos_d:
    wd = os.path.join(root, dataset, LABEL[algo], f"s0x{sz.seeds}")
    os.makedirs(wd, exist_ok=True)
    workdirs[algo] = wd
    cmd = py + ["experiments.run", f"--env={dataset}", f"--algo={ALGO.get(algo, algo)}",
                f"--seeds={sz.seeds}",
                f"--epochs={epochs}", f"--preset={preset}", f"--eval_every={sz.eval_every}",
                f"--workdir={wd}", f"--dynamics_dir={dyn}", f"--dynamics_max_epochs={dyn_epochs}",
                f"--eval_workers={workers}", "--keep_checkpoints=1"] + small + FLAGS.get(algo, [])
    procs[algo] = launch(cmd, wd + ".log", env)
  stopped = []
  while any(p.poll() is None for p in procs.values()):
    if time.time() > t_end - TABLE_S:
      for algo, p in procs.items():
        if p.poll() is None:
          p.send_signal(signal.SIGTERM)     # checkpoint, write the rows, exit 143
          stopped.append(algo)
      for p in procs.values():
        try:
          p.wait(timeout=max(t_end - time.time() - 5, 5))
        except subprocess.TimeoutExpired:
          p.kill()
          p.wait()
      break
    time.sleep(1.0)
  train_s = time.time() - t
  say(f"launches: {train_s:.0f} s" + (" side by side" if len(procs) > 1 else "")
      + (f"; stopped at the deadline: {', '.join(stopped)}" if stopped else ""))
  for algo, p in procs.items():
    if p.returncode not in (0, None) and algo not in stopped:
      log = tail(workdirs[algo] + ".log")
      say(f"\n{NAME[algo]} exited {p.returncode}; its log ends:\n```\n{log}```")
  rates = write_table(args, dataset, workdirs, epochs, train_s, dyn_s, sz)
  kit_lib.write_rates(args.work, "d", dict(rates, d_root=root, d_dataset=dataset))
  # A launch stopped at the deadline (143: it checkpointed) ended as planned: its rows count.
  sys.exit(0 if all(p.returncode == 0 or (a in stopped and p.returncode == 143)
                    for a, p in procs.items()) else 1)


def every_seed(rows, seeds) -> list:
  """The rows of `seeds` at the epochs every one of them evaluated."""
  per_seed = [{r["epoch"] for r in rows if r["seed"] == s} for s in seeds]
  epochs = set.intersection(*per_seed) if per_seed else set()
  return [r for r in rows if r["seed"] in seeds and r["epoch"] in epochs]


def common_epoch(rows_by_algo: dict, seeds) -> int:
  """The last epoch that every algorithm evaluated on every seed (0 when one has none): the table
  and the AULCs are taken there, so the three are compared over one horizon."""
  return min((max((r["epoch"] for r in every_seed(rows, seeds)), default=0)
              for rows in rows_by_algo.values()), default=0)


def write_table(args, dataset, workdirs, epochs, train_s, dyn_s, sz) -> dict:
  """d_learning.md's tables (printed: they stream into the file) and d_curves.png, at the epoch
  all three reached (common_epoch; a launch stopped early truncates the others' rows there);
  returns the rates (s per epoch of the three side by side)."""
  import numpy as np

  from mombo_jax.records import outputs
  from mombo_jax.report import paper_results
  seeds = list(range(sz.seeds))
  read = {a: outputs.read_rows(os.path.join(wd, "metrics.csv")) for a, wd in workdirs.items()}
  last = {a: max((r["epoch"] for r in rows), default=0) for a, rows in read.items()}
  common = common_epoch(read, seeds)
  curves = {}
  say(f"\n## {dataset}: normalised score at epoch {common}, the last all three evaluated on every "
      f"seed ({epochs} asked), mean +- std over {sz.seeds} seeds (ddof 0), beside the paper's "
      "Table 1 (3000 epochs, D4RL's data)")
  say("| algorithm | epochs evaluated (table at) | final | AULC | final per seed | paper final | "
      "paper AULC |")
  say("|---|---|---|---|---|---|---|")
  for algo in workdirs:
    full = every_seed(read[algo], seeds)
    rows = [r for r in full if r["epoch"] <= common]
    paper = [paper_results.score(dataset, PAPER_NAME.get(algo, NAME[algo]), m)
             for m in ("final", "aulc")]
    shown = " | ".join(f"{p[0]:.1f} +- {p[1]:.1f}" if p else "-" for p in paper)
    if not common or not rows:
      say(f"| {NAME[algo]} | {last[algo] or 'none'} | - | - | - | {shown} |")
      continue
    s = outputs.summarise(rows, seeds)
    points, table = outputs.score_table(rows, seeds)
    curves[algo] = outputs.score_table(full, seeds)
    fmt = lambda m, d: "-" if m is None else f"{m:.1f} +- {d:.1f}"  # noqa: E731
    say(f"| {NAME[algo]} | {last[algo]} ({common}: {len(points)} evaluations) | "
        f"{fmt(s['final_normalized_score_mean'], s['final_normalized_score_std'])} | "
        f"{fmt(s['aulc_mean'], s['aulc_std'])} | "
        f"{', '.join(f'{x:.1f}' for x in s['final_normalized_score'])} | {shown} |")
  say("\n## The curves: mean normalised score (and per seed) at each evaluation (past the table's "
      "epoch too)")
  say("| algorithm | epoch | mean | per seed |")
  say("|---|---|---|---|")
  for algo, (points, table) in curves.items():
    for p, row in zip(points, table):
      say(f"| {NAME[algo]} | {p} | {np.mean(row):.1f} | {', '.join(f'{x:.1f}' for x in row)} |")
  per_epoch = train_s / common if common else None
  say(f"\ntime: dynamics {dyn_s:.0f} s; the launches {train_s:.0f} s for "
      f"{epochs} epochs asked, {common} evaluated by all" + (
          f" ({per_epoch:.2f} s per epoch of them all, compilation and evaluation included)"
          if per_epoch else ""))
  if curves:
    plot(curves, dataset, os.path.join(args.out, "d_curves.png"))
  return {"d_epoch_s_side_by_side": per_epoch, "d_dynamics_s": round(dyn_s, 1),
          "d_epochs": common, "d_epochs_asked": epochs}


def plot(curves, dataset, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 4))
  for algo, (points, table) in curves.items():
    line, = ax.plot(points, table.mean(1), lw=2, label=f"{NAME[algo]} (mean of {table.shape[1]})")
    ax.plot(points, table, lw=0.6, alpha=0.4, color=line.get_color())
  ax.set(xlabel="epoch (1000 gradient steps)", ylabel="normalised score", title=dataset)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


if __name__ == "__main__":
  main()
