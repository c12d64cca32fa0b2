"""The training launch of experiments.run: one compiled program over every cell (seed x dataset x
beta) of its runs, evaluation, checkpoints and outputs per workdir.

A launch trains one or more runs (run_specs.RunSpec: one workdir each, one dataset, one beta, its
seeds), each exactly a plain run's folder (workdir.Workdir), resumable on its own. `train` reads
top to bottom: Launch.plan -> prepare -> train_epochs -> finish. train_epochs hands the device
several epochs per call (train.make_cells_chunk, program.Program), so the host acts only at
evaluations, checkpoints and stop requests; what the host keeps and does per run is
host_run.HostRun's.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

import jax
import numpy as np

from mombo_jax.core import buffer, placement, train as train_lib
from mombo_jax.core.key_scheme import cell_keys
from mombo_jax.data import provenance, transitions as transitions_lib
from mombo_jax.dynamics.dynamics_store import check_legacy_dynamics
from mombo_jax.errors import Interrupted, UserError
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import distributed, loggers, overestimation, resume, run_state
from mombo_jax.run.console import log
from mombo_jax.run.host_run import Evaluation, HostRun, Pace, build_evaluators, log_reference_scores
from mombo_jax.run.preflight import validate
from mombo_jax.run.program import Program, chunk_length, compile_chunk, program_config
from mombo_jax.run.resume import cell_slices, common_start, join_cells
from mombo_jax.run.run_dataset import load_datasets
from mombo_jax.run.run_specs import RunSpec, check_runs, describe_algorithm
from mombo_jax.settings import references
from mombo_jax.signals import StopFlag
from mombo_jax.storage import checkpoint
from mombo_jax.storage.locks import FolderLock


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
  """How a launch runs, beside what it trains (experiments.run's flags of the same names).

  build_missing: build a missing dataset (True: any the collector knows; "random": random ones
  only; run_dataset.load_or_build), with build_steps per recorded dataset; download: try Minari's
  server. require_full: refuse a reduced build of the dataset's recipe (paper settings).
  keep: checkpoints kept per workdir. stop_after: epochs of this launch, then a checkpoint and
  stop (as a preempted job would; the same launch resumes). allow_epochs_change: continue a run
  with another --epochs.
  should_stop: a StopFlag (or any callable with .signum); when it fires, the launch checkpoints at
  the end of the current device call (about program.CALL_SECONDS; an evaluation still running is
  abandoned, Launch.train_epochs) and raises Interrupted.
  log_to: where the metrics go besides metrics.csv (always written; --log): names of
  loggers.KINDS, e.g. ("csv", "tensorboard", "wandb"), or "csv,tensorboard"; an unknown name or
  a logger whose package is missing is refused (UserError) before any work.
  eval_workers: processes stepping the evaluation envs (0: env_pool.auto_workers; changes no
  result).
  """
  build_missing: Union[bool, str] = False
  build_steps: int = 1_000_000
  keep: int = 3
  stop_after: Optional[int] = None
  download: bool = False
  require_full: bool = False
  allow_epochs_change: bool = False
  should_stop: Optional[StopFlag] = None
  log_to: Union[str, Sequence[str]] = ("csv",)
  eval_workers: int = 0


def train_runs(specs: Sequence[RunSpec], options: LaunchOptions = LaunchOptions()
          ) -> List[Optional[dict]]:
  """Trains every cell (seed) of every run in one compiled program; each workdir gets what a
  plain launch of that run alone writes, and resumes on its own (from <workdir>/checkpoints).
  Returns the runs' summaries (None each when options.stop_after ended this launch early; None
  on the processes other than 0 of a multi-process launch). The loggers of options.log_to write
  each workdir's rows, one series per seed (W&B: one run per seed, the launch's workdirs one
  group)."""
  launch = Launch(specs, options)
  try:
    launch.plan()
    launch.prepare()
    if not launch.train_epochs():
      return [None] * len(launch.specs)
    return launch.finish()
  finally:
    launch.release()


class Launch:
  """One launch: its runs (specs, each one's Workdir built once), the workdirs' locks, the
  device program, each run's host state (HostRun) and the evaluation under way.

  plan: every check that needs no data; prepare: data, config.json, dynamics, init or restore,
  placement; train_epochs: the epochs, with step / evaluate / save / stop_if_requested; finish: each
  workdir's summary; release: the locks (a refused launch leaves no folder it created)."""

  def __init__(self, specs: Sequence[RunSpec], options: LaunchOptions = LaunchOptions()):
    self.specs: List[RunSpec] = list(specs)
    self.options: LaunchOptions = options
    self.logger_kinds: Tuple[str, ...] = loggers.parse(options.log_to)  # before any work
    if int(options.eval_workers) < 0:
      raise UserError(f"eval_workers={options.eval_workers}: pass a number of processes >= 1, "
                      "or 0 (auto).")
    self.workdirs: List[Workdir] = [Workdir(s.workdir, s.dynamics_dir) for s in self.specs]
    self.locks: List[FolderLock] = []     # the workdirs' (process 0's), released by the OS at death
    self.config_json: List[dict] = []     # each workdir's config.json content, from plan
    self.notes: List[List[str]] = []      # what plan found worth a note, logged by prepare
    self.runs: List[HostRun] = []         # from prepare, in the order of specs
    self.program: Optional[Program] = None
    self.chunk: Optional[jax.stages.Compiled] = None  # program.compile_chunk's, from train_epochs
    self.pending: Optional[Evaluation] = None   # the evaluation under way (process 0)

  @property
  def several_runs(self) -> bool:
    return len(self.specs) > 1

  # ------------------------------------------------------------------------------------ plan

  def plan(self):
    """Every check that needs no data: the runs fit one program, the flags and folders are
    valid, no other launch writes these workdirs (process 0 takes their locks), each workdir's
    config.json agrees."""
    o = self.options
    check_runs(self.specs)
    cells = sum(s.config.num_seeds for s in self.specs)
    for s in self.specs:
      validate(s.config, s.dataset, s.workdir, s.dynamics_dir, o.keep, o.stop_after,
               o.build_steps, cells=cells)
    if distributed.is_main():
      for wd in self.workdirs:
        self.locks.append(wd.lock().acquire())
        for line in run_state.remove_leftovers(wd):
          log(f"note: {line}.")
    for s, wd in zip(self.specs, self.workdirs):
      content, notes = wd.check_config(s.config, s.dataset, o.allow_epochs_change)
      self.config_json.append(content)
      self.notes.append(notes)
    for s, wd in zip(self.specs, self.workdirs):
      if not wd.checkpointer_steps():      # a resume takes its ensembles from its checkpoint
        check_legacy_dynamics(wd.dynamics_dir, s.config)
    for line in dict.fromkeys(references.describe(s.config) for s in self.specs):
      log(line)                  # where the settings come from, before any long work

  # --------------------------------------------------------------------------------- prepare

  def prepare(self):
    """Loads the datasets, writes config.json (only now that the data loaded), gets the
    dynamics, initialises or restores every cell and places the program's arguments on the
    devices (self.runs, self.program). Its steps' order is the launch's contract."""
    o = self.options
    data = load_datasets(self.specs, o.build_missing, o.build_steps, o.download, o.require_full,
                         o.should_stop)
    self._write_configs(data)
    names = list(data)
    reals = [buffer.from_transitions(data[name]) for name in names]
    stacked, sizes = buffer.stack(reals)
    # Each dataset's return bound max|r| / (1 - gamma), from its real rewards (the stack's NaN
    # padding ignored): the critics' mean Q of its cells is watched against it
    # (overestimation.OverestimationWatch).
    bounds = dict(zip(names, overestimation.return_bound(np.asarray(stacked.reward),
                                                         self.specs[0].config.agent.gamma)))
    ckpts = [run_state.checkpointer(wd, self.options.keep) for wd in self.workdirs]
    keys = [cell_keys(s.config) for s in self.specs]        # (dynamics, init, epoch) [S] each
    dyns = [resume.run_dynamics(s, wd, ckpt, data[s.dataset], k[0], self.options.should_stop)
            for s, wd, ckpt, k in zip(self.specs, self.workdirs, ckpts, keys)]
    # One init for all cells (one set of network and optimiser objects, so the runs' states
    # concatenate); each run's checkpoint then restores onto its slice.
    config = program_config(self.specs)
    fresh = train_lib.init_cells(join_cells([k[1] for k in keys]), config, reals[0],
                                 join_cells(dyns))
    del dyns
    slices = cell_slices(self.specs)
    restored = [resume.restore_cells(ckpt, jax.tree.map(lambda x, c=c: x[c], fresh), s.config,
                                     config) for s, ckpt, c in zip(self.specs, ckpts, slices)]
    del fresh
    start = common_start(self.specs, [int(np.asarray(st.epoch)[0]) for st, _ in restored])
    for s, wd, ckpt, c, (_, meta) in zip(self.specs, self.workdirs, ckpts, slices, restored):
      self.runs.append(resume.host_run(s, wd, ckpt, c, meta, start, bounds[s.dataset],
                                       data[s.dataset]))
    for r in self.runs:    # opened by train_epochs (process 0), once training is sure to start
      r.loggers = loggers.RunLoggers(self.logger_kinds, loggers.launch_group(
          [s.workdir for s in self.specs]))
    # The cell axis lives split over all devices (of all processes) from here on; the datasets
    # are copied to every device once.
    dataset_of = [names.index(s.dataset) for s in self.specs for _ in range(s.config.num_seeds)]
    configs = [s.config for s in self.specs for _ in range(s.config.num_seeds)]
    self.program = Program(
        config=config, num_cells=len(configs),
        state=placement.shard_cells(join_cells([state for state, _ in restored])),
        real=placement.replicate(stacked),
        keys=placement.shard_cells(join_cells([k[2] for k in keys])),
        cells=placement.shard_cells(train_lib.make_cells(dataset_of, sizes[dataset_of], configs)),
        start=start, per_cell=train_lib.per_cell_settings([s.config for s in self.specs]))

  def _write_configs(self, data: Dict[str, transitions_lib.Transitions]):
    """Each workdir's config.json, with its data's identity (a resume on other data is
    refused), and plan's notes."""
    for i, (s, wd) in enumerate(zip(self.specs, self.workdirs)):
      identity = provenance.dataset_identity(s.dataset, data[s.dataset])
      self.config_json[i], more = wd.check_data(self.config_json[i], identity)
      # What the data has less of than its recipe beside its size (an expert partner from a
      # shorter SAC run): the report marks the run below the paper's setup for it.
      reduced = provenance.reduced_notes(s.dataset)
      if reduced:
        self.config_json[i]["data_reduced"] = reduced
      if distributed.is_main():
        wd.write_config(self.config_json[i])
      for note in self.notes[i] + more:
        log(f"note: {note}" + (f" ({s.workdir})" if self.several_runs else ""))

  # ----------------------------------------------------------------------------------- train

  def train_epochs(self) -> bool:
    """Trains from program.start to config.epochs (or options.stop_after epochs of this launch),
    checkpointing and evaluating every eval_every epochs. Returns False when stop_after ended it
    early; raises Interrupted when should_stop fired (after a checkpoint).

    The evaluation of epoch E runs in a background thread (process 0; host_run.Evaluation) while
    the device trains E..E+eval_every; its rows are written at the next evaluation point (or at a
    stop, or at the end) before anything later. The checkpoint of E holds what writing them needs
    (`eval` in its metadata: resume.write_lost_rows). A stop request while that evaluation runs
    abandons it: the launch resumes at E (the same results), so a stop takes one device call
    (about CALL_SECONDS) and the checkpoint."""
    try:
      return self._train_epochs()
    finally:
      if self.pending is not None:   # an error: the thread ends before the Evaluators close
        self.pending.join()
      for r in self.runs:
        if r.evaluator is not None:
          r.evaluator.close()
        if r.loggers is not None:
          r.loggers.close()

  def _train_epochs(self) -> bool:
    program, config = self.program, self.program.config
    end = self._begin()
    epoch, pace = program.start, None
    pace_line = Pace(epoch, time.time())   # the progress line's moving-average steps/s
    while epoch < end:
      self.stop_if_requested(epoch)
      n = chunk_length(epoch, end, config.evaluation.eval_every, pace)
      t0 = time.time()
      metrics = self.step(epoch, n)
      pace = (time.time() - t0) / n
      epoch += n
      if self.pending is not None and not self.pending.running():
        self.flush(epoch)        # done while the device trained: its rows now, not a point later
      if epoch % config.evaluation.eval_every and epoch != config.epochs:
        self.stop_if_requested(epoch)
        continue
      self.flush(epoch)          # the previous point's rows first: metrics.csv in epoch order
      last = {k: np.asarray(v[n - 1]) for k, v in metrics.items() if not k.startswith("diverged")}
      cell_steps = config.steps_per_epoch * program.num_cells
      rate = pace_line.rate(epoch, time.time(), cell_steps)
      eta = (config.epochs - epoch) * cell_steps / max(rate, 1e-9)
      self.evaluate(epoch, last, rate, eta)
      self.stop_if_requested(epoch)
    self.flush(epoch)
    if epoch < config.epochs:
      self.save(epoch)
      log(f"Stopping after {self.options.stop_after} epoch(s) as asked; run again to resume.")
      return False
    return True

  def _begin(self) -> int:
    """The launch's opening lines, the compiled program (self.chunk), the loggers, the rows a
    killed launch lost; returns the epoch this launch stops at."""
    program, config, stop_after = self.program, self.program.config, self.options.stop_after
    devices = jax.devices()
    what = ("Seeds" if not self.several_runs
            else f"{program.num_cells} cells ({len(self.runs)} workdirs x seeds)")
    procs = (f" of {distributed.process_count()} processes" if distributed.is_multiprocess()
             else "")
    log(f"{what} sharded over {len(devices)} {devices[0].platform} device(s){procs}, "
        f"{program.num_cells // len(devices)} per device.")
    log(f"Algorithm: {describe_algorithm(config, sorted({r.config.beta for r in self.runs}))}; "
        f"actor lr schedule over {config.schedule_steps // config.steps_per_epoch} epochs, stop "
        f"at {config.epochs}.")
    end = config.epochs if stop_after is None else min(config.epochs, program.start + stop_after)
    unwritten = [r for r in self.runs if r.unwritten_eval is not None]
    if program.start < end:
      # Compiled ahead of the loop, so steps/s and the ETA measure training only.
      t_compile = time.time()
      self.chunk = compile_chunk(program)
      log(f"Compiled the epoch in {time.time() - t_compile:.1f} s.")
    if (program.start < end or unwritten) and distributed.is_main():
      for r in self.runs:        # before training: a logger that fails costs no epoch
        r.open_loggers(program.start)
    log_reference_scores(self.runs)
    if unwritten:
      resume.write_lost_rows(unwritten, program, self.options.eval_workers,
                             self.options.should_stop)
    return end

  def step(self, epoch: int, n: int) -> Dict[str, np.ndarray]:
    """One device call: epochs epoch .. epoch+n-1 of every cell; each epoch's metrics watched
    (divergence, overestimation). Returns the metrics {name: [max epochs per call, C]} on the
    host."""
    p = self.program
    p.state, metrics = self.chunk(p.state, p.real, p.keys, p.cells, np.int32(epoch), np.int32(n))
    # One pull per call; in a multi-process run every process takes the same decisions.
    metrics = (distributed.to_host(metrics) if distributed.is_multiprocess()
               else jax.device_get(metrics))
    for i in range(n):
      epoch_metrics = {k: np.asarray(v[i]) for k, v in metrics.items()}
      for r in self.runs:
        r.watch(epoch_metrics, epoch + i + 1, self.several_runs)
    return metrics

  def evaluate(self, epoch: int, last: Dict[str, np.ndarray], rate: float, eta: float):
    """The evaluation point `epoch` (last: its metrics {name: [C]}): the checkpoint, with what
    writing the point's rows needs, then (process 0) the evaluation started in its thread."""
    actors = distributed.to_host(self.program.state.agent.actor.params)
    snaps = [r.snapshot() for r in self.runs]
    self.save(epoch, [dict(snap, epoch=epoch, last={k: [float(x) for x in v[r.cell_slice]]
                                                    for k, v in sorted(last.items())})
                      for r, snap in zip(self.runs, snaps)])
    if distributed.is_main():              # process 0 evaluates and writes the outputs
      build_evaluators(self.runs, self.options.eval_workers)
      self.pending = Evaluation(self.runs, actors, last, epoch, snaps, rate, eta)

  def save(self, epoch: int, evals: Optional[List[dict]] = None):
    """Each run's checkpoint at `epoch` (unless saved); evals: per run, what writing this
    evaluation point's rows needs, should they be lost (`eval` in the metadata)."""
    for i, r in enumerate(self.runs):
      if r.ckpt.latest_step() == epoch:
        continue
      # The run's cells with its own ring (what a plain run of it saves), each device keeping
      # the cells it holds: every process writes its own shards (every process calls save;
      # nothing is gathered).
      state = placement.take_cells(self.program.state, r.cell_slice,
                                   train_lib.capacity(r.config))
      meta = {"epoch": epoch, "diverged": list(r.diverged.values()),
              "q": list(r.q.per_seed.values())}
      if evals is not None:
        meta["eval"] = evals[i]
      try:
        r.ckpt.save(epoch, state, meta)
      except checkpoint.CheckpointError as e:
        raise UserError(str(e)) from None

  def stop_if_requested(self, epoch: int):
    """On a stop request (options.should_stop, agreed by every process): the pending rows
    written, a checkpoint, Interrupted; an evaluation still running is abandoned instead."""
    should_stop = self.options.should_stop
    if should_stop is None or not distributed.agree(should_stop()):
      return
    if distributed.agree(self.pending is not None and self.pending.running()):
      self._abandon(epoch)
    self._write_pending()
    self.save(epoch)
    raise Interrupted(getattr(should_stop, "signum", None),
                      f"epoch {epoch} (checkpoint in {self._checkpoint_dirs()})")

  def flush(self, epoch: int):
    """The pending evaluation's rows written, once it is done; a stop request while it still
    runs abandons it instead of waiting (one process: in a multi-process launch only process 0
    evaluates, and the others would not hear of it)."""
    should_stop = self.options.should_stop
    if should_stop is not None and not distributed.is_multiprocess():
      while self.pending is not None and self.pending.running():
        if should_stop():
          self._abandon(epoch)
        self.pending.join(0.2)
    self._write_pending()

  def _write_pending(self):
    pending, self.pending = self.pending, None
    if pending is not None:
      pending.finish(self.several_runs)

  def _abandon(self, epoch: int):
    """Raises Interrupted, the evaluation of the last checkpoint still running (train_epochs)."""
    if self.pending is not None:
      self.pending.cancel()
    back = self.pending.epoch if self.pending is not None else "the last evaluation"
    raise Interrupted(getattr(self.options.should_stop, "signum", None),
                      f"epoch {epoch}; the resume starts at epoch {back}, whose evaluation was "
                      f"still running (checkpoint in {self._checkpoint_dirs()})")

  def _checkpoint_dirs(self) -> str:
    return ", ".join(r.ckpt.directory for r in self.runs)

  # ---------------------------------------------------------------------------------- finish

  def finish(self) -> List[Optional[dict]]:
    """Each workdir's summary.json and learning curve (process 0); returns the summaries."""
    return [r.finish() if distributed.is_main() else None for r in self.runs]

  def release(self):
    """The workdirs' locks released; a refused launch leaves no folder it created."""
    for lock in reversed(self.locks):
      lock.release(cleanup=True)
    self.locks = []

