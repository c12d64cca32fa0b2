"""One run of a launch on the host (HostRun: its workdir, its metrics rows, the overestimation
watch, diverged seeds, the evaluator, the loggers) and what the launch (launch.Launch) does with
it: watch each epoch's metrics, write an evaluation's rows, log progress, and finish
(summary.json, the curve). A launch evaluates all its runs in one pass (one set of envs for every
cell, stepped over the host's cores), in a background thread while the device trains on
(Evaluation: the thread computes returns only; the main thread writes them).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import threading
from typing import Dict, List, Optional, Tuple

import jax
import numpy as np

from mombo_jax.core import algorithms, train as train_lib
from mombo_jax.data import scores
from mombo_jax.env import envs, evaluate as evaluate_lib
from mombo_jax.records import outputs
from mombo_jax.records.workdir import Workdir
from mombo_jax.run.console import log
from mombo_jax.run.loggers import RunLoggers
from mombo_jax.run.overestimation import OverestimationWatch
from mombo_jax.run.run_specs import RunSpec
from mombo_jax.settings import config as config_lib
from mombo_jax.storage.checkpoint import RunCheckpointer


@dataclasses.dataclass
class HostRun:
  """A run during a launch: its cells' slice of the program's cell axis and what the host keeps
  of it (metrics rows, overestimation watch, diverged seeds, evaluator, loggers)."""
  spec: RunSpec
  workdir: Workdir
  cell_slice: slice            # its cells on the program's cell axis [C]
  seeds: np.ndarray            # int [S]
  ckpt: Optional[RunCheckpointer]
  q: OverestimationWatch
  rows: List[dict] = dataclasses.field(default_factory=list)          # metrics.csv's
  diverged: Dict[int, dict] = dataclasses.field(default_factory=dict)  # seed -> {seed, epoch,
                                                                       # quantity}
  evaluator: Optional[evaluate_lib.Evaluator] = None  # shared by runs of one env (build_evaluators)
  scores: Optional[np.ndarray] = None   # normalised scores [S, episodes] of the last evaluation
  loggers: Optional[RunLoggers] = None  # where the rows go besides metrics.csv (--log)
  unwritten_eval: Optional[dict] = None  # the checkpoint's `eval` metadata when metrics.csv lacks
                                         # the rows of the epoch resumed at (Launch.recover)
  dataset_score: Optional[float] = None  # mean normalised return of the dataset's own episodes
                                         # (its behaviour policy's), shown beside the final score

  @property
  def config(self) -> config_lib.Config:
    return self.spec.config

  def where(self, several_runs: bool) -> str:
    return f" [{self.spec.label()}]" if several_runs else ""

  def watch(self, metrics: dict, epoch: int, several_runs: bool):
    """Epoch `epoch`'s per-cell metrics ({name: [C]}): the overestimation watch and divergence.
    several_runs: the launch trains more than one run (log lines then name the run)."""
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
        log(f"seed {s}{self.where(several_runs)} diverged at epoch {epoch} ({quantity} "
            f"non-finite or beyond +-{self.config.agent.max_abs_loss:g}); it is frozen at its "
            "last healthy state, whose policy is still evaluated and counted in the summary "
            "(docs/protocol.md). The other seeds go on.")

  def open_loggers(self, start: int):
    """Opens the loggers besides metrics.csv (--log) for a run resuming at epoch `start` (0:
    fresh); self.rows are metrics.csv's rows up to there."""
    if self.loggers is not None and self.loggers.extra:
      self.loggers.open(self.spec.workdir, self.workdir.read_record(), self.seeds, self.rows,
                        start, log=log)

  def snapshot(self) -> dict:
    """What `add_evaluation` and `log_progress` read of the watch at an evaluation point (JSON):
    the rows of an evaluation written later (it ran while the next epochs trained and were
    watched) say what they would have said at once."""
    return dict(diverged=sorted(int(s) for s in self.diverged),
                flagged=[int(s) for s in self.q.flagged()], bound=float(self.q.bound))

  def eval_seed(self, epoch: int) -> int:
    """The seed of the evaluation at epoch `epoch` (evaluate.env_seeds spreads it over the run's
    seeds x episodes)."""
    return 10_000 * self.config.seed + epoch

  def add_evaluation(self, returns, last: dict, epoch: int, snap: Optional[dict] = None):
    """The evaluation at epoch `epoch`: returns [S, episodes] -> self.scores and its metrics.csv
    rows (also handed to self.loggers); last: the epoch's metrics {name: [C]}; snap: snapshot()
    taken at epoch `epoch` (None: the watch now)."""
    c = self.config
    snap = snap or self.snapshot()
    diverged, flagged = set(snap["diverged"]), set(snap["flagged"])
    self.scores = scores.normalized_score(self.spec.dataset, returns)   # [S, episodes]
    new = []
    for i, s in enumerate(self.seeds):
      cell = self.cell_slice.start + i
      row = dict(epoch=epoch, step=epoch * c.steps_per_epoch, seed=int(s),
                 return_mean=float(returns[i].mean()),
                 normalized_score=float(self.scores[i].mean()),
                 diverged=float(int(s) in diverged))
      row.update({k: float(v[cell]) for k, v in sorted(last.items())})
      row.update(q_bound=snap["bound"], overestimated=float(int(s) in flagged))
      new.append(row)
    self.rows += new
    self.workdir.write_rows(self.rows)
    if self.loggers is not None:
      self.loggers.write(new)

  def log_progress(self, last: dict, epoch: int, rate: float, eta: float, several_runs: bool,
                   snap: Optional[dict] = None):
    """The log line of the evaluation at epoch `epoch` (snap: as for `add_evaluation`)."""
    c, cells = self.config, self.cell_slice
    snap = snap or self.snapshot()
    log(f"epoch {epoch}/{c.epochs}{self.where(several_runs)}  {rate:.0f} steps/s (all "
        f"{'seeds' if not several_runs else 'cells'}, training alone: evaluations and checkpoints "
        f"apart; moving average over up to the last {RATE_POINTS * c.evaluation.eval_every} "
        "epochs)  score per seed "
        f"[{', '.join(f'{x:.1f}' for x in self.scores.mean(axis=1))}]  critic_loss "
        f"[{', '.join(f'{x:.3g}' for x in last['critic_loss'][cells])}]  q_mean "
        f"[{', '.join(f'{x:.4g}' for x in last['q_mean'][cells])}] (bound {snap['bound']:.4g})  "
        f"ETA {_fmt(eta)}"
        + (f"  OVERESTIMATED seeds {snap['flagged']}" if snap["flagged"] else "")
        + (f"  diverged seeds {snap['diverged']}" if snap["diverged"] else ""))

  def finish(self) -> dict:
    """summary.json and learning_curve.png; returns the summary. The log line gives the means
    over every seed, says how many diverged, and gives the healthy seeds' mean beside."""
    c, spec = self.config, self.spec
    diverged = sorted(self.diverged.values(), key=lambda d: d["seed"])
    summary = outputs.summarise(self.rows, self.seeds, diverged, self.q)
    self.workdir.write_summary(summary)
    title = f"{algorithms.label(c.algo, c.target, 'title')} on {spec.dataset}"
    self.workdir.plot(self.rows, self.seeds, title, sorted(self.diverged), self.dataset_score)
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


def build_evaluators(runs, workers=0):
  """Gives every run its Evaluator (shared by the runs of one eval_episodes and one eval env:
  envs.eval_env_spec of the run's dataset, so that an imported D4RL walker is evaluated in
  D4RL's model), unless built. In the main thread: it starts the env worker processes."""
  by_env = {}                              # the launch's runs share one env name (check_runs)
  for r in runs:
    if r.evaluator is None:
      spec = json.dumps(envs.eval_env_spec(r.spec.dataset), sort_keys=True)
      by_env.setdefault((r.config.evaluation.eval_episodes, spec), []).append(r)
  for (episodes, spec), missing in by_env.items():
    c, num_seeds = missing[0].config, sum(r.config.num_seeds for r in missing)
    evaluator = evaluate_lib.Evaluator(c, json.loads(spec), num_seeds, episodes, workers=workers)
    for r in missing:
      r.evaluator = evaluator


def returns_all(runs, actors, epoch, should_stop=None):
  """Every run's returns [S, episodes] at epoch `epoch` (a list in the order of `runs`), one
  pass per Evaluator (build_evaluators first). Writes nothing: safe in a background thread while
  the main thread trains. should_stop: Evaluator.run's (errors.Interrupted between time steps)."""
  by_evaluator = {}
  for r in runs:
    by_evaluator.setdefault(id(r.evaluator), []).append(r)
  out = {}
  for same in by_evaluator.values():
    episodes = same[0].config.evaluation.eval_episodes
    cells = np.concatenate([np.arange(r.cell_slice.start, r.cell_slice.stop) for r in same])
    seeds = np.concatenate([evaluate_lib.env_seeds(r.eval_seed(epoch), r.config.num_seeds,
                                                   episodes) for r in same])
    returns = same[0].evaluator.run(jax.tree.map(lambda x: x[cells], actors), seeds,
                                    should_stop=should_stop)
    offset = 0
    for r in same:
      out[id(r)] = returns[offset:offset + r.config.num_seeds]
      offset += r.config.num_seeds
  return [out[id(r)] for r in runs]


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


class Evaluation:
  """An evaluation point's returns computed in a background thread (process 0) while the device
  trains the next epochs; joined and written by the main thread, in epoch order (`finish`).

  The thread only computes returns (returns_all over the launch's Evaluators): every row, log
  line and checkpoint stays in the main thread."""

  def __init__(self, runs, actors, last, epoch, snaps, rate=None, eta=None):
    self.runs, self.last, self.epoch, self.snaps = runs, last, epoch, snaps
    self.rate, self.eta = rate, eta
    self.returns, self.error = None, None
    self.cancelled = threading.Event()
    self.thread = threading.Thread(target=self._work, args=(actors,), daemon=True,
                                   name=f"evaluate-epoch-{epoch}")
    self.thread.start()

  def _work(self, actors):
    try:
      self.returns = returns_all(self.runs, actors, self.epoch, self.cancelled.is_set)
    except BaseException as e:  # noqa: BLE001 -- re-raised in the main thread by finish()
      self.error = e

  def join(self, timeout=None):
    self.thread.join(timeout)

  def running(self) -> bool:
    return self.thread.is_alive()

  def cancel(self):
    """Ends the evaluation within one time step (its envs stay usable); it writes nothing."""
    self.cancelled.set()

  def finish(self, several_runs: bool):
    """Waits for the returns, then writes the point's rows (and log lines) as an evaluation done
    at once would have."""
    self.join()
    if self.error is not None:
      raise self.error
    for r, returns, snap in zip(self.runs, self.returns, self.snaps):
      r.add_evaluation(returns, self.last, self.epoch, snap)
      if self.rate is not None:
        r.log_progress(self.last, self.epoch, self.rate, self.eta, several_runs, snap)
