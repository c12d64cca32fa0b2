"""One run of a launch on the host, owned here from plan to finish (HostRun): made by
launch.Launch.plan (its spec, Workdir, lock, config.json and notes), filled once by Launch.prepare
(checkpointer, cell slice, restored state, metrics rows, watch, loggers, evaluator), then
watching each epoch's metrics, writing each evaluation point's rows (the one writer of
metrics.csv) and finishing (summary.json, the curve). The evaluation itself, all runs in one pass
in a background thread: evaluation.py.
"""
from __future__ import annotations

import collections
from typing import Dict, List, Optional, Tuple

import numpy as np

from mombo_jax.core import algorithms, placement, train as train_lib
from mombo_jax.core.key_scheme import cell_keys
from mombo_jax.data import provenance, scores, transitions as transitions_lib
from mombo_jax.dynamics.dynamics_store import check_legacy_dynamics
from mombo_jax.env import evaluate as evaluate_lib
from mombo_jax.errors import UserError
from mombo_jax.records import outputs
from mombo_jax.records.outputs import RENAMED_COLUMNS
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import distributed, run_state
from mombo_jax.run.console import log
from mombo_jax.run.loggers import RunLoggers
from mombo_jax.run.overestimation import OverestimationWatch
from mombo_jax.run.run_specs import RunSpec
from mombo_jax.settings import config as config_lib
from mombo_jax.storage import checkpoint
from mombo_jax.storage.checkpoint import RunCheckpointer
from mombo_jax.storage.locks import FolderLock


class HostRun:
  """A run during a launch, everything the host keeps of it. Its fields, by who sets them:

  made by plan (Launch.plan): spec, folder (the Workdir over spec.workdir), where (" [label]" in
  the log lines of a launch of several runs), lock (process 0's, take_lock), record
  (config.json's content: check_config, write_config), notes;
  filled once by prepare (Launch.prepare): ckpt, cell_slice, keys (open_checkpoints), start and
  the checkpoint's metadata (restore), rows, q, diverged, point, dataset_score, loggers (resume),
  evaluator (evaluation.build_evaluators, process 0);
  while training: rows, diverged, q (watch, write_evaluation), point (mark_point, consumed by
  write_evaluation), scores.
  """

  def __init__(self, spec: RunSpec, several_runs: bool = False):
    self.spec: RunSpec = spec
    self.folder: Workdir = Workdir(spec.workdir, spec.dynamics_dir)   # spec.workdir: its path
    self.where: str = f" [{spec.label()}]" if several_runs else ""
    self.several_runs: bool = several_runs
    self.seeds: np.ndarray = np.arange(spec.config.seed,
                                       spec.config.seed + spec.config.num_seeds)   # int [S]
    self.lock: Optional[FolderLock] = None
    self.record: dict = {}                  # config.json's content (check_config, write_config)
    self.notes: List[str] = []              # what plan found worth a note, logged by prepare
    self.ckpt: Optional[RunCheckpointer] = None
    self.cell_slice: slice = slice(0, spec.config.num_seeds)  # its cells on the program's axis [C]
    self.keys: tuple = ()                   # key_scheme.cell_keys: (dynamics, init, epoch) [S]
    self.start: int = 0                     # the epoch it resumes at (0: fresh)
    self.saved: dict = {}                   # its checkpoint's metadata (restore)
    self.q: Optional[OverestimationWatch] = None
    self.rows: List[dict] = []              # metrics.csv's
    self.diverged: Dict[int, dict] = {}     # seed -> {seed, epoch, quantity}
    # The evaluation point whose rows are not written yet: {epoch, last: {metric: [S]}, diverged,
    # flagged, bound} (mark_point; or, resumed, the checkpoint's `eval` a killed launch lost).
    self.point: Optional[dict] = None
    self.dataset_score: Optional[float] = None  # mean normalised return of the dataset's own
                                                # episodes (its behaviour policy's)
    self.loggers: Optional[RunLoggers] = None   # where the rows go besides metrics.csv (--log)
    self.evaluator: Optional[evaluate_lib.Evaluator] = None  # shared by runs of one env
    self.scores: Optional[np.ndarray] = None    # normalised scores [S, episodes], last evaluation

  @property
  def config(self) -> config_lib.Config:
    return self.spec.config

  # -------------------------------------------------------------------------------- plan's

  def take_lock(self):
    """The workdir's lock (process 0: the one writer here), then the leftovers of a killed save
    removed (run_state.remove_leftovers), one note each."""
    self.lock = self.folder.lock().acquire()
    for line in run_state.remove_leftovers(self.folder):
      log(f"note: {line}.")

  def check_config(self, allow_epochs_change: bool):
    """config.json's content to write (self.record) and the notes on it; refuses a workdir of
    another run (Workdir.check_config). Writes nothing."""
    self.record, self.notes = self.folder.check_config(self.config, self.spec.dataset,
                                                        allow_epochs_change)

  def check_legacy_dynamics(self):
    """Refuses legacy dynamics saves this run would train beside; a resume takes its ensembles
    from its checkpoint and is not checked."""
    if not self.folder.checkpointer_steps():
      check_legacy_dynamics(self.folder.dynamics_dir, self.config)

  def release(self):
    """The workdir's lock released; a refused launch leaves no folder it created."""
    if self.lock is not None:
      self.lock.release(cleanup=True)
      self.lock = None

  # ----------------------------------------------------------------------------- prepare's

  def write_config(self, transitions: transitions_lib.Transitions):
    """config.json written (process 0) with its data's identity (a resume on other data is
    refused), and plan's notes logged."""
    identity = provenance.dataset_identity(self.spec.dataset, transitions)
    self.record, more = self.folder.check_data(self.record, identity)
    # What the data has less of than its recipe beside its size (an expert partner from a
    # shorter SAC run): the report marks the run below the paper's setup for it.
    reduced = provenance.reduced_notes(self.spec.dataset)
    if reduced:
      self.record["data_reduced"] = reduced
    if distributed.is_main():
      self.folder.write_config(self.record)
    for note in self.notes + more:
      log(f"note: {note}" + (f" ({self.spec.workdir})" if self.several_runs else ""))

  def open_checkpoints(self, keep: int, offset: int):
    """Its checkpointer, its cells' slice [offset, offset + S) of the program's cell axis and its
    keys (key_scheme.cell_keys)."""
    self.ckpt = run_state.checkpointer(self.folder, keep)
    self.cell_slice = slice(offset, offset + self.config.num_seeds)
    self.keys = cell_keys(self.config)

  def restore(self, fresh: train_lib.CellState, program_config: config_lib.Config
              ) -> train_lib.CellState:
    """Its cells' state [S]: `fresh` (its cells of the launch's init), or its latest checkpoint
    restored onto them (program_config: the program's, whose ring may be longer); self.start
    and self.saved from the checkpoint."""
    if self.ckpt.latest_step() is None:
      return fresh
    try:
      # The checkpoint holds the run's own ring (a plain run's); the program's may be longer.
      state, meta = self.ckpt.restore(placement.resize_rings(fresh,
                                                             train_lib.capacity(self.config)))
    except checkpoint.CheckpointError as e:
      raise UserError(str(e)) from None
    state = placement.resize_rings(state, train_lib.capacity(program_config))
    self.start, self.saved = int(np.asarray(state.epoch)[0]), meta or {}
    log(f"Resumed from {self.ckpt.directory} at epoch {self.start}.")
    return state

  def resume(self, bound: float, transitions: transitions_lib.Transitions, loggers: RunLoggers):
    """Its host state at self.start: metrics.csv's rows up to there (written back, process 0),
    the seeds that diverged and the overestimation watch (from its checkpoint's metadata; bound:
    its dataset's return bound), the point whose rows its checkpoint says are lost, the
    dataset's own score, its loggers (opened by open_loggers)."""
    rows = self.folder.read_rows(max_epoch=self.start)
    lost = self.saved.get("eval")
    if lost and int(lost["epoch"]) == self.start \
        and not any(int(row["epoch"]) == self.start for row in rows):
      self.point = lost                   # killed between the checkpoint and the rows
    self.rows = rows
    if distributed.is_main():
      self._write_rows()
    # A checkpoint saved before the watch existed (or a fresh run): rebuilt from metrics.csv.
    self.q = (OverestimationWatch(self.seeds, bound, self.saved["q"]) if "q" in self.saved
              else OverestimationWatch.from_rows(self.seeds, bound, rows))
    self.diverged = {int(d["seed"]): d for d in self.saved.get("diverged", [])}
    # What the behaviour policy scored: the final line sets the run's score beside it.
    self.dataset_score = float(np.mean(scores.normalized_score(
        self.spec.dataset, transitions_lib.episode_returns(transitions))))
    self.loggers = loggers

  # ---------------------------------------------------------------------------- training's

  def open_loggers(self):
    """Opens the loggers besides metrics.csv (--log) at self.start (0: fresh) with self.rows,
    metrics.csv's rows up to there; one line each says where it writes."""
    if self.loggers is not None and self.loggers.extra:
      for line in self.loggers.open(self.spec.workdir, self.folder.read_record(), self.seeds,
                                    self.rows, self.start):
        log(line)

  def watch(self, metrics: dict, epoch: int):
    """Epoch `epoch`'s per-cell metrics ({name: [C]}): the overestimation watch and divergence."""
    frozen = metrics["diverged"]
    for i, s in zip(range(self.cell_slice.start, self.cell_slice.stop), self.seeds):
      q = metrics["q_mean"][i]
      # A frozen seed's metrics are its failed epoch's (maybe NaN): not watched.
      if not frozen[i] and self.q.update(int(s), epoch, q):
        log(f"warning: seed {s} of {self.spec.dataset} beta={self.config.beta:g} overestimates: "
            f"the critics' mean Q {q:.4g} passed the return bound max|r|/(1-gamma) = "
            f"{self.q.bound:.4g} at epoch {epoch}. Training goes on; the seed is flagged "
            "`overestimated` in summary.json.")
      if frozen[i] and int(s) not in self.diverged:
        quantity = ", ".join(k for k in train_lib.DIVERGENCE_CHECKS
                             if bool(metrics[f"diverged/{k}"][i])) or "unknown"
        self.diverged[int(s)] = {"seed": int(s), "epoch": epoch, "quantity": quantity}
        log(f"seed {s}{self.where} diverged at epoch {epoch} ({quantity} "
            f"non-finite or beyond +-{self.config.agent.max_abs_loss:g}); it is frozen at its "
            "last healthy state, whose policy is still evaluated and counted in the summary "
            "(docs/protocol.md). The other seeds go on.")

  def mark_point(self, epoch: int, last: Dict[str, np.ndarray]):
    """The evaluation point `epoch` (last: its metrics {name: [C]}): self.point, what writing its
    rows needs, JSON (the checkpoint's `eval`): its cells' metrics and the watch now (rows written
    later, after the next epochs trained and were watched, say what they would have said at
    once)."""
    self.point = dict(diverged=sorted(int(s) for s in self.diverged),
                      flagged=[int(s) for s in self.q.flagged()], bound=float(self.q.bound),
                      epoch=epoch, last={k: [float(x) for x in v[self.cell_slice]]
                                         for k, v in sorted(last.items())})

  def save(self, epoch: int, state: train_lib.CellState, with_point: bool = False):
    """Its checkpoint at `epoch` (unless saved): its cells of the program's `state` [C] with its
    own ring (what a plain run of it saves), each device keeping the cells it holds (every
    process writes its own shards; nothing is gathered); with_point: self.point in the metadata
    (`eval`), for a resume to write its rows should they be lost."""
    if self.ckpt.latest_step() == epoch:
      return
    cells = placement.take_cells(state, self.cell_slice, train_lib.capacity(self.config))
    meta = {"epoch": epoch, "diverged": list(self.diverged.values()),
            "q": list(self.q.per_seed.values())}
    if with_point:
      meta["eval"] = self.point
    try:
      self.ckpt.save(epoch, cells, meta)
    except checkpoint.CheckpointError as e:
      raise UserError(str(e)) from None

  def eval_seed(self, epoch: int) -> int:
    """The seed of the evaluation at epoch `epoch` (evaluate.env_seeds spreads it over the run's
    seeds x episodes)."""
    return 10_000 * self.config.seed + epoch

  def write_evaluation(self, returns, rate: Optional[float] = None, eta: Optional[float] = None):
    """The rows of self.point (then consumed): returns [S, episodes] -> self.scores and one
    metrics.csv row per seed (also handed to self.loggers); with rate / eta (steps/s, seconds
    left), its progress line."""
    c, point = self.config, self.point
    diverged, flagged = set(point["diverged"]), set(point["flagged"])
    # An older checkpoint's metric names as metrics.csv's readers name them today.
    last = {RENAMED_COLUMNS.get(k, k): v for k, v in point["last"].items()}
    self.scores = scores.normalized_score(self.spec.dataset, returns)   # [S, episodes]
    new = []
    for i, s in enumerate(self.seeds):
      row = dict(epoch=point["epoch"], step=point["epoch"] * c.steps_per_epoch, seed=int(s),
                 return_mean=float(returns[i].mean()),
                 normalized_score=float(self.scores[i].mean()),
                 diverged=float(int(s) in diverged))
      row.update({k: float(v[i]) for k, v in sorted(last.items())})
      row.update(q_bound=point["bound"], overestimated=float(int(s) in flagged))
      new.append(row)
    self.rows += new
    self._write_rows()
    if self.loggers is not None:
      self.loggers.write(new)
    if rate is not None:
      self._log_progress(last, rate, eta)
    self.point = None

  def _write_rows(self):
    """metrics.csv: its one writer."""
    self.folder.write_rows(self.rows)

  def _log_progress(self, last: dict, rate: float, eta: float):
    """The log line of self.point's evaluation (last: its metrics {name: [S]})."""
    c, point = self.config, self.point
    log(f"epoch {point['epoch']}/{c.epochs}{self.where}  {rate:.0f} steps/s (all "
        f"{'seeds' if not self.several_runs else 'cells'}, training alone: evaluations and "
        f"checkpoints apart; moving average over up to the last "
        f"{RATE_POINTS * c.evaluation.eval_every} epochs)  score per seed "
        f"[{', '.join(f'{x:.1f}' for x in self.scores.mean(axis=1))}]  critic_loss "
        f"[{', '.join(f'{x:.3g}' for x in last['critic_loss'])}]  q_mean "
        f"[{', '.join(f'{x:.4g}' for x in last['q_mean'])}] (bound {point['bound']:.4g})  "
        f"ETA {_fmt(eta)}"
        + (f"  OVERESTIMATED seeds {point['flagged']}" if point["flagged"] else "")
        + (f"  diverged seeds {point['diverged']}" if point["diverged"] else ""))

  # ------------------------------------------------------------------------------ finish's

  def finish(self) -> dict:
    """summary.json and learning_curve.png; returns the summary. The log line gives the means
    over every seed, says how many diverged, and gives the healthy seeds' mean beside."""
    c, spec = self.config, self.spec
    diverged = sorted(self.diverged.values(), key=lambda d: d["seed"])
    summary = outputs.summarise(self.rows, self.seeds, diverged, self.q)
    self.folder.write_summary(summary)
    title = f"{algorithms.label(c.algo, c.target, 'title')} on {spec.dataset}"
    self.folder.plot(self.rows, self.seeds, title, sorted(self.diverged), self.dataset_score)
    log(f"{finish_line(summary, self.q, self.dataset_score)}; wrote {spec.workdir}")
    return summary


def log_reference_scores(runs):
  """One line per dataset of `runs` (HostRuns): the returns its normalised scores are scaled by."""
  shown = {}
  for r in runs:
    shown.setdefault(r.spec.dataset, scores.ref_scores(r.spec.dataset))
  for name, (ref_min, ref_max, source) in shown.items():
    log(f"Normalised scores{'' if len(shown) == 1 else f' of {name}'} use R_random={ref_min:.2f}, "
        f"R_expert={ref_max:.2f} ({source}).")


# Evaluation intervals the progress line's steps/s is averaged over (Launch.train_epochs: a moving
# average; a launch-long mean hides a change of pace, one interval's is noisy).
RATE_POINTS = 3


class Pace:
  """The progress line's two paces, each a moving average over the last RATE_POINTS evaluation
  intervals (the launch's start counting as the first point): steps/s of training alone (the
  device calls' own time, `trained`) and of the launch (wall clock: evaluations, checkpoints and
  host work included), which the ETA uses. A launch-long mean would hide a change of pace; the
  wall clock alone read 64 steps/s after 1,493 on a tiny run, its second interval holding the
  first evaluation."""

  def __init__(self, epoch: int, now: float):
    self.training = 0.0
    self.marks = collections.deque([(epoch, now, 0.0)], maxlen=RATE_POINTS + 1)

  def trained(self, seconds: float):
    """Adds a device call's seconds."""
    self.training += seconds

  def rate(self, epoch: int, now: float, steps_per_epoch: int) -> Tuple[float, float]:
    """Records the point (epoch, now); (training steps/s, wall-clock steps/s) since the oldest
    point kept (steps_per_epoch: of all cells)."""
    self.marks.append((epoch, now, self.training))
    (e0, t0, d0), (e1, t1, d1) = self.marks[0], self.marks[-1]
    steps = (e1 - e0) * steps_per_epoch
    return steps / max(d1 - d0, 1e-9), steps / max(t1 - t0, 1e-9)


def finish_line(summary: dict, q=None, dataset_score=None) -> str:
  """The run's final log line (without the folder): the headline over every seed beside the
  dataset's own mean normalised episode return (dataset_score, where given), how many diverged
  (and the healthy seeds' mean beside), the overestimating seeds."""
  n, bad = len(summary["seeds"]), len(summary["diverged"])
  line = (f"final normalised score {_num(summary['final_normalized_score_mean'])} "
          f"+- {_num(summary['final_normalized_score_std'])}"
          + ("" if dataset_score is None
             else f" (dataset's own episodes: mean {dataset_score:.1f})")
          + f", AULC {_num(summary['aulc_mean'])} over all {n} seed(s), {bad} diverged")
  if bad:
    line += (f" (counted at their frozen policy; over the {n - bad} healthy seed(s): "
             f"{_num(summary.get('final_normalized_score_mean_healthy'))} "
             f"+- {_num(summary.get('final_normalized_score_std_healthy'))})")
  if q is not None and q.flagged():
    line += (f"; seed(s) {q.flagged()} overestimated (mean Q above the return bound "
             f"{q.bound:.4g})")
  # What the two numbers are, where a newcomer reads them first.
  return line + (" [+-: the std over the seeds; AULC: the mean score over all evaluations; "
                 "docs/protocol.md]")


def _num(x):
  return "n/a" if x is None else f"{x:.1f}"


def _fmt(seconds):
  seconds = int(seconds)
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m{seconds % 60:02d}s"
