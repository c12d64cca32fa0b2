"""One group (workdir) of a launch on the host: its record during training (GroupRun: metrics
rows, the overestimation watch, diverged seeds, the evaluator, the loggers) and what the training
loop (runner.loop) does with it: watch each epoch's metrics, evaluate, log progress, and finish
(summary.json, the curve). A launch evaluates all its groups in one pass (one set of envs for
every cell, stepped over the host's cores), in a background thread while the device trains on
(Evaluation: the thread computes returns only; the main thread records them), and writes on
resume the rows of an evaluation a killed launch lost (recover).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import threading
from typing import Any, List

import jax
import numpy as np

from mombo_jax.core import algorithms, train as train_lib
from mombo_jax.data import scores
from mombo_jax.env import envs, evaluate as evaluate_lib
from mombo_jax.errors import Interrupted
from mombo_jax.records import outputs
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import distributed
from mombo_jax.run.console import log
from mombo_jax.run.groups import Group


@dataclasses.dataclass
class GroupRun:
  """A group during a launch: its cells' slice of the program's cell axis and the host-side record
  of its run (metrics rows, overestimation watch, diverged seeds, evaluator)."""
  group: Group
  workdir: Workdir
  cells: slice
  seeds: Any                   # int [S]
  ckpt: Any                    # checkpoint.RunCheckpointer
  rows: List[dict] = dataclasses.field(default_factory=list)
  q: Any = None                # overestimation.OverestimationWatch
  diverged: dict = dataclasses.field(default_factory=dict)   # seed -> {seed, epoch, quantity}
  evaluator: Any = None
  scores: Any = None           # normalised scores [S, episodes] of the last evaluation
  loggers: Any = None          # loggers.RunLoggers: where the rows go besides metrics.csv (--log)
  unwritten_eval: Any = None   # the checkpoint's `eval` metadata when metrics.csv lacks the rows
                               # of the epoch resumed at (runner.recover writes them)
  dataset_score: Any = None    # mean normalised return of the dataset's own episodes (its
                               # behaviour policy's), shown beside the final score

  @property
  def config(self):
    return self.group.config

  def where(self, several_groups: bool) -> str:
    return f" [{self.group.label()}]" if several_groups else ""


def watch(runs, metrics, epoch, config, several_groups):
  """Epoch `epoch`'s per-cell metrics ({name: [C]}): the overestimation watch and divergence.
  several_groups: the launch trains more than one group (log lines then name the group)."""
  frozen = metrics["diverged"]
  for r in runs:
    for i, s in zip(range(r.cells.start, r.cells.stop), r.seeds):
      q = metrics["q_mean"][i]
      # A frozen seed's metrics are its failed epoch's (maybe NaN): not watched.
      if not frozen[i] and r.q.update(int(s), epoch, q):
        log(f"warning: seed {s} of {r.group.dataset} beta={r.config.beta:g} overestimates: the "
            f"critics' mean Q {q:.4g} passed the return bound max|r|/(1-gamma) = {r.q.bound:.4g} "
            f"at epoch {epoch}. Training goes on; the seed is flagged `overestimated` in "
            "summary.json.")
      if frozen[i] and int(s) not in r.diverged:
        quantity = ", ".join(k for k in train_lib.DIVERGENCE_CHECKS
                             if bool(metrics[f"diverged/{k}"][i])) or "unknown"
        r.diverged[int(s)] = {"seed": int(s), "epoch": epoch, "quantity": quantity}
        log(f"seed {s}{r.where(several_groups)} diverged at epoch {epoch} ({quantity} non-finite "
            f"or beyond +-{config.agent.max_abs_loss:g}); it is frozen at its last healthy state, "
            "whose policy is still evaluated and counted in the summary (docs/protocol.md). The "
            "other seeds go on.")


def log_reference_scores(runs):
  shown = {}
  for r in runs:
    shown.setdefault(r.group.dataset, scores.ref_scores(r.group.dataset))
  for name, (ref_min, ref_max, source) in shown.items():
    log(f"Normalised scores{'' if len(shown) == 1 else f' of {name}'} use R_random={ref_min:.2f}, "
        f"R_expert={ref_max:.2f} ({source}).")


def open_loggers(r: GroupRun, start: int):
  """Opens group r's loggers besides metrics.csv (--log) for a run resuming at epoch `start` (0:
  fresh); r.rows are metrics.csv's rows up to there."""
  if r.loggers is not None and r.loggers.extra:
    r.loggers.open(r.group.workdir, r.workdir.read_record(), r.seeds, r.rows, start, log=log)


def build_evaluators(runs, workers=0):
  """Gives every group its Evaluator (shared by the groups of one eval_episodes and one eval env:
  envs.eval_env_spec of the group's dataset, so that an imported D4RL walker is evaluated in
  D4RL's model), unless built. In the main thread: it starts the env worker processes."""
  by_env = {}                              # the launch's groups share one env name (check_groups)
  for r in runs:
    if r.evaluator is None:
      spec = json.dumps(envs.eval_env_spec(r.group.dataset), sort_keys=True)
      by_env.setdefault((r.config.evaluation.eval_episodes, spec), []).append(r)
  for (episodes, spec), missing in by_env.items():
    c, num_seeds = missing[0].config, sum(r.config.num_seeds for r in missing)
    evaluator = evaluate_lib.Evaluator(c, json.loads(spec), num_seeds, episodes, workers=workers)
    for r in missing:
      r.evaluator = evaluator


def returns_all(runs, actors, epoch, should_stop=None):
  """Every group's returns [S, episodes] at epoch `epoch` (a list in the order of `runs`), one
  pass per Evaluator (build_evaluators first). Writes nothing: safe in a background thread while
  the main thread trains. should_stop: Evaluator.run's (errors.Interrupted between time steps)."""
  by_evaluator = {}
  for r in runs:
    by_evaluator.setdefault(id(r.evaluator), []).append(r)
  out = {}
  for same in by_evaluator.values():
    episodes = same[0].config.evaluation.eval_episodes
    cells = np.concatenate([np.arange(r.cells.start, r.cells.stop) for r in same])
    seeds = np.concatenate([evaluate_lib.env_seeds(eval_seed(r, epoch), r.config.num_seeds,
                                                   episodes) for r in same])
    returns = same[0].evaluator.run(jax.tree.map(lambda x: x[cells], actors), seeds,
                                    should_stop=should_stop)
    offset = 0
    for r in same:
      out[id(r)] = returns[offset:offset + r.config.num_seeds]
      offset += r.config.num_seeds
  return [out[id(r)] for r in runs]


def snapshot(r: GroupRun) -> dict:
  """What `record` and `log_progress` read of r's watch at an evaluation point (JSON): the rows of
  an evaluation recorded later (it ran while the next epochs trained and were watched) say what
  they would have said at once."""
  return dict(diverged=sorted(int(s) for s in r.diverged), flagged=[int(s) for s in r.q.flagged()],
              bound=float(r.q.bound))


def eval_seed(r: GroupRun, epoch) -> int:
  """The seed of group r's evaluation at epoch `epoch` (evaluate.env_seeds spreads it over the
  group's seeds x episodes)."""
  return 10_000 * r.config.seed + epoch


def record(r: GroupRun, returns, last, epoch, snap=None):
  """Group r's evaluation at epoch `epoch`: returns [S, episodes] -> r.scores and its metrics.csv
  rows (also handed to r.loggers); last: the epoch's metrics {name: [C]}; snap: snapshot(r) taken
  at epoch `epoch` (None: r's watch now)."""
  c = r.config
  snap = snap or snapshot(r)
  diverged, flagged = set(snap["diverged"]), set(snap["flagged"])
  r.scores = scores.normalized_score(r.group.dataset, returns)   # [S, episodes]
  new = []
  for i, s in enumerate(r.seeds):
    cell = r.cells.start + i
    row = dict(epoch=epoch, step=epoch * c.steps_per_epoch, seed=int(s),
               return_mean=float(returns[i].mean()), normalized_score=float(r.scores[i].mean()),
               diverged=float(int(s) in diverged))
    row.update({k: float(v[cell]) for k, v in sorted(last.items())})
    row.update(q_bound=snap["bound"], overestimated=float(int(s) in flagged))
    new.append(row)
  r.rows += new
  r.workdir.write_rows(r.rows)
  if r.loggers is not None:
    r.loggers.write(new)


# Evaluation intervals the progress line's steps/s is averaged over (runner.loop: a moving average;
# a launch-long mean hides a change of pace, one interval's is noisy).
RATE_POINTS = 3


class Pace:
  """The progress line's steps/s: a moving average over the last RATE_POINTS evaluation
  intervals (the launch's start counting as the first point)."""

  def __init__(self, epoch: int, now: float):
    self.marks = collections.deque([(epoch, now)], maxlen=RATE_POINTS + 1)

  def rate(self, epoch: int, now: float, steps_per_epoch: int) -> float:
    """Records the point (epoch, now); steps per second (steps_per_epoch: of all cells) since the
    oldest point kept."""
    self.marks.append((epoch, now))
    (e0, t0), (e1, t1) = self.marks[0], self.marks[-1]
    return (e1 - e0) * steps_per_epoch / max(t1 - t0, 1e-9)


def log_progress(r: GroupRun, last, epoch, rate, eta, several_groups, snap=None):
  """The log line of group r's evaluation at epoch `epoch` (snap: as for `record`)."""
  c, cells = r.config, r.cells
  snap = snap or snapshot(r)
  log(f"epoch {epoch}/{c.epochs}{r.where(several_groups)}  {rate:.0f} steps/s (all "
      f"{'seeds' if not several_groups else 'cells'}, moving average over up to the last "
      f"{RATE_POINTS * c.evaluation.eval_every} epochs)  score per seed "
      f"[{', '.join(f'{x:.1f}' for x in r.scores.mean(axis=1))}]  critic_loss "
      f"[{', '.join(f'{x:.3g}' for x in last['critic_loss'][cells])}]  q_mean "
      f"[{', '.join(f'{x:.4g}' for x in last['q_mean'][cells])}] (bound {snap['bound']:.4g})  "
      f"ETA {_fmt(eta)}"
      + (f"  OVERESTIMATED seeds {snap['flagged']}" if snap["flagged"] else "")
      + (f"  diverged seeds {snap['diverged']}" if snap["diverged"] else ""))


def finish(r: GroupRun) -> dict:
  """Group r's summary.json and learning_curve.png; returns the summary. The log line gives the
  means over every seed, says how many diverged, and gives the healthy seeds' mean beside."""
  c, g = r.config, r.group
  diverged = sorted(r.diverged.values(), key=lambda d: d["seed"])
  summary = outputs.summarise(r.rows, r.seeds, diverged, r.q)
  r.workdir.write_summary(summary)
  title = f"{algorithms.label(c.algo, c.target, 'title')} on {g.dataset}"
  r.workdir.plot(r.rows, r.seeds, title, sorted(r.diverged), r.dataset_score)
  log(f"{finish_line(summary, r.q, r.dataset_score)}; wrote {g.workdir}")
  return summary


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
  trains the next epochs; joined and recorded by the main thread, in epoch order (`finish`).

  The thread only computes returns (returns_all over the launch's Evaluators): every
  record, log line and checkpoint stays in the main thread."""

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
    """Ends the evaluation within one time step (its envs stay usable); it records nothing."""
    self.cancelled.set()

  def finish(self, several_groups):
    """Waits for the returns, then writes the point's rows (and log lines) as an evaluation done
    at once would have."""
    self.join()
    if self.error is not None:
      raise self.error
    for r, returns, snap in zip(self.runs, self.returns, self.snaps):
      record(r, returns, self.last, self.epoch, snap)
      if self.rate is not None:
        log_progress(r, self.last, self.epoch, self.rate, self.eta, several_groups, snap)


def recover(unwritten, program, eval_workers=0, should_stop=None):
  """Writes the rows of the evaluation at program.start (program: program.Program) that a launch
  killed after that checkpoint lost (groups `unwritten`: r.unwritten_eval the checkpoint's `eval`
  metadata), evaluating the restored actors with that point's env seeds: the returns the lost
  evaluation had."""
  actors = distributed.to_host(program.state.agent.actor.params)
  if not distributed.is_main():
    for r in unwritten:
      r.unwritten_eval = None
    return
  build_evaluators(unwritten, eval_workers)
  epoch = program.start
  try:
    every = returns_all(unwritten, actors, epoch, should_stop)
  except Interrupted as e:      # nothing is lost: the checkpoint still holds what it needs
    raise Interrupted(e.signum, f"the evaluation of epoch {epoch} (redone on resume)") from None
  for r, returns in zip(unwritten, every):
    last = {}
    # The group's cells' values -> the launch's axis [C].
    for k, v in r.unwritten_eval["last"].items():
      full = np.full(program.num_cells, np.nan)
      full[r.cells] = v
      last[k] = full
    record(r, returns, last, epoch, r.unwritten_eval)
    log(f"Wrote the evaluation of epoch {epoch}{r.where(len(unwritten) > 1)}, which the stopped "
        "launch had not written.")
    r.unwritten_eval = None
