"""A grid of `experiments.run` launches in one folder, resumably (experiments.sweep is its CLI).

This module owns the sweep's cells and their launch: `plan` turns datasets x algorithms into Cells
(one `python -m experiments.run` command each, all seeds of a cell in one launch, the algorithms of
a dataset sharing `<out>/<dataset>/dynamics`), `Launcher` runs a cell as a child process and
forwards SIGINT / SIGTERM to it, and `run_sweep` launches the unfinished cells in order and keeps
the record `<out>/sweep.json`. Where the cells' folders go is mombo_jax.workdir's.
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

from mombo_jax.errors import UserError
from mombo_jax.launch import EXIT_DIVERGED

# experiments.run's flags that a sweep sets for every cell (name -> absl type).
BUDGET_FLAGS = {"preset": "string", "target": "string", "epochs": "integer",
                "steps_per_epoch": "integer", "eval_every": "integer", "eval_episodes": "integer",
                "rollout_batch_size": "integer", "rollout_length": "integer",
                "dynamics_max_epochs": "integer", "real_ratio": "float"}


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
  def command_line(self) -> str:
    """The command as one shell line."""
    return " ".join(shlex.quote(c) for c in self.command)

  @property
  def finished(self) -> bool:
    from mombo_jax.workdir import Workdir
    return Workdir(self.workdir).finished()


def plan(envs: Sequence[str], algos: Sequence[str], seeds: int, seed: int, out: str,
         budget: dict, extra: Sequence[str] = (), python: str = sys.executable) -> List[Cell]:
  """The cells in launch order (dataset-major: a dataset's dynamics are trained by its first
  cell and reused by the rest). Every name and budget is checked first by building each cell's
  config, so a typo fails here and not hours into the sweep. budget: experiments.run flag -> value
  (None = the cell's default)."""
  from mombo_jax import config as config_lib, workdir as workdir_lib
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
      workdir = workdir_lib.run_dir(out, env, algo, target, seed, seeds)
      dynamics_dir = workdir_lib.grid_dynamics_dir(out, env)
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
    entry = dict(env=cell.env, algo=cell.algo, workdir=cell.workdir, command=cell.command_line)
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
  # Through a temporary file: an interrupted sweep never leaves a half-written record.
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)


def exit_code(result: dict) -> int:
  """The sweep's exit status: 0, EXIT_DIVERGED (seeds diverged, nothing failed), 1 (a cell
  failed) or 130 (interrupted)."""
  return {"finished": 0, "diverged": EXIT_DIVERGED, "failed": 1,
          "interrupted": 128 + signal.SIGINT}[result["status"]]


def summary(result: dict, out: str) -> str:
  """One line: the sweep's status, how many cells ended in each status, where the record is."""
  counts = {}
  for entry in result["cells"]:
    counts[entry["status"]] = counts.get(entry["status"], 0) + 1
  return (f"sweep {result['status']}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
          + f"; record in {os.path.join(out, 'sweep.json')}")
