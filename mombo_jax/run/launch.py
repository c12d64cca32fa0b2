"""The training launch of experiments.run: one compiled program over every cell (seed x dataset x
beta) of its runs, evaluation, checkpoints and outputs per workdir.

A launch trains one or more runs (run_specs.RunSpec: one workdir each, one dataset, one beta, its
seeds), each exactly a plain run's folder (workdir.Workdir), resumable on its own. `train_runs`
reads top to bottom: Launch.plan -> prepare -> train_epochs -> finish. train_epochs hands the
device several epochs per call (cells_program.make_cells_chunk, program.Program), so the host
acts only at evaluations, checkpoints and stop requests; each run's state on the host is its
host_run.HostRun's, and every Launch method is a loop over its runs.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

import jax
import numpy as np

from mombo_jax.core import buffer, placement, train as train_lib
from mombo_jax.errors import Interrupted, UserError
from mombo_jax.run import distributed, loggers, overestimation, resume
from mombo_jax.run.console import log
from mombo_jax.run.evaluation import Evaluation, build_evaluators
from mombo_jax.run.host_run import HostRun, Pace, log_reference_scores
from mombo_jax.run.preflight import validate
from mombo_jax.run.program import Program, chunk_length, compile_chunk, program_config
from mombo_jax.run.resume import common_start, join_cells
from mombo_jax.run.run_dataset import load_datasets
from mombo_jax.run.run_specs import RunSpec, check_runs, describe_algorithm
from mombo_jax.settings import references
from mombo_jax.signals import StopFlag


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
      return [None for _ in launch.runs]
    return launch.finish()
  finally:
    launch.release()


class Launch:
  """One launch: its runs (host_run.HostRun each, made by plan: spec, Workdir, lock, config.json),
  the device program and the evaluation under way.

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
    self.runs: List[HostRun] = []         # from plan, in the order of specs
    self.program: Optional[Program] = None
    self.end: int = 0                     # the epoch this launch stops at (prepare)
    self.chunk: Optional[jax.stages.Compiled] = None  # program.compile_chunk's, from train_epochs
    self.pending: Optional[Evaluation] = None   # the evaluation under way (process 0)

  @property
  def several_runs(self) -> bool:
    return len(self.specs) > 1

  # ------------------------------------------------------------------------------------ plan

  def plan(self):
    """Every check that needs no data: the runs fit one program, the flags and folders are
    valid, no other launch writes these workdirs (process 0 takes their locks), each workdir's
    config.json agrees. Makes self.runs."""
    o = self.options
    check_runs(self.specs)
    num_cells = sum(s.config.num_seeds for s in self.specs)
    for s in self.specs:
      validate(s.config, s.dataset, s.workdir, s.dynamics_dir, o.keep, o.stop_after,
               o.build_steps, num_cells=num_cells)
    self.runs = [HostRun(s, self.several_runs) for s in self.specs]
    if distributed.is_main():
      for r in self.runs:
        r.take_lock()
    for r in self.runs:
      r.check_config(o.allow_epochs_change)
    for r in self.runs:
      r.check_legacy_dynamics()
    for line in dict.fromkeys(references.describe(r.config) for r in self.runs):
      log(line)                  # where the settings come from, before any long work

  # --------------------------------------------------------------------------------- prepare

  def prepare(self):
    """Loads the datasets, writes config.json (only now that the data loaded), gets the
    dynamics, initialises or restores every cell, fills each run's host state and places the
    program's arguments on the devices (self.program). Its steps' order is the launch's
    contract."""
    o = self.options
    data = load_datasets(self.specs, o.build_missing, o.build_steps, o.download, o.require_full,
                         o.should_stop)
    for r in self.runs:
      r.write_config(data[r.spec.dataset])
    names = list(data)
    reals = [buffer.from_transitions(data[name]) for name in names]
    stacked, sizes = buffer.stack(reals)
    # Each dataset's return bound max|r| / (1 - gamma), from its real rewards (the stack's NaN
    # padding ignored): the critics' mean Q of its cells is watched against it
    # (overestimation.OverestimationWatch).
    bounds = overestimation.return_bound(np.asarray(stacked.reward),
                                         self.runs[0].config.agent.gamma)
    offset = 0
    for r in self.runs:          # the runs' cells side by side on the program's cell axis [C]
      r.open_checkpoints(o.keep, offset)
      offset += r.config.num_seeds
    dyns = [resume.run_dynamics(r, data[r.spec.dataset], o.should_stop) for r in self.runs]
    # One init for all cells (one set of network and optimiser objects, so the runs' states
    # concatenate); each run's checkpoint then restores onto its slice.
    config = program_config(self.specs)
    fresh = train_lib.init_cells(join_cells([r.keys[1] for r in self.runs]), config, reals[0],
                                 join_cells(dyns))
    del dyns
    states = [r.restore(jax.tree.map(lambda x, c=r.cell_slice: x[c], fresh), config)
              for r in self.runs]
    del fresh
    start = common_start(self.runs)
    group = loggers.wandb_group([s.workdir for s in self.specs])
    for r in self.runs:    # loggers opened by train_epochs (process 0), once training is sure
      r.resume(float(bounds[names.index(r.spec.dataset)]), data[r.spec.dataset],
               loggers.RunLoggers(self.logger_kinds, group))
    stop_after = o.stop_after
    self.end = config.epochs if stop_after is None else min(config.epochs, start + stop_after)
    # The cell axis lives split over all devices (of all processes) from here on; the datasets
    # are copied to every device once.
    dataset_index = [names.index(r.spec.dataset) for r in self.runs for _ in r.seeds]   # [C]
    configs = [r.config for r in self.runs for _ in r.seeds]
    self.program = Program(
        config=config, num_cells=len(configs),
        state=placement.shard_cells(join_cells(states)),
        real=placement.replicate(stacked),
        keys=placement.shard_cells(join_cells([r.keys[2] for r in self.runs])),
        cells=placement.shard_cells(train_lib.make_cells(dataset_index, sizes[dataset_index],
                                                         configs)),
        start=start, per_cell=train_lib.per_cell_settings([r.config for r in self.runs]))
    if distributed.is_main() and (start < self.end or self._lost()):
      build_evaluators(self.runs, o.eval_workers)     # (process 0 evaluates) starts the env
                                                      # workers

  def _lost(self) -> List[HostRun]:
    """The runs whose checkpoint holds an evaluation point whose rows a killed launch lost."""
    return [r for r in self.runs if r.point is not None]

  # ----------------------------------------------------------------------------------- train

  def train_epochs(self) -> bool:
    """Trains from program.start to config.epochs (or options.stop_after epochs of this launch),
    checkpointing and evaluating every eval_every epochs. Returns False when stop_after ended it
    early; raises Interrupted when should_stop fired (after a checkpoint).

    The evaluation of epoch E runs in a background thread (process 0; evaluation.Evaluation) while
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
    program, config, end = self.program, self.program.config, self.end
    self._begin()
    epoch, pace = program.start, None
    pace_line = Pace(epoch, time.time())   # the progress line's steps/s (training) and ETA
    while epoch < end:
      self.stop_if_requested(epoch)
      n = chunk_length(epoch, end, config.evaluation.eval_every, pace)
      t0 = time.time()
      metrics = self.step(epoch, n)
      pace_line.trained(time.time() - t0)
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
      rate, wall_rate = pace_line.rate(epoch, time.time(), cell_steps)
      eta = (config.epochs - epoch) * cell_steps / max(wall_rate, 1e-9)
      self.evaluate(epoch, last, rate, eta)
      self.stop_if_requested(epoch)
    self.flush(epoch)
    if epoch < config.epochs:
      self.save(epoch)
      log(f"Stopping after {self.options.stop_after} epoch(s) as asked; run again to resume.")
      return False
    return True

  def _begin(self):
    """The launch's opening lines, the compiled program (self.chunk), the loggers, the rows a
    killed launch lost."""
    program, config = self.program, self.program.config
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
    lost = self._lost()
    if program.start < self.end:
      # Compiled ahead of the loop, so steps/s and the ETA measure training only.
      t_compile = time.time()
      self.chunk = compile_chunk(program)
      log(f"Compiled the epoch in {time.time() - t_compile:.1f} s.")
    if (program.start < self.end or lost) and distributed.is_main():
      for r in self.runs:        # before training: a logger that fails costs no epoch
        r.open_loggers()
    log_reference_scores(self.runs)
    if lost:
      resume.write_lost_rows(lost, program, self.options.should_stop)

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
        r.watch(epoch_metrics, epoch + i + 1)
    return metrics

  def evaluate(self, epoch: int, last: Dict[str, np.ndarray], rate: float, eta: float):
    """The evaluation point `epoch` (last: its metrics {name: [C]}): each run's point marked, the
    checkpoint, with what writing the point's rows needs, then (process 0) the evaluation started
    in its thread."""
    actors = distributed.to_host(self.program.state.agent.actor.params)
    for r in self.runs:
      r.mark_point(epoch, last)
    self.save(epoch, with_point=True)
    if distributed.is_main():              # process 0 evaluates and writes the outputs
      self.pending = Evaluation(self.runs, actors, epoch, rate, eta)

  def save(self, epoch: int, with_point: bool = False):
    """Each run's checkpoint at `epoch` (unless saved); with_point: with the evaluation point's
    what writing its rows needs, should they be lost (`eval` in the metadata)."""
    for r in self.runs:
      r.save(epoch, self.program.state, with_point)

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
      pending.write()

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
    for r in reversed(self.runs):
      r.release()

