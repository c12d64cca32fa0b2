"""Our runs' results, as the report reads them (the paper's are in mombo_jax.report.paper_results).

`read_run` reads one finished run (its workdir.Workdir: config.json, metrics.csv, summary.json;
every seed, a diverged one at its frozen policy: docs/protocol.md) and `group_runs` pools the
seeds of all runs of one (environment, dataset, algorithm, setup) into a Pool (a table cell),
refusing one (setup, seed) found in two folders. The setup (`setup_of`) is everything in
config.json but the seeds and the evaluation's schedule (NOT_SETUP): runs that differ in beta, the
budget (epochs, steps_per_epoch, ...), any hyperparameter or the data's identity are never pooled.

Metrics per seed: the final score (the last evaluation, what the paper's tables report), the mean
of the last LAST_K evaluations (less sensitive to one noisy evaluation than the final score) and
the AULC (mean over all evaluations). A Pool gives per metric the mean over every seed, the std
over seeds (population std, ddof = 0, as summary.json's) and a 95% percentile-bootstrap interval
of the mean over seeds (`bootstrap_ci`: resampling seeds, fixed RNG seed, so a report is
reproducible); `stat_healthy` the mean and std over the seeds that did not diverge.

Algorithm labels name everything that must not be pooled: MOMBO's Bellman target
('MOMBO (elite_spread)'; config.target) always, and, where runs of one algorithm differ in their
setup anywhere in the table, the fields that differ, in every label of that algorithm on every
dataset ('MOBILE (β=1.5)', 'MOMBO (elite_spread, epochs=10)'), so that one column is one setup
over all its rows. Tasks differ by design (each has its own paper settings: config.TASKS), so a
field counts as differing by how it stands to its task's paper-preset value
(paper_setup.token), not by its value (mombo_jax.report.labels). Labels, dataset types and
environments sort in the paper's order (`label_key`, TYPE_ORDER, ENV_ORDER).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mombo_jax.core import algorithms
from mombo_jax.errors import UserError
from mombo_jax.records import outputs
from mombo_jax.records.workdir import Workdir
from mombo_jax.report import paper_setup
from mombo_jax.report.labels import algo_label, column_labels, setup_of

TYPE_ORDER = ("random", "medium", "medium-replay", "medium-expert", "expert")
ENV_ORDER = ("halfcheetah", "hopper", "walker2d")
# Evaluations averaged by the 'last' metric (fewer when a run has fewer: then all of them).
LAST_K = 10
# Percentile bootstrap over seeds: level, resamples, RNG seed (fixed: the same runs always give
# the same interval).
CI_LEVEL = 0.95
N_BOOTSTRAP = 10_000
BOOTSTRAP_SEED = 0


@dataclasses.dataclass
class Run:
  """One run workdir, every seed. final, last, aulc: [S]; steps [T]; scores [T, S]."""
  path: str
  env: str               # halfcheetah | hopper | walker2d
  dataset: str           # short name (hopper-random) or Minari id
  algo: str              # table label (algo_label): MOPO | MOBILE | MOMBO (<target>)
  seeds: List[int]
  final: np.ndarray
  aulc: np.ndarray
  steps: np.ndarray
  scores: np.ndarray
  last: Optional[np.ndarray] = None   # mean of the last LAST_K evaluations per seed
  beta: Optional[float] = None        # config.beta (MOMBO / MOBILE beta, MOPO lambda)
  # Seeds whose critics' mean Q passed the return bound (summary.json 'overestimated'); None
  # where the run did not record it.
  overestimated: Optional[List[int]] = None
  # setup_of(config.json); None: {"beta": beta} (a Run built by hand).
  setup: Optional[dict] = None
  # summary.json's 'protocol' (outputs.PROTOCOL); None: written before the field existed.
  protocol: Optional[str] = None
  # Seeds that diverged (frozen at their last healthy policy, still evaluated and counted), with
  # the epoch each diverged at.
  diverged: Dict[int, int] = dataclasses.field(default_factory=dict)
  # What the run has less of than the paper's setup of its task (paper_setup.shortfalls).
  shortfalls: List[str] = dataclasses.field(default_factory=list)
  # The paper preset's config of its task (paper_setup.paper_config); None: unknown.
  paper: Optional[dict] = None
  gradient_steps: Optional[int] = None   # epochs x steps_per_epoch
  transitions: Optional[int] = None      # the dataset's transitions (config.json's data record)

  def setup_fields(self) -> dict:
    return dict(self.setup) if self.setup is not None else {"beta": self.beta}


@dataclasses.dataclass
class Pool:
  """All seeds of one (env, dataset, algo label), pooled over runs. Arrays as in Run."""
  env: str
  dataset: str
  algo: str
  runs: List[str]
  seeds: List[int]
  final: np.ndarray
  aulc: np.ndarray
  steps: np.ndarray
  scores: np.ndarray
  last: Optional[np.ndarray] = None
  beta: Optional[float] = None
  evaluations: int = 0   # the fewest evaluations of any of its runs (the 'last' metric's window)
  overestimated: Optional[List[int]] = None   # as Run's; None unless every run recorded it
  setup: Optional[dict] = None   # the setup its runs share (setup_of)
  # The setup fields that tell its algorithm's setups apart over the whole table (the ones its
  # label names); empty when the algorithm has one setup.
  differs: List[str] = dataclasses.field(default_factory=list)
  # {seed: epoch} of its seeds that diverged (counted at their frozen policy).
  diverged: Dict[int, int] = dataclasses.field(default_factory=dict)
  # What its runs have less of than the paper's setup (Run.shortfalls; its runs share a setup).
  shortfalls: List[str] = dataclasses.field(default_factory=list)
  gradient_steps: Optional[int] = None
  transitions: Optional[int] = None

  def values(self, what: str) -> np.ndarray:
    """Per-seed values [S] of 'final', 'last' or 'aulc'."""
    x = getattr(self, what)
    return np.asarray([] if x is None else x, float)

  def stat(self, what: str) -> Tuple[Optional[float], Optional[float]]:
    """(mean, std) over every seed of 'final', 'last' or 'aulc' (diverged ones included);
    (None, None) when there is none."""
    x = self.values(what)
    if x.size == 0:
      return None, None
    return float(np.mean(x)), float(np.std(x))

  def stat_healthy(self, what: str) -> Tuple[Optional[float], Optional[float]]:
    """(mean, std) over the seeds that did not diverge; (None, None) when none is left."""
    x = self.values(what)[[s not in self.diverged for s in self.seeds]]
    if x.size == 0:
      return None, None
    return float(np.mean(x)), float(np.std(x))

  def ci(self, what: str) -> Tuple[Optional[float], Optional[float]]:
    """95% percentile-bootstrap interval of the mean over seeds (bootstrap_ci)."""
    return bootstrap_ci(self.values(what))


def bootstrap_ci(x, level: float = CI_LEVEL, n_resamples: int = N_BOOTSTRAP,
                 seed: int = BOOTSTRAP_SEED) -> Tuple[Optional[float], Optional[float]]:
  """Percentile bootstrap interval of the mean of x [S] over its entries (seeds): resample S
  seeds with replacement n_resamples times, take the (1 -+ level) / 2 quantiles of the resampled
  means. One seed: the point itself; none: (None, None). With few seeds the interval cannot reach
  past the observed seeds and is too narrow (4 seeds: it spans at most their range); read it
  together with the number of seeds."""
  x = np.asarray(x, float).ravel()
  if x.size == 0:
    return None, None
  if x.size == 1 or np.all(x == x[0]):
    return float(x[0]), float(x[0])
  rng = np.random.default_rng(seed)
  means = x[rng.integers(0, x.size, (n_resamples, x.size))].mean(axis=1)
  lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
  return float(lo), float(hi)


def ordered(values, order) -> list:
  """values sorted by their place in `order` (e.g. ENV_ORDER); the ones it lacks last, by name."""
  return sorted(values, key=lambda v: (order.index(v) if v in order else len(order), v))


def dataset_type(dataset: str) -> str:
  """'hopper-medium-replay' -> 'medium-replay'; a Minari id ('mujoco/hopper/expert-v0') is its
  own type."""
  env, _, quality = dataset.partition("-")
  return quality if env in ENV_ORDER and quality else dataset


# ---------------------------------------------------------------------------------- discovery

def read_run(path: str) -> Run:
  """One workdir -> Run (every seed). Raises ValueError on unreadable or inconsistent files, and
  UserError (one line) for a seed without a finite score at every evaluation: under the protocol
  every seed counts, so a run that cannot count one (a seed lost by a version that did not keep
  evaluating a frozen policy) is not reported by leaving it out."""
  wd = Workdir(path)
  try:
    config, summary, rows = wd.read_record(), wd.read_summary(), wd.read_rows()
  except (OSError, ValueError, KeyError, UserError) as e:
    raise ValueError(f"unreadable ({type(e).__name__}: {e})") from None
  if config.get("algo_module"):       # its labels (variants) come from its registered record
    algorithms.ensure(str(config.get("algo")), config["algo_module"])
  if not rows:
    raise ValueError("metrics.csv holds no evaluation rows")
  env = str(config.get("env", ""))
  dataset = str(config.get("dataset") or env)
  diverged = {int(d["seed"]): int(d.get("epoch", -1)) for d in summary.get("diverged", [])}
  seeds = [int(s) for s in summary["seeds"]]
  try:
    steps, table = outputs.score_table(rows, seeds, key="step")
  except KeyError as e:
    raise ValueError(f"metrics.csv lacks the evaluation {e} of a seed in summary.json") from None
  scores = table.reshape(len(steps), len(seeds))
  final = np.asarray(summary["final_normalized_score"], float)
  aulc = np.asarray(summary["aulc"], float)
  if final.shape != (len(seeds),) or aulc.shape != (len(seeds),):
    raise ValueError("summary.json's per-seed lists do not match its seeds")
  lost = [s for i, s in enumerate(seeds) if not (np.all(np.isfinite(scores[:, i]))
                                                  and np.isfinite(final[i] + aulc[i]))]
  if lost:
    raise UserError(f"{path}: seed(s) {', '.join(map(str, lost))} have no finite score at every "
                    "evaluation in metrics.csv / summary.json, and every seed counts "
                    f"({outputs.PROTOCOL_DOC}): train the run again with this version (a diverged "
                    "seed is evaluated at its frozen policy), or leave its folder out.")
  beta = config.get("beta")
  flags = summary.get("overestimated")
  over = ([s for s, f in zip(seeds, flags) if f]
          if isinstance(flags, list) and len(flags) == len(seeds) else None)
  protocol = summary.get("protocol")
  return Run(path=path, env=env.partition("-")[0], dataset=dataset, algo=algo_label(config),
             seeds=seeds, final=final, aulc=aulc, steps=np.asarray(steps),
             scores=scores, last=scores[-LAST_K:].mean(axis=0),
             beta=None if beta is None else float(beta), overestimated=over,
             setup=setup_of(config), protocol=None if protocol is None else str(protocol),
             diverged=diverged, shortfalls=paper_setup.shortfalls(config),
             paper=paper_setup.paper_config(config),
             gradient_steps=paper_setup.gradient_steps(config),
             transitions=paper_setup.transitions(config))


def beta_text(beta: Optional[float]) -> str:
  """config.beta as labels and tables print it; '?' where a run did not record it."""
  return "?" if beta is None else f"{beta:g}"


def check_duplicates(runs: Sequence[Run]):
  """Refuses (UserError, one line naming the two folders and the fix) one seed of one algorithm,
  dataset and setup found in two run folders: pooled, it would count twice (and two identical
  runs would show a std of 0)."""
  seen: Dict[tuple, str] = {}
  for r in runs:
    key = (r.env, r.dataset, r.algo, paper_setup.setup_key(r.setup_fields()))
    for s in r.seeds:
      other = seen.setdefault(key + (s,), r.path)
      if other != r.path:
        raise UserError(f"Seed {s} of {r.algo} on {r.dataset} (one setup) is in two run folders, "
                        f"{other} and {r.path}, and a seed counts once: leave one of them out of "
                        "the folders searched, or train one with another `seed`.", params=("seed",))


def group_runs(runs: Sequence[Run]) -> Tuple[Dict[tuple, Pool], List[str]]:
  """{(env, dataset, label): Pool} pooling the seeds of the runs of one algorithm on one dataset
  with one setup (Run.setup_fields: config.json but the seeds and evaluation fields); curves are
  kept at the evaluation steps all of them share. Runs of one algorithm whose setups differ are
  separate groups, each label naming the fields that differ over the whole table
  (`labels.column_labels`): pooling them would average two different experiments. One (setup, seed)
  in two folders is refused (check_duplicates). Returns (groups, warnings)."""
  check_duplicates(runs)
  by_key: Dict[tuple, List[Run]] = {}
  for r in runs:
    by_key.setdefault((r.env, r.dataset, r.algo, paper_setup.setup_key(r.setup_fields())),
                      []).append(r)
  labels = column_labels({k: m[0] for k, m in by_key.items()})
  groups, warnings = {}, []
  for (env, dataset, algo, skey), members in by_key.items():
    label, names = labels[(env, dataset, algo, skey)]
    beta = members[0].beta
    key = (env, dataset, label)
    steps = members[0].steps
    for r in members[1:]:
      steps = np.intersect1d(steps, r.steps)
    if any(len(r.steps) != len(steps) for r in members):
      warnings.append(f"warning: {label} on {dataset}: runs evaluated at different steps; the "
                      f"curve keeps the {len(steps)} steps they share")
    evaluations = min(len(r.steps) for r in members)
    if evaluations < LAST_K:
      warnings.append(f"warning: {label} on {dataset}: a run has only {evaluations} evaluations; "
                      f"its 'last {LAST_K}' is the mean of all of them")
    over = None if any(r.overestimated is None for r in members) else \
        [s for r in members for s in r.overestimated]
    for r in members:
      if r.overestimated:
        warnings.append(f"warning: {label} on {dataset}: in {r.path}, the critics' mean Q of "
                        f"seed(s) {', '.join(map(str, r.overestimated))} passed the return bound "
                        "(overestimation); their scores are in the table")
      if r.diverged:
        warnings.append(f"warning: {label} on {dataset}: in {r.path}, seed(s) "
                        f"{', '.join(map(str, sorted(r.diverged)))} diverged; counted at their "
                        "frozen policy, as every seed is")
    cols = [r.scores[np.isin(r.steps, steps)] for r in members]
    groups[key] = Pool(env=env, dataset=dataset, algo=label, runs=[r.path for r in members],
                        seeds=[s for r in members for s in r.seeds],
                        final=np.concatenate([r.final for r in members]),
                        aulc=np.concatenate([r.aulc for r in members]), steps=steps,
                        scores=np.concatenate(cols, axis=1),
                        last=np.concatenate([r.scores[-LAST_K:].mean(axis=0) if r.last is None
                                             else r.last for r in members]),
                        beta=beta, evaluations=evaluations, overestimated=over,
                        setup=members[0].setup_fields(), differs=list(names),
                        diverged={s: e for r in members for s, e in r.diverged.items()},
                        shortfalls=list(members[0].shortfalls),
                        gradient_steps=members[0].gradient_steps,
                        transitions=members[0].transitions)
  return groups, warnings


