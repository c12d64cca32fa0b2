"""A grid of `experiments.run` launches in one folder, resumably (experiments.sweep is its CLI).

This module owns the sweep's cells and their launch: `plan` turns datasets x algorithms into
SweepCells (one `python -m experiments.run` command each: not train.Cell, one seed's cell of a
compiled program; all seeds of a cell in one launch, the algorithms of
a dataset sharing an ensemble in `<out>/<dataset>/dynamics` where their dynamics settings agree;
`dynamics_plan` says which share and why), `check_cells` refuses cells whose folder holds a
run of another setup than asked (naming the fields), `Launcher` runs a cell as a child process
and forwards SIGINT / SIGTERM to it, and `run_sweep` launches the unfinished cells in order and
keeps the record `<out>/sweep.json` (each cell's status and its history over every sweep that
touched it). Where the cells' folders go is mombo_jax.records.workdir's.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

from mombo_jax.core import algorithms
from mombo_jax.dynamics.reuse import dynamics_path
from mombo_jax.errors import UserError
from mombo_jax.records import workdir as workdir_lib
from mombo_jax.records.workdir import HARMLESS, Workdir
from mombo_jax.run.console import EXIT_DIVERGED
from mombo_jax.run.sweep_dynamics import sharing_plan
from mombo_jax.run.sweep_record import (
  SEVERITY,
  finished_status,
  history_of,
  now,
  read_record,
  signal_of,
)
from mombo_jax.settings import config as config_lib
from mombo_jax.storage import atomic, locks

# experiments.run's flags that a sweep sets for every cell (name -> absl type). They make the
# cell's setup (its config.json), which the sweep checks and compares with finished cells.
BUDGET_FLAGS = {"preset": "string", "target": "string", "reference": "string", "epochs": "integer",
                "steps_per_epoch": "integer", "eval_every": "integer", "eval_episodes": "integer",
                "rollout_batch_size": "integer", "rollout_length": "integer",
                "dynamics_max_epochs": "integer", "real_ratio": "float", "beta": "float",
                "schedule_epochs": "integer"}
# experiments.run's flags a sweep passes on after `--` (name -> absl type): they change how a cell
# runs, not what it trains (its config.json).
PASSTHROUGH_FLAGS = {"keep_checkpoints": "integer", "compilation_cache": "string",
                     "build_missing": "bool", "build_steps": "integer", "download": "bool",
                     "allow_small_dataset": "bool", "allow_epochs_change": "bool", "log": "list",
                     "eval_workers": "integer"}
# experiments.run's flags a sweep sets itself, with the sweep's flag that does it.
_OWNED = {"env": "--envs", "dataset": "--envs", "datasets": "--envs", "algo": "--algos",
          "seeds": "--seeds", "seed": "--seed", "workdir": "--out", "dynamics_dir": "--out",
          "betas": "one sweep per --beta"}
# experiments.run's flags a sweep does not pass on: a cell must run to its end in one process.
_NOT_PASSED = ("stop_after", "coordinator_address", "num_processes", "process_id", "distributed",
               "init_timeout")
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclasses.dataclass(frozen=True)
class SweepCell:
  """One experiments.run launch: all seeds of one algorithm on one dataset. config: the Config
  the command trains (what its config.json must say); allow_epochs_change: `--
  --allow_epochs_change` was passed (a finished cell of fewer --epochs is continued)."""
  env: str
  algo: str
  workdir: str
  dynamics_dir: str
  command: tuple
  config: Any = dataclasses.field(default=None, compare=False, repr=False)
  allow_epochs_change: bool = False

  @property
  def name(self) -> str:
    return f"{self.env} {os.path.basename(os.path.dirname(self.workdir))}"

  @property
  def command_line(self) -> str:
    """The command as one shell line."""
    return " ".join(shlex.quote(c) for c in self.command)

  @property
  def finished(self) -> bool:
    return Workdir(self.workdir).finished()

  @property
  def dynamics_path(self) -> Optional[str]:
    """The folder of the cell's ensembles (reuse.dynamics_path: its dynamics settings name it);
    cells of one dataset with equal settings share it. None without a config."""
    return None if self.config is None else dynamics_path(self.dynamics_dir, self.config)


def check_passthrough(extra: Sequence[str]) -> Dict[str, Any]:
  """{flag: value} of the words after `--`, each a --flag of PASSTHROUGH_FLAGS with a value of its
  type; UserError (one line, naming the word and what to do) for anything else: a word, a setup
  flag (the sweep's own), a flag the sweep sets or cannot pass on, an unknown or mistyped one."""
  values = {}
  for word in extra:
    if not word.startswith("--") or word == "--":
      raise UserError(f"unexpected argument {word!r}: everything after `--` must be an "
                      "experiments.run --flag (e.g. -- --keep_checkpoints=2).")
    name, has_value, value = word[2:].partition("=")
    kind = PASSTHROUGH_FLAGS.get(name)
    if kind is None and name.startswith("no") and PASSTHROUGH_FLAGS.get(name[2:]) == "bool" \
        and not has_value:
      values[name[2:]] = False
      continue
    if name in BUDGET_FLAGS:
      raise UserError(f"{word}: pass --{name} to the sweep itself, before `--`: it sets every "
                      "cell's setup, which the sweep checks and compares with finished cells.")
    if name in _OWNED:
      raise UserError(f"{word}: the sweep sets --{name} for every cell ({_OWNED[name]}).")
    if name in _NOT_PASSED:
      raise UserError(f"{word}: a sweep does not pass --{name} on (each cell runs to its end in "
                      "one process); run that cell with experiments.run instead.")
    if kind is None:
      passed = ", ".join("--" + n for n in sorted(PASSTHROUGH_FLAGS))
      setup = ", ".join("--" + n for n in sorted(BUDGET_FLAGS))
      raise UserError(f"{word}: not a flag a sweep passes on to experiments.run; after `--` go "
                      f"only {passed} (the setup's flags go before `--`: {setup}).")
    if kind == "bool":
      if has_value and value.lower() not in _BOOL_WORDS:
        raise UserError(f"{word}: --{name} takes true or false.")
      values[name] = _BOOL_WORDS[value.lower()] if has_value else True
      continue
    if not has_value:
      raise UserError(f"{word}: give --{name} its value after '=' (--{name}=VALUE).")
    if kind == "integer":
      try:
        values[name] = int(value)
      except ValueError:
        raise UserError(f"{word}: --{name} takes an integer.") from None
    else:
      values[name] = value
  return values


def plan(envs: Sequence[str], algos: Sequence[str], seeds: int, seed: int, out: str,
         budget: dict, extra: Sequence[str] = (),
         python: str = sys.executable) -> List[SweepCell]:
  """The cells in launch order (dataset-major: a dataset's ensemble is trained by the first cell
  that needs it and reused by the later cells whose dynamics settings agree; cells of other
  settings train their own beside it, SweepCell.dynamics_path, dynamics_plan). Every name and budget
  is checked first by building each cell's config, so a typo fails here and not hours into the
  sweep; `extra` (the words after `--`) by check_passthrough. budget: experiments.run flag -> value
  (None = the cell's default). A given --beta is part of the cells' folder names
  (<algo>[-<target>]-beta<b>), so sweeps of several betas share one --out; so is a --reference other
  than the algorithm's default source (<algo>[-<target>]-<reference>; an algorithm without that
  source is refused)."""
  if not envs:
    raise UserError("`envs` is required, e.g. envs=hopper-random,hopper-medium-replay.",
                    params=("envs",))
  if not out:
    raise UserError("`out` is required: the folder the sweep's runs go into.", params=("out",))
  if seeds < 1:
    raise UserError(f"`seeds` must be >= 1, got {seeds}.", params=("seeds",))
  if len(set(envs)) != len(envs) or len(set(algos)) != len(algos):
    raise UserError("`envs` and `algos` must not repeat a name.", params=("envs", "algos"))
  budget = {k: v for k, v in budget.items() if v is not None}
  unknown = sorted(set(budget) - set(BUDGET_FLAGS))
  if unknown:
    raise UserError(f"Unknown budget flag(s) {unknown}; known: {sorted(BUDGET_FLAGS)}.")
  passed = check_passthrough(extra)
  overrides = {("dyn_max_epochs" if k == "dynamics_max_epochs" else k): v
               for k, v in budget.items() if k != "preset"}
  if "schedule_epochs" in overrides:     # as experiments.run: 0 means "span --epochs"
    overrides["schedule_epochs"] = overrides["schedule_epochs"] or None
  cells = []
  for env in envs:
    for spec in algos:
      try:   # MODULE:NAME imported (the cell's launch gets the same); a name: make_config's check
        algo = algorithms.from_spec(spec) if ":" in spec else spec
      except ValueError as e:
        raise UserError(f"`algos` {spec}: {e}", params=("algos",)) from None
      try:
        config = config_lib.make_config(env, algo, budget.get("preset", "paper"), seed=seed,
                                        num_seeds=seeds, **overrides)
      except (ValueError, TypeError) as e:
        raise UserError(f"{env} / {algo}: {e}") from None
      target = budget.get("target", config_lib.Config.target)
      workdir = workdir_lib.run_dir(out, env, algo, target, seed, seeds, budget.get("beta"),
                                    config.reference, config.agent.moments)
      dynamics_dir = workdir_lib.grid_dynamics_dir(out, env)
      command = [python, "-m", "experiments.run", f"--env={env}", f"--algo={spec}",
                 f"--seeds={seeds}", f"--seed={seed}", f"--workdir={workdir}",
                 f"--dynamics_dir={dynamics_dir}"]
      command += [f"--{k}={v}" for k, v in budget.items()]
      command += list(extra)
      cells.append(SweepCell(env, algo, workdir, dynamics_dir, tuple(command), config,
                        bool(passed.get("allow_epochs_change"))))
  return cells


def dynamics_plan(cells: Sequence[SweepCell], budget: dict) -> List[str]:
  """Lines saying, per dataset, which cells share a dynamics ensemble and why (the settings each
  ensemble follows, with their sources: --dynamics_max_epochs, the preset, the algorithm's
  reference source in mombo_jax/settings/references.py, the Config default):
  sweep_dynamics.sharing_plan of the planned cells."""
  flags = ({"dyn_max_epochs": "--dynamics_max_epochs"}
           if budget.get("dynamics_max_epochs") is not None else {})
  return sharing_plan(
      [(c.env, c.algo, c.config, c.dynamics_dir) for c in cells if c.config is not None],
      budget.get("preset") or "paper", flags)


def setup_mismatch(cell: SweepCell) -> Dict[str, tuple]:
  """{field: (recorded, asked)} where the run in cell.workdir (its config.json) differs from the
  config the cell asks for; {} when the folder holds no config.json yet or they agree."""
  wd = workdir_lib.Workdir(cell.workdir)
  if cell.config is None or not os.path.exists(wd.file(workdir_lib.CONFIG)):
    return {}
  record = wd.read_record()
  asked = workdir_lib.config_record(cell.config, cell.env)
  return {k: (record.get(k), v) for k, v in asked.items() if record.get(k) != v}


def check_cells(cells: Sequence[SweepCell]) -> Set[str]:
  """Refuses, before anything is launched, cells whose folder holds a run of another setup than
  asked (UserError, one line naming each cell and the fields that differ, recorded -> asked):
  any field for a finished cell (its results are what they are), any but the evaluation's for an
  unfinished one (experiments.run resumes it; --eval_every / --eval_episodes may change), and
  --epochs unless `-- --allow_epochs_change`. Returns the workdirs of the finished cells to
  continue to a changed --epochs (those flags passed)."""
  problems, extend = [], set()
  for cell in cells:
    differs = setup_mismatch(cell)
    if not differs:
      continue
    finished = cell.finished
    extending = "epochs" in differs and cell.allow_epochs_change
    # experiments.run resumes a run under other evaluation fields; a finished run's evaluations
    # are done, unless it is continued to more epochs.
    harmless = set(HARMLESS) if (not finished or extending) else set()
    bad = {k: v for k, v in differs.items()
           if k not in harmless and not (k == "epochs" and cell.allow_epochs_change)}
    if bad:
      problems.append((cell, finished, bad))
    elif finished:
      extend.add(cell.workdir)
  if problems:
    parts = [f"{cell.name} in {cell.workdir} ({'finished' if finished else 'unfinished'}: "
             + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(bad.items())) + ")"
             for cell, finished, bad in problems]
    only_epochs = all("epochs" in bad and set(bad) <= {"epochs"} | set(HARMLESS)
                      for _, _, bad in problems)
    raise UserError(
        f"{len(problems)} cell(s) hold a run of another setup than asked, so nothing was "
        f"launched: {'; '.join(parts)}. Ask for the setup they were run with (sweep.json has "
        "their commands), pass another `out`, or delete those cells' folders to run them again"
        + ("; or pass experiments.run's `-- --allow_epochs_change` to continue them to the new "
           "`epochs`" if only_epochs else "") + ".", params=("out", "epochs"))
  return extend


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

  def __call__(self, cell: SweepCell) -> int:
    if self.signum is not None:
      return -self.signum
    self.child = subprocess.Popen(list(cell.command), start_new_session=True)
    try:
      return self.child.wait()
    finally:
      self.child = None


def run_sweep(cells: Sequence[SweepCell], out: str,
              runner: Optional[Callable[[SweepCell], int]] = None,
              log: Callable[[str], None] = print) -> dict:
  """Launches the unfinished cells in order (after check_cells: nothing is launched when one
  holds another setup); returns and writes the record <out>/sweep.json:
  {"cells": [{env, algo, workdir, command, status, exit_code, seconds, skipped, history}],
   "status", "signal" (when interrupted), "other_cells" (cells of earlier sweeps into <out> that
   this one does not plan; kept as they were)}.

  status per cell: finished | diverged | failed | interrupted | not started (after an
  interruption); a cell finished before is not launched (skipped: true) and keeps its outcome:
  diverged when its summary.json lists diverged seeds or its last launch ended so, else
  finished. history: one {status, time, command, exit_code, seconds} per launch and one {status:
  "skipped", time, command} per sweep that found it finished, over every sweep into <out>, oldest
  first. The sweep's status is its cells' worst (interrupted > failed > diverged > finished).
  runner(cell) -> exit status (default: a Launcher). atomic.WriteError (a UserError) when <out>
  cannot be written: raised before any cell is launched."""
  runner = runner or Launcher()
  extend = check_cells(cells)
  atomic.check_writable(out)
  # One sweep per folder (sweep.json has one writer); each cell's run takes its workdir's lock.
  lock = locks.FolderLock(out, ".sweep.lock", what="sweep --out", fix=(
      "wait for that sweep to finish or stop it, or pass another --out")).acquire()
  try:
    return _run_sweep(cells, out, runner, extend, log)
  finally:
    lock.release()


def _run_sweep(cells, out, runner, extend, log):
  record_path = os.path.join(out, "sweep.json")
  old = read_record(record_path)
  earlier = {e.get("workdir"): e for e in old.get("cells", []) + old.get("other_cells", [])
             if isinstance(e, dict)}
  planned = {c.workdir for c in cells}
  others = [e for w, e in earlier.items() if w not in planned]
  records = []
  for cell in cells:
    history = history_of(earlier.get(cell.workdir, {}))
    records.append(dict(env=cell.env, algo=cell.algo, workdir=cell.workdir,
                        command=cell.command_line, status="pending", exit_code=None,
                        seconds=0.0, skipped=False, history=history))

  def write(status, signum=None):
    result = dict(cells=records, status=status)
    if signum is not None:
      result["signal"] = int(signum)
    if others:
      result["other_cells"] = others
    atomic.write_json(record_path, result, indent=2)
    return result

  write("running")                     # an unwritable --out fails here, before any launch
  signum = None
  for i, (cell, entry) in enumerate(zip(cells, records), 1):
    if cell.finished and cell.workdir not in extend:
      entry.update(status=finished_status(cell, entry["history"]), skipped=True)
      entry["history"].append(dict(status="skipped", time=now(), command=cell.command_line))
      log(f"[sweep {i}/{len(cells)}] {cell.name}: finished before ({entry['status']}), skipped "
          f"({cell.workdir})")
      continue
    if signum is None and getattr(runner, "signum", None):   # a signal between two cells
      signum = runner.signum
    if signum is not None:
      entry["status"] = "not started"
      continue
    log(f"[sweep {i}/{len(cells)}] {cell.name}: {entry['command']}")
    entry["status"] = "running"
    write("running")
    t0, started = time.time(), now()
    code = runner(cell)
    entry.update(exit_code=code, seconds=round(time.time() - t0, 1))
    stopped = signal_of(code)
    if code == 0 and cell.finished:
      entry["status"] = "finished"
    elif code == EXIT_DIVERGED:
      entry["status"] = "diverged"
    elif stopped is not None:
      entry["status"] = "interrupted"
      signum = getattr(runner, "signum", None) or stopped
    else:
      entry["status"] = "failed"
    entry["history"].append(dict(status=entry["status"], time=started,
                                 command=cell.command_line, exit_code=code,
                                 seconds=entry["seconds"]))
    log(f"[sweep {i}/{len(cells)}] {cell.name}: {entry['status']} (exit {code}, "
        f"{entry['seconds']:.0f} s)")
    write("running")
  worst = max((SEVERITY.index(e["status"]) for e in records if e["status"] in SEVERITY),
              default=0)
  status = "interrupted" if signum is not None else SEVERITY[worst]
  return write(status, signum)
