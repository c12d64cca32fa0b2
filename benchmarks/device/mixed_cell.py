"""Part m of the device record: the mixed cell. MOMBO (`elite_spread`), MOBILE and MOPO at the
paper's mixed-dataset settings (its appendix table results_mixed: actor 5x1024, critics 3x256,
rollout length 5, beta 2.0, 10 retained epochs; mombo_jax/settings/config.py `_MIXED`), 4 seeds
each in one program per algorithm, side by side on the one GPU, for a few epochs: the rate that
sizes the paper's mixed table (benchmarks/device/sizing.py projects it between two unmeasured
bounds until a record holds this rate). Writes m_mixed.md: each algorithm's epochs, the seconds
per epoch of the three side by side (compilation excluded) and the mixed table projected from it.

The data is the kit's dataset (part d's, hopper-medium-replay) run with the settings of
`hopper-random-medium-50pct` (`--env` picks the settings, `--dataset` the rows): an epoch's cost
does not depend on which rows it samples, and a 1M-row mixed dataset is past what a `run` call
carries (learning.py's docstring). So this part measures time, not learning; its scores are not
the mixed table's and m_mixed.md prints none. The dynamics are part d's when it ran in this --work
(the same 30-epoch cap, shared), else trained here with that cap.
"""
import os
import re
import signal
import subprocess
import sys
import time

from benchmarks.device import kit as kit_lib, learning, sizing

SETTINGS = "hopper-random-medium-50pct"    # the mixed settings (one for all mixed datasets)
CELLS = 4                                  # seeds per algorithm: the paper's
COMPILED = re.compile(r"Compiled the epoch in ([\d.]+) s")


def main():
  args = kit_lib.part_args(__doc__)
  t_end = time.time() + args.soft_s
  sz = sizing.sizes(args.smoke)
  manifest, dataset = kit_lib.manifest_and_dataset(args.kit)
  epochs = args.epochs or (2 if args.smoke else sizing.MIXED_CELL_EPOCHS)
  preset = "tiny" if args.smoke else "paper"
  dyn_epochs = 1 if args.smoke else sizing.DYN_MAX_EPOCHS
  seeds = sz.seeds
  root = os.path.join(args.work, "mixed_cell")
  dyn = os.path.join(args.work, "learning", dataset, "dynamics")     # part d's, when it ran
  env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
  small = ["--allow_small_dataset"] if manifest.get("smoke") else []
  say = learning.say
  say(f"# Device record, part m: the mixed cell, {SETTINGS}'s settings on the kit's {dataset} "
      f"(time only: no score of this part is the mixed table's)")
  say(f"{', '.join(learning.NAME[a] for a in sz.algos_d)}; {seeds} seeds each; {epochs} epochs "
      f"x {'the preset' if args.smoke else 1000} gradient steps, preset {preset}; dynamics "
      f"{'of part d' if os.path.isdir(dyn) else 'trained here'} ({dyn_epochs} epochs at most), "
      f"shared. Started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")
  os.makedirs(root, exist_ok=True)
  t = time.time()
  if not os.path.isdir(dyn):          # as part d trains them (learning.py)
    cmd = [sys.executable, "-m", "experiments.train_dynamics", f"--env={dataset}",
           f"--seeds={seeds}", f"--workdir={dyn}", f"--preset={preset}",
           f"--max_epochs={dyn_epochs}"]
    with open(root + "_dynamics.log", "w") as log:
      rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                          cwd=kit_lib.ROOT).returncode
    say(f"dynamics: {seeds} ensembles in {time.time() - t:.0f} s (exit {rc})")
    if rc != 0:
      say(learning.tail(root + "_dynamics.log"))
      raise SystemExit(1)
  procs, logs = {}, {}
  t = time.time()
  for algo in sz.algos_d:
    wd = os.path.join(root, learning.LABEL[algo])
    logs[algo] = wd + ".log"
    cmd = [sys.executable, "-m", "experiments.run", f"--env={SETTINGS}", f"--dataset={dataset}",
           f"--algo={algo}", f"--seeds={seeds}", f"--epochs={epochs}", f"--preset={preset}",
           f"--eval_every={epochs}", "--eval_episodes=1", f"--workdir={wd}",
           f"--dynamics_dir={dyn}", f"--dynamics_max_epochs={dyn_epochs}",
           "--keep_checkpoints=1"] + small
    if algo == "mombo":
      cmd.append("--target=elite_spread")
    procs[algo] = learning.launch(cmd, logs[algo], env)
  stopped = []
  while any(p.poll() is None for p in procs.values()):
    if time.time() > t_end - 5:
      for algo, p in procs.items():
        if p.poll() is None:
          p.send_signal(signal.SIGTERM)
          stopped.append(algo)
      for p in procs.values():
        try:
          p.wait(timeout=5)
        except subprocess.TimeoutExpired:
          p.kill()
          p.wait()
      break
    time.sleep(1.0)
  wall = time.time() - t
  rates = write_table(args, logs, procs, stopped, wall, epochs, seeds)
  kit_lib.write_rates(args.work, "m", rates)
  sys.exit(0 if all(p.returncode == 0 or a in stopped for a, p in procs.items()) else 1)


def write_table(args, logs, procs, stopped, wall, epochs, seeds) -> dict:
  """m_mixed.md's table (printed into it): per algorithm its exit, compile seconds and epochs;
  the side-by-side epoch (the launches' wall less the longest compilation, over the epochs all
  finished) and the paper's mixed table projected from it. Returns the rates."""
  from mombo_jax.records import outputs
  say = learning.say
  say("\n| algorithm | exit | compiled in (s) | epochs done |")
  say("|---|---|---:|---:|")
  done, compiled = {}, {}
  for algo, path in logs.items():
    wd = path[:-len(".log")]
    rows = outputs.read_rows(os.path.join(wd, "metrics.csv")) if os.path.exists(
        os.path.join(wd, "metrics.csv")) else []
    done[algo] = max((r["epoch"] for r in rows), default=0)
    found = COMPILED.findall(learning.tail(path, 400))
    compiled[algo] = float(found[-1]) if found else None
    say(f"| {learning.NAME[algo]} | {procs[algo].returncode}"
        f"{' (stopped at the deadline)' if algo in stopped else ''} | "
        f"{compiled[algo] if compiled[algo] is not None else '-'} | {done[algo]} |")
  common = min(done.values(), default=0)
  per_epoch = None
  if common and all(c is not None for c in compiled.values()):
    per_epoch = max(wall - max(compiled.values()), 0.0) / common
  if per_epoch:
    low = sizing.mixed_table_hours(sizing.PAPER_MIXED_RATIO)
    high = sizing.mixed_table_hours(sizing.mixed_macs_ratio())
    hours = per_epoch * sizing.MIXED_CELLS / seeds * sizing.MIXED_EPOCHS / 3600
    say(f"\nside by side: {per_epoch:.2f} s per epoch of the three at {seeds} cells each "
        f"({wall:.0f} s wall less the longest compilation, over the {common} epochs all did; "
        "start-up, dynamics and the one evaluation included). The paper's mixed table "
        f"({sizing.MIXED_CELLS // 4} datasets x 4 seeds x {sizing.MIXED_EPOCHS} epochs, three "
        f"algorithms) as {sizing.MIXED_CELLS // seeds} such launches in turn: {hours:.1f} "
        f"device-hours (sizing.py's unmeasured bounds: {low:.1f} to {high:.0f}).")
  else:
    say(f"\nno epoch done by all three in {wall:.0f} s: no rate (see the launches' logs).")
    for algo, path in logs.items():
      if procs[algo].returncode not in (0, None) and algo not in stopped:
        say(f"\n{learning.NAME[algo]}'s log ends:\n```\n{learning.tail(path)}```")
  return {"m_epoch_s_side_by_side": per_epoch, "m_cells": seeds, "m_epochs": common,
          "m_compile_s": compiled, "m_settings": SETTINGS}


if __name__ == "__main__":
  main()
