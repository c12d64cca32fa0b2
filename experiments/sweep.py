r"""Run a grid of `experiments.run` launches into one folder, resumably.

  python -m experiments.sweep --envs=hopper-random,hopper-medium-replay \
      --algos=mombo,mobile,mopo --seeds=3 --out=sweeps/hopper
  python -m experiments.report sweeps/hopper          # tables and curves of what finished

Cells are (dataset, algorithm); each cell is ONE `python -m experiments.run` launch that trains all
--seeds seeds together (vmapped), in `<out>/<dataset>/<algo>[-<target>]/s<seed>x<seeds>`. The
algorithms of one dataset share one set of dynamics ensembles, `<out>/<dataset>/dynamics` (the
ensembles depend on the dataset, the seeds and the dynamics settings only, never on the algorithm),
so the first cell of a dataset trains them and the others reuse them.

Resumable: a cell whose summary.json exists is finished and skipped; any other cell is launched
again and resumes from its own checkpoints. Run the same command again after an interruption.
`<out>/sweep.json` records each cell's command, status, exit code and wall time. A failing cell
does not stop the sweep; the sweep's exit status is 1 when any cell failed (3 when seeds diverged
and nothing failed outright), 130/143 when interrupted.

Budget flags (--preset, --epochs, --steps_per_epoch, ...) are passed to every cell; anything after
`--` is passed through to `experiments.run` verbatim.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Callable, List, Optional, Sequence

from absl import app, flags

FLAGS = flags.FLAGS

# experiments.run's flags that a sweep sets for every cell (name -> absl type).
BUDGET_FLAGS = {"preset": "string", "target": "string", "epochs": "integer",
                "steps_per_epoch": "integer", "eval_every": "integer", "eval_episodes": "integer",
                "rollout_batch_size": "integer", "rollout_length": "integer",
                "dynamics_max_epochs": "integer", "real_ratio": "float"}
EXIT_DIVERGED = 3     # experiments.run's exit status when seeds diverged (the rest finished)


def define_flags():
  """Defined only when run as the program (absl flags are global; tests import entry points)."""
  flags.DEFINE_list("envs", None, "Dataset short names, e.g. hopper-random,hopper-medium-replay.")
  flags.DEFINE_list("algos", ["mombo", "mobile", "mopo"], "Algorithms.")
  flags.DEFINE_integer("seeds", 3, "Seeds per cell, trained together in one launch.")
  flags.DEFINE_integer("seed", 0, "First seed.")
  flags.DEFINE_string("out", None, "The sweep's folder (required).")
  flags.DEFINE_bool("dry_run", False, "Print the commands and exit.")
  for name, kind in BUDGET_FLAGS.items():
    getattr(flags, f"DEFINE_{kind}")(name, None, "Passed to every cell's experiments.run.")


class UserError(Exception):
  """Printed as one `error:` line."""


@dataclasses.dataclass(frozen=True)
class Cell:
  """One experiments.run launch: all seeds of one algorithm on one dataset."""
  env: str
  algo: str
  workdir: str
  dynamics_dir: str
  command: tuple

  @property
  def name(self) -> str:
    return f"{self.env} {os.path.basename(os.path.dirname(self.workdir))}"

  @property
  def finished(self) -> bool:
    return os.path.exists(os.path.join(self.workdir, "summary.json"))


def plan(envs: Sequence[str], algos: Sequence[str], seeds: int, seed: int, out: str,
         budget: dict, extra: Sequence[str] = (), python: str = sys.executable) -> List[Cell]:
  """The cells in launch order (dataset-major: a dataset's dynamics are trained by its first
  cell and reused by the rest). Every name and budget is checked first by building each cell's
  config, so a typo fails here and not hours into the sweep. budget: experiments.run flag -> value
  (None = the cell's default)."""
  from mombo_jax import config as config_lib
  if not envs:
    raise UserError("--envs is required, e.g. --envs=hopper-random,hopper-medium-replay.")
  if not out:
    raise UserError("--out is required: the folder the sweep's runs go into.")
  if seeds < 1:
    raise UserError(f"--seeds must be >= 1, got {seeds}.")
  if len(set(envs)) != len(envs) or len(set(algos)) != len(algos):
    raise UserError("--envs and --algos must not repeat a name.")
  budget = {k: v for k, v in budget.items() if v is not None}
  unknown = sorted(set(budget) - set(BUDGET_FLAGS))
  if unknown:
    raise UserError(f"Unknown budget flag(s) {unknown}; known: {sorted(BUDGET_FLAGS)}.")
  overrides = {("dyn_max_epochs" if k == "dynamics_max_epochs" else k): v
               for k, v in budget.items() if k != "preset"}
  cells = []
  for env in envs:
    for algo in algos:
      try:
        config_lib.make_config(env, algo, budget.get("preset", "paper"), seed=seed,
                               num_seeds=seeds, **overrides)
      except (ValueError, TypeError) as e:
        raise UserError(f"{env} / {algo}: {e}") from None
      target = budget.get("target", config_lib.Config.target)
      label = algo + (f"-{target}" if algo == "mombo" else "")
      workdir = os.path.join(out, env, label, f"s{seed}x{seeds}")
      dynamics_dir = os.path.join(out, env, "dynamics")
      command = [python, "-m", "experiments.run", f"--env={env}", f"--algo={algo}",
                 f"--seeds={seeds}", f"--seed={seed}", f"--workdir={workdir}",
                 f"--dynamics_dir={dynamics_dir}"]
      command += [f"--{k}={v}" for k, v in budget.items()]
      command += list(extra)
      cells.append(Cell(env, algo, workdir, dynamics_dir, tuple(command)))
  return cells


class Launcher:
  """Runs cells as child processes (output streamed through) and forwards SIGINT / SIGTERM.

  The child runs in its own session, so a terminal's Ctrl-C reaches the sweep only, and the sweep
  passes it on exactly once: the child checkpoints, prints its resume line and exits 130 / 143
  (a second signal would make experiments.run abort at once). After a signal no further cell is
  launched.
  """

  def __init__(self):
    self.child: Optional[subprocess.Popen] = None
    self.signum: Optional[int] = None

  def install(self):
    signal.signal(signal.SIGINT, self._handle)
    signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    del frame
    if self.signum is None and self.child is not None and self.child.poll() is None:
      self.child.send_signal(signum)
    self.signum = self.signum or signum

  def __call__(self, cell: Cell) -> int:
    if self.signum is not None:
      return -self.signum
    self.child = subprocess.Popen(list(cell.command), start_new_session=True)
    try:
      return self.child.wait()
    finally:
      self.child = None


def run_sweep(cells: Sequence[Cell], out: str, runner: Optional[Callable[[Cell], int]] = None,
              log: Callable[[str], None] = print) -> dict:
  """Launches the unfinished cells in order; returns and writes the record <out>/sweep.json:
  {"cells": [{env, algo, workdir, command, status, exit_code, seconds}], "status"}.
  status per cell: finished | skipped (finished before) | diverged | failed | interrupted |
  not started (after an interruption). runner(cell) -> exit status (default: a Launcher)."""
  runner = runner or Launcher()
  os.makedirs(out, exist_ok=True)
  record_path = os.path.join(out, "sweep.json")
  records = []
  status = "finished"
  for i, cell in enumerate(cells, 1):
    entry = dict(env=cell.env, algo=cell.algo, workdir=cell.workdir,
                 command=" ".join(shlex.quote(c) for c in cell.command))
    records.append(entry)
    if cell.finished:
      entry.update(status="skipped", exit_code=None, seconds=0.0)
      log(f"[sweep {i}/{len(cells)}] {cell.name}: finished before, skipped ({cell.workdir})")
      continue
    if status == "interrupted":
      entry.update(status="not started", exit_code=None, seconds=0.0)
      continue
    log(f"[sweep {i}/{len(cells)}] {cell.name}: {entry['command']}")
    t0 = time.time()
    code = runner(cell)
    entry.update(exit_code=code, seconds=round(time.time() - t0, 1))
    if code == 0 and cell.finished:
      entry["status"] = "finished"
    elif code == EXIT_DIVERGED:
      entry["status"] = "diverged"
      status = "diverged" if status == "finished" else status
    elif code in (128 + signal.SIGINT, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM):
      entry["status"] = "interrupted"
      status = "interrupted"
    else:
      entry["status"] = "failed"
      status = "failed" if status != "interrupted" else status
    log(f"[sweep {i}/{len(cells)}] {cell.name}: {entry['status']} (exit {code}, "
        f"{entry['seconds']:.0f} s)")
    _write(record_path, dict(cells=records, status="running"))
  result = dict(cells=records, status=status)
  _write(record_path, result)
  return result


def _write(path: str, obj: dict):
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)


def exit_code(result: dict) -> int:
  return {"finished": 0, "diverged": EXIT_DIVERGED, "failed": 1,
          "interrupted": 128 + signal.SIGINT}[result["status"]]


def main(argv):
  extra = argv[1:]   # after `--`: passed through to experiments.run
  try:
    cells = plan(FLAGS.envs, FLAGS.algos, FLAGS.seeds, FLAGS.seed, FLAGS.out,
                 {k: getattr(FLAGS, k) for k in BUDGET_FLAGS}, extra)
  except UserError as e:
    sys.exit(f"error: {e}")
  if FLAGS.dry_run:
    for cell in cells:
      print(("# finished: " if cell.finished else "") + " ".join(map(shlex.quote, cell.command)))
    return
  launcher = Launcher()
  launcher.install()
  result = run_sweep(cells, FLAGS.out, runner=launcher)
  counts = {}
  for entry in result["cells"]:
    counts[entry["status"]] = counts.get(entry["status"], 0) + 1
  print(f"sweep {result['status']}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + f"; record in {os.path.join(FLAGS.out, 'sweep.json')}")
  if result["status"] == "interrupted":
    print("Resume with:\n  " + " ".join(shlex.quote(a) for a in [sys.executable, "-m",
                                                                  "experiments.sweep"] + sys.argv[1:]),
          file=sys.stderr)
  sys.exit(exit_code(result))


if __name__ == "__main__":
  define_flags()
  app.run(main)
