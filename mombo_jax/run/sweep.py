"""A grid of `experiments.run` launches in one folder, resumably (experiments.sweep is its CLI).

This module owns the sweep's entries and their launches: `plan` turns datasets x algorithms into
SweepEntries (one `python -m experiments.run` command each, launched again until it finished;
sweep.json keeps them under their on-disk name "cells"; a cell is one seed of a run, train.Cell:
docs/architecture.md, "Words"), all seeds of an entry in one launch, the algorithms of
a dataset sharing an ensemble in `<out>/<dataset>/dynamics` where their dynamics settings agree;
`dynamics_plan` says which share and why), `check_entries` refuses entries whose folder holds a
run of another setup than asked (naming the fields), `Launcher` runs an entry as a child process
and forwards SIGINT / SIGTERM to it, and `run_sweep` launches the unfinished entries in order and
keeps the record `<out>/sweep.json` (each entry's status and its history over every sweep that
touched it). Where the entries' folders go is mombo_jax.records.workdir's.
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
from mombo_jax.errors import InvalidValue, UserError
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

# experiments.run's flags that a sweep sets for every entry (name -> absl type). They make the
# entry's setup (its config.json), which the sweep checks and compares with finished entries.
BUDGET_FLAGS = {"preset": "string", "target": "string", "reference": "string", "epochs": "integer",
                "steps_per_epoch": "integer", "eval_every": "integer", "eval_episodes": "integer",
                "rollout_batch_size": "integer", "rollout_length": "integer",
                "dynamics_max_epochs": "integer", "real_ratio": "float", "beta": "float",
                "schedule_epochs": "integer"}
# experiments.run's flags a sweep passes on after `--` (name -> absl type): they change how an entry
# runs, not what it trains (its config.json).
PASSTHROUGH_FLAGS = {"keep_checkpoints": "integer", "compilation_cache": "string",
                     "build_missing": "bool", "build_steps": "integer", "download": "bool",
                     "allow_small_dataset": "bool", "allow_epochs_change": "bool", "log": "list",
                     "eval_workers": "integer"}
# experiments.run's flags a sweep sets itself, with the sweep's flag that does it.
_OWNED = {"env": "--envs", "dataset": "--envs", "datasets": "--envs", "algo": "--algos",
          "seeds": "--seeds", "seed": "--seed", "workdir": "--out", "dynamics_dir": "--out",
          "betas": "one sweep per --beta"}
# experiments.run's flags a sweep does not pass on: an entry must run to its end in one process.
_NOT_PASSED = ("stop_after", "coordinator_address", "num_processes", "process_id", "distributed",
               "init_timeout")
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclasses.dataclass(frozen=True)
class SweepEntry:
  """One experiments.run launch: all seeds of one algorithm on one dataset. config: the Config
  the command trains (what its config.json must say); allow_epochs_change: `--
  --allow_epochs_change` was passed (a finished entry of fewer --epochs is continued)."""
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
    """The folder of the entry's ensembles (reuse.dynamics_path: its dynamics settings name it);
    entries of one dataset with equal settings share it. None without a config."""
    return None if self.config is None else dynamics_path(self.dynamics_dir, self.config)


def check_passthrough(extra: Sequence[str]) -> Dict[str, Any]:
  """{flag: value} of the words after `--`, each a --flag of PASSTHROUGH_FLAGS with a value of its
  type; InvalidValue (one line, naming the word and what to do) for anything else: a word, a setup
  flag (the sweep's own), a flag the sweep sets or cannot pass on, an unknown or mistyped one."""
  values = {}
  for word in extra:
    if not word.startswith("--") or word == "--":
      raise InvalidValue(f"unexpected argument {word!r}: everything after `--` must be an "
                         "experiments.run --flag (e.g. -- --keep_checkpoints=2).")
    name, has_value, value = word[2:].partition("=")
    kind = PASSTHROUGH_FLAGS.get(name)
    if kind is None and name.startswith("no") and PASSTHROUGH_FLAGS.get(name[2:]) == "bool" \
        and not has_value:
      values[name[2:]] = False
      continue
    if name in BUDGET_FLAGS:
      raise InvalidValue(f"{word}: pass --{name} to the sweep itself, before `--`: it sets "
                         "every entry's setup, which the sweep checks and compares with finished "
                         "entries.")
    if name in _OWNED:
      raise InvalidValue(f"{word}: the sweep sets --{name} for every entry ({_OWNED[name]}).")
    if name in _NOT_PASSED:
      raise InvalidValue(f"{word}: a sweep does not pass --{name} on (each entry runs to its end "
                         "in one process); run that entry with experiments.run instead.")
    if kind is None:
      passed = ", ".join("--" + n for n in sorted(PASSTHROUGH_FLAGS))
      setup = ", ".join("--" + n for n in sorted(BUDGET_FLAGS))
      raise InvalidValue(f"{word}: not a flag a sweep passes on to experiments.run; after `--` go "
                         f"only {passed} (the setup's flags go before `--`: {setup}).")
    if kind == "bool":
      if has_value and value.lower() not in _BOOL_WORDS:
        raise InvalidValue(f"{word}: --{name} takes true or false.")
      values[name] = _BOOL_WORDS[value.lower()] if has_value else True
      continue
    if not has_value:
      raise InvalidValue(f"{word}: give --{name} its value after '=' (--{name}=VALUE).")
    if kind == "integer":
      try:
        values[name] = int(value)
      except ValueError:
        raise InvalidValue(f"{word}: --{name} takes an integer.") from None
    else:
      values[name] = value
  return values


def plan(envs: Sequence[str], algos: Sequence[str], seeds: int, seed: int, out: str,
         budget: dict, extra: Sequence[str] = (),
         python: str = sys.executable) -> List[SweepEntry]:
  """The entries in launch order (dataset-major: a dataset's ensemble is trained by the first
  entry that needs it and reused by the later entries whose dynamics settings agree; entries of
  other settings train their own beside it, SweepEntry.dynamics_path, dynamics_plan). Every name
  and budget is checked first by building each entry's config, so a typo fails here and not
  hours into the sweep; `extra` (the words after `--`) by check_passthrough. budget:
  experiments.run flag -> value (None = the entry's default). A given --beta is part of the
  entries' folder names (<algo>[-<target>]-beta<b>), so sweeps of several betas share one --out;
  so is a --reference other than the algorithm's default source (<algo>[-<target>]-<reference>;
  an algorithm without that source is refused)."""
  if not envs:
    raise InvalidValue("`envs` is required, e.g. envs=hopper-random,hopper-medium-replay.",
                       params=("envs",))
  if not out:
    raise InvalidValue("`out` is required: the folder the sweep's runs go into.", params=("out",))
  if seeds < 1:
    raise InvalidValue(f"`seeds` must be >= 1, got {seeds}.", params=("seeds",))
  if len(set(envs)) != len(envs) or len(set(algos)) != len(algos):
    raise InvalidValue("`envs` and `algos` must not repeat a name.", params=("envs", "algos"))
  budget = {k: v for k, v in budget.items() if v is not None}
  unknown = sorted(set(budget) - set(BUDGET_FLAGS))
  if unknown:
    raise InvalidValue(f"Unknown budget flag(s) {unknown}; known: {sorted(BUDGET_FLAGS)}.")
  passed = check_passthrough(extra)
  overrides = {("dyn_max_epochs" if k == "dynamics_max_epochs" else k): v
               for k, v in budget.items() if k != "preset"}
  if "schedule_epochs" in overrides:     # as experiments.run: 0 means "span --epochs"
    overrides["schedule_epochs"] = overrides["schedule_epochs"] or None
  entries = []
  for env in envs:
    for spec in algos:
      try:   # MODULE:NAME imported (the entry's launch gets the same); a name: make_config's check
        algo = algorithms.from_spec(spec) if ":" in spec else spec
      except ValueError as e:
        raise InvalidValue(f"`algos` {spec}: {e}", params=("algos",)) from None
      try:
        config = config_lib.make_config(env, algo, budget.get("preset", "paper"), seed=seed,
                                        num_seeds=seeds, **overrides)
      except (ValueError, TypeError) as e:
        raise InvalidValue(f"{env} / {algo}: {e}") from None
      target = budget.get("target", config_lib.Config.target)
      workdir = workdir_lib.run_dir(out, env, algo, target, seed, seeds, budget.get("beta"),
                                    config.reference, config.agent.moments)
      dynamics_dir = workdir_lib.grid_dynamics_dir(out, env)
      command = [python, "-m", "experiments.run", f"--env={env}", f"--algo={spec}",
                 f"--seeds={seeds}", f"--seed={seed}", f"--workdir={workdir}",
                 f"--dynamics_dir={dynamics_dir}"]
      command += [f"--{k}={v}" for k, v in budget.items()]
      command += list(extra)
      entries.append(SweepEntry(env, algo, workdir, dynamics_dir, tuple(command), config,
                        bool(passed.get("allow_epochs_change"))))
  return entries


def dynamics_plan(entries: Sequence[SweepEntry], budget: dict) -> List[str]:
  """Lines saying, per dataset, which entries share a dynamics ensemble and why (the settings each
  ensemble follows, with their sources: --dynamics_max_epochs, the preset, the algorithm's
  reference source in mombo_jax/settings/references.py, the Config default):
  sweep_dynamics.sharing_plan of the planned entries."""
  flags = ({"dyn_max_epochs": "--dynamics_max_epochs"}
           if budget.get("dynamics_max_epochs") is not None else {})
  return sharing_plan(
      [(c.env, c.algo, c.config, c.dynamics_dir) for c in entries if c.config is not None],
      budget.get("preset") or "paper", flags)


def setup_mismatch(entry: SweepEntry) -> Dict[str, tuple]:
  """{field: (recorded, asked)} where the run in entry.workdir (its config.json) differs from the
  config the entry asks for; {} when the folder holds no config.json yet or they agree."""
  wd = workdir_lib.Workdir(entry.workdir)
  if entry.config is None or not os.path.exists(wd.file(workdir_lib.CONFIG)):
    return {}
  record = wd.read_record()
  asked = workdir_lib.config_record(entry.config, entry.env)
  return {k: (record.get(k), v) for k, v in asked.items() if record.get(k) != v}


def check_entries(entries: Sequence[SweepEntry]) -> Set[str]:
  """Refuses, before anything is launched, entries whose folder holds a run of another setup than
  asked (UserError, one line naming each entry and the fields that differ, recorded -> asked):
  any field for a finished entry (its results are what they are), any but the evaluation's for an
  unfinished one (experiments.run resumes it; --eval_every / --eval_episodes may change), and
  --epochs unless `-- --allow_epochs_change`. Returns the workdirs of the finished entries to
  continue to a changed --epochs (those flags passed)."""
  problems, extend = [], set()
  for entry in entries:
    differs = setup_mismatch(entry)
    if not differs:
      continue
    finished = entry.finished
    extending = "epochs" in differs and entry.allow_epochs_change
    # experiments.run resumes a run under other evaluation fields; a finished run's evaluations
    # are done, unless it is continued to more epochs.
    harmless = set(HARMLESS) if (not finished or extending) else set()
    bad = {k: v for k, v in differs.items()
           if k not in harmless and not (k == "epochs" and entry.allow_epochs_change)}
    if bad:
      problems.append((entry, finished, bad))
    elif finished:
      extend.add(entry.workdir)
  if problems:
    parts = [f"{entry.name} in {entry.workdir} ({'finished' if finished else 'unfinished'}: "
             + ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in sorted(bad.items())) + ")"
             for entry, finished, bad in problems]
    only_epochs = all("epochs" in bad and set(bad) <= {"epochs"} | set(HARMLESS)
                      for _, _, bad in problems)
    raise UserError(
        f"{len(problems)} entries hold a run of another setup than asked, so nothing was "
        f"launched: {'; '.join(parts)}. Ask for the setup they were run with (sweep.json has "
        "their commands), pass another `out`, or delete those entries' folders to run them again"
        + ("; or pass experiments.run's `-- --allow_epochs_change` to continue them to the new "
           "`epochs`" if only_epochs else "") + ".", params=("out", "epochs"))
  return extend


class Launcher:
  """Runs entries as child processes (output streamed through) and forwards SIGINT / SIGTERM.

  The child runs in its own session, so a terminal's Ctrl-C reaches the sweep only, and the sweep
  passes it on exactly once: the child checkpoints, prints its resume line and exits 130 / 143
  (a second signal would make experiments.run abort at once). After a signal no further entry is
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

  def __call__(self, entry: SweepEntry) -> int:
    if self.signum is not None:
      return -self.signum
    self.child = subprocess.Popen(list(entry.command), start_new_session=True)
    try:
      return self.child.wait()
    finally:
      self.child = None


def run_sweep(entries: Sequence[SweepEntry], out: str,
              runner: Optional[Callable[[SweepEntry], int]] = None,
              log: Callable[[str], None] = print) -> dict:
  """Launches the unfinished entries in order (after check_entries: nothing is launched when one
  holds another setup); returns and writes the record <out>/sweep.json:
  {"cells": [{env, algo, workdir, command, status, exit_code, seconds, skipped, history}],
   "status", "signal" (when interrupted), "other_cells" (entries of earlier sweeps into <out> that
   this one does not plan; kept as they were)}.

  status per entry: finished | diverged | failed | interrupted | not started (after an
  interruption); an entry finished before is not launched (skipped: true) and keeps its outcome:
  diverged when its summary.json lists diverged seeds or its last launch ended so, else
  finished. history: one {status, time, command, exit_code, seconds} per launch and one {status:
  "skipped", time, command} per sweep that found it finished, over every sweep into <out>, oldest
  first. The sweep's status is its entries' worst (interrupted > failed > diverged > finished).
  runner(entry) -> exit status (default: a Launcher). atomic.WriteError (a UserError) when <out>
  cannot be written: raised before any entry is launched."""
  runner = runner or Launcher()
  extend = check_entries(entries)
  atomic.check_writable(out)
  # One sweep per folder (sweep.json has one writer); each entry's run takes its workdir's lock.
  lock = locks.FolderLock(out, ".sweep.lock", what="sweep --out", fix=(
      "wait for that sweep to finish or stop it, or pass another --out")).acquire()
  try:
    return _run_sweep(entries, out, runner, extend, log)
  finally:
    lock.release()


def _run_sweep(entries, out, runner, extend, log):
  record_path = os.path.join(out, "sweep.json")
  old = read_record(record_path)
  earlier = {e.get("workdir"): e for e in old.get("cells", []) + old.get("other_cells", [])
             if isinstance(e, dict)}
  planned = {c.workdir for c in entries}
  others = [e for w, e in earlier.items() if w not in planned]
  outcomes = []
  for entry in entries:
    history = history_of(earlier.get(entry.workdir, {}))
    outcomes.append(dict(env=entry.env, algo=entry.algo, workdir=entry.workdir,
                        command=entry.command_line, status="pending", exit_code=None,
                        seconds=0.0, skipped=False, history=history))

  def write(status, signum=None):
    result = dict(cells=outcomes, status=status)
    if signum is not None:
      result["signal"] = int(signum)
    if others:
      result["other_cells"] = others
    atomic.write_json(record_path, result, indent=2)
    return result

  write("running")                     # an unwritable --out fails here, before any launch
  signum = None
  for i, (entry, outcome) in enumerate(zip(entries, outcomes), 1):
    if entry.finished and entry.workdir not in extend:
      outcome.update(status=finished_status(entry, outcome["history"]), skipped=True)
      outcome["history"].append(dict(status="skipped", time=now(), command=entry.command_line))
      log(f"[sweep {i}/{len(entries)}] {entry.name}: finished before ({outcome['status']}), "
          f"skipped ({entry.workdir})")
      continue
    if signum is None and getattr(runner, "signum", None):   # a signal between two entries
      signum = runner.signum
    if signum is not None:
      outcome["status"] = "not started"
      continue
    log(f"[sweep {i}/{len(entries)}] {entry.name}: {outcome['command']}")
    outcome["status"] = "running"
    write("running")
    t0, started = time.time(), now()
    code = runner(entry)
    outcome.update(exit_code=code, seconds=round(time.time() - t0, 1))
    stopped = signal_of(code)
    if code == 0 and entry.finished:
      outcome["status"] = "finished"
    elif code == EXIT_DIVERGED:
      outcome["status"] = "diverged"
    elif stopped is not None:
      outcome["status"] = "interrupted"
      signum = getattr(runner, "signum", None) or stopped
    else:
      outcome["status"] = "failed"
    outcome["history"].append(dict(status=outcome["status"], time=started,
                                 command=entry.command_line, exit_code=code,
                                 seconds=outcome["seconds"]))
    log(f"[sweep {i}/{len(entries)}] {entry.name}: {outcome['status']} (exit {code}, "
        f"{outcome['seconds']:.0f} s)")
    write("running")
  worst = max((SEVERITY.index(e["status"]) for e in outcomes if e["status"] in SEVERITY),
              default=0)
  status = "interrupted" if signum is not None else SEVERITY[worst]
  return write(status, signum)
