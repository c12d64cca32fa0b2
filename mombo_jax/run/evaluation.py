"""An evaluation point of a launch's runs: their Evaluators (build_evaluators: one set of envs for
every run of one env, stepped over the host's cores), every run's returns in one pass
(returns_all), and the pass in a background thread while the device trains on (Evaluation: the
thread computes returns only; the main thread writes them, HostRun.write_evaluation).
"""
from __future__ import annotations

import json
import threading
from typing import Dict, Optional, Sequence

import jax
import numpy as np

from mombo_jax.env import envs, evaluate as evaluate_lib


def build_evaluators(runs, workers: int = 0):
  """Gives every run (host_run.HostRun) its Evaluator, shared by the runs of one eval_episodes and
  one eval env (envs.eval_env_spec of the run's dataset, so that an imported D4RL walker is
  evaluated in D4RL's model), unless built. In the main thread: it starts the env worker
  processes."""
  by_env = {}                              # the launch's runs share one env name (check_runs)
  for r in runs:
    if r.evaluator is None:
      env_spec = json.dumps(envs.eval_env_spec(r.spec.dataset), sort_keys=True)
      by_env.setdefault((r.config.evaluation.eval_episodes, env_spec), []).append(r)
  for (episodes, env_spec), missing in by_env.items():
    c, num_seeds = missing[0].config, sum(r.config.num_seeds for r in missing)
    evaluator = evaluate_lib.Evaluator(c, json.loads(env_spec), num_seeds, episodes,
                                       workers=workers)
    for r in missing:
      r.evaluator = evaluator


def returns_all(runs: Sequence, actors, epoch: int, should_stop=None) -> Dict[object, np.ndarray]:
  """{run: its returns [S, episodes]} at epoch `epoch` (actors: every cell's actor parameters
  [C, ...]), one pass per Evaluator (build_evaluators first). Writes nothing: safe in a background
  thread while the main thread trains. should_stop: Evaluator.run's (errors.Interrupted between
  time steps)."""
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
      out[r] = returns[offset:offset + r.config.num_seeds]
      offset += r.config.num_seeds
  return out


class Evaluation:
  """An evaluation point's returns computed in a background thread (process 0) while the device
  trains the next epochs; joined and written by the main thread, in epoch order (`write`).

  The thread only computes returns (returns_all over the launch's Evaluators): every row, log
  line and checkpoint stays in the main thread. Each run holds what writing its rows needs
  (HostRun.point, marked before this starts)."""

  def __init__(self, runs, actors, epoch: int, rate: Optional[float] = None,
               eta: Optional[float] = None):
    self.runs, self.epoch, self.rate, self.eta = list(runs), epoch, rate, eta
    self.returns, self.error = None, None
    self.cancelled = threading.Event()
    self.thread = threading.Thread(target=self._work, args=(actors,), daemon=True,
                                   name=f"evaluate-epoch-{epoch}")
    self.thread.start()

  def _work(self, actors):
    try:
      self.returns = returns_all(self.runs, actors, self.epoch, self.cancelled.is_set)
    except BaseException as e:  # noqa: BLE001 -- re-raised in the main thread by write()
      self.error = e

  def join(self, timeout=None):
    self.thread.join(timeout)

  def running(self) -> bool:
    return self.thread.is_alive()

  def cancel(self):
    """Ends the evaluation within one time step (its envs stay usable); it writes nothing."""
    self.cancelled.set()

  def write(self):
    """Waits for the returns, then writes each run's rows (and progress line) as an evaluation
    done at once would have."""
    self.join()
    if self.error is not None:
      raise self.error
    for r in self.runs:
      r.write_evaluation(self.returns[r], self.rate, self.eta)
