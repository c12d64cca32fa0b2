"""The uncertainty-quantifier experiment over trained runs (the paper's Table 2; docs/protocol.md,
"Table 2 (uncertainty quantifiers): the reading"; experiments.uncertainty is its CLI and documents
the definitions and the output columns).

This module owns the experiment's runs and outputs: finding the run workdirs (`find_run_dirs`),
scoring every seed of every run on policy or dataset tuples (`evaluate_runs`, one row per run and
seed), and writing uncertainty[_<states>].csv / .md (`write_outputs`, `table_markdown`: mean +- std
over seeds beside the paper's own Table 2 numbers). The per-tuple Bellman backups, penalties and
scores are mombo_jax.analysis.quantifier_quality's.
"""
import dataclasses
import os
from typing import NamedTuple, Optional, Tuple

import numpy as np

from mombo_jax.core import algorithms
from mombo_jax.errors import InvalidArgument, UserError
from mombo_jax.records import outputs, run_search, workdir
from mombo_jax.records.workdir import Workdir
from mombo_jax.report import footnotes, labels, markdown, paper_results, paper_setup, tables

# jax and the trained nets are imported where they are used: experiments.uncertainty imports this
# module before parsing its flags, and --help should not wait for jax.

STATES = ("policy", "dataset")


def find_run_dirs(dirs):
  """Run workdirs under `dirs` holding config.json and checkpoints/ (sorted); ValueError if none."""
  try:
    found, _ = run_search.find_runs(dirs, need=(workdir.CONFIG, workdir.CHECKPOINTS))
  except UserError as e:
    raise InvalidArgument(f"`dirs`: {e}", params=("dirs",)) from None
  if not found:
    raise InvalidArgument(f"No runs (config.json + checkpoints/) found under {', '.join(dirs)}.")
  return found


def output_names(states):
  """(csv, md) file names of a --states mode: the paper's mode keeps the plain names."""
  suffix = "" if states == "policy" else f"_{states}"
  return f"uncertainty{suffix}.csv", f"uncertainty{suffix}.md"


# The readings measured beside the chosen one (quantifier_quality.READINGS), per seed: B^ Q with
# the real reward (U the algorithm's own) and MOMBO's U as eq. (1) (B^ Q with the model's reward).
# Named like the columns before them (scores bare, means of U and of the error with _mean).
READING_COLUMNS = (
    "accuracy_real_reward", "tightness_real_reward", "accuracy_unscaled_real_reward",
    "tightness_unscaled_real_reward", "bellman_error_real_reward_mean",
    "accuracy_eq1", "tightness_eq1", "accuracy_unscaled_eq1", "tightness_unscaled_eq1",
    "penalty_eq1_mean", "penalty_unscaled_eq1_mean")


def _reading_value(res: dict, column: str) -> float:
  """A READING_COLUMNS value from uncertainty_quality's result (NaN where it was not computed)."""
  key = column if column.endswith("_mean") else f"{column}_mean"
  return float(res.get(key, float("nan")))


@dataclasses.dataclass(frozen=True)
class TupleSource:
  """Which tuples each seed is scored on: states "policy" (the paper's: `episodes` episodes of
  the seed's policy in the real env, every `every`-th transition and the last, the time limit
  max_episode_steps or the env's) or "dataset" (num_states transitions of the run's dataset)."""
  states: str = "policy"
  episodes: int = 10
  every: int = 10
  max_episode_steps: Optional[int] = None
  num_states: int = 1000


@dataclasses.dataclass(frozen=True)
class Scoring:
  """How each tuple is scored: `draws` model draws (one B^ Q and one U each), num_policy policy
  samples in the exact B Q, `chunk` tuples per jitted call (memory: num_policy x chunk critic
  rows)."""
  draws: int = 100
  num_policy: int = 1000
  chunk: int = 256
  # None: each run at its own moment mode; a list of modes (core/algorithms.py parse_moments): a
  # MOMBO run scored at each, on the same tuples and draws.
  moments: Optional[Tuple[str, ...]] = None


def evaluate_runs(run_dirs, source: TupleSource = TupleSource(), scoring: Scoring = Scoring(),
                  seed: int = 0, log=print):
  """One row per (run, seed, moment mode), as a dict of scalars: run, env, dataset, algo, moments,
  target, states, seed,
  epoch, beta, transitions (tuples scored), draws, num_policy, accuracy, tightness,
  accuracy_unscaled, tightness_unscaled, penalty_mean, penalty_unscaled_mean, bellman_error_mean,
  below (what the run has less of than the paper's setup, paper_setup.shortfalls; "" for none),
  then the READING_COLUMNS (each seed's mean over its tuples and draws; experiments.uncertainty
  defines them; the eq1 ones NaN for a run that is not MOMBO's). The fields of source and
  scoring, and seed, are experiments.uncertainty's flags of the same names; ValueError /
  FileNotFoundError (a dataset not found) for what the user can fix, among them a run whose
  dataset was rebuilt or replaced since it trained (trained.check_data). log: a line per run
  (what reading its checkpoint read and the peak memory, TrainedRun.memory_line) and a progress
  line per seed. scoring.moments: None (each run at its own moment mode) or a list of modes: a
  MOMBO run is scored at each, on the same tuples and draws, its rows labelled "MOMBO (<target>,
  moments=<mode>)" (so is a run trained at another mode than the diagonal, scored at its own); a
  run that does not moment-match once, at its own. Every row has a `moments` column."""

  # JAX and the trained nets only here (see the note at the top)
  import jax

  from mombo_jax.analysis import quantifier_quality, trained as trained_lib
  states = source.states
  if states not in STATES:
    raise InvalidArgument(f"states={states}: choose one of {', '.join(STATES)}.",
                          params=("states",))
  rows, datasets, loaded = [], {}, {}
  for path in run_dirs:
    trained = trained_lib.load_run(path)
    # Every run is checked against its dataset as it is now (a rebuilt one is refused, as
    # training refuses it); --states=policy reads only the dataset's name and env, so a dataset
    # that is not local is not needed there.
    if trained.dataset not in loaded:
      loaded[trained.dataset] = trained_lib.load_data(trained, required=states == "dataset")
    trained_lib.check_data(trained, loaded[trained.dataset])
    log(f"{path}: {trained.memory_line()}")
    config = trained.config
    # What the run has less of than the paper's setup (the report's one rule, paper_setup): its
    # cells are marked § and take no bold beside the paper's columns, as in report.md.
    below = "; ".join(paper_setup.shortfalls(Workdir(path).read_record()))
    if states == "dataset" and trained.dataset not in datasets:
      datasets[trained.dataset] = quantifier_quality.dataset_states(
          loaded[trained.dataset], source.num_states, seed)
    run = _Run(path, config, trained, states, below)
    modes = ([None] if scoring.moments is None or not config.algorithm.moment_matching
             else list(scoring.moments))
    for i, seed_nets in enumerate(trained.nets):
      # The real env of the run's dataset (envs.eval_env_spec): its evaluation's physics.
      batch = (datasets[trained.dataset] if states == "dataset" else
               quantifier_quality.real_transitions(seed_nets, trained.dataset, source.episodes,
                                                   seed + i, source.every,
                                                   source.max_episode_steps))
      for mode in modes:
        nets = seed_nets.with_moments(mode)
        res = quantifier_quality.uncertainty_quality(nets, batch, jax.random.PRNGKey(seed + i),
                                                     scoring.draws, scoring.num_policy,
                                                     scoring.chunk)
        algo = labels.algo_label(config.settings())
        if mode is not None or nets.config.agent.moments != "diagonal":
          # Another mode than the paper's is its own column (a run trained at it too).
          algo = f"{algo[:-1]}, moments={nets.config.agent.moments})"
        _append_row(rows, res, run, i, algo, nets.config.agent.moments, scoring, log)
  return rows


class _Run(NamedTuple):
  """What evaluate_runs' rows of one run share: its folder, Config, loaded run, the states scored
  ("policy" / "dataset") and what it has less of than the paper's setup."""
  path: str
  config: object
  trained: object
  states: str
  below: str


def _append_row(rows, res, run: _Run, i: int, algo: str, moments: str, scoring: Scoring, log):
  """evaluate_runs' row of seed i of `run` (at one moment mode) and its progress line."""
  config, trained = run.config, run.trained
  rows.append(dict(
      run=run.path, env=config.env_name, dataset=trained.dataset, algo=algo, moments=moments,
      target=algorithms.variant_of(config.algo, config.target), states=run.states,
      seed=trained.seeds[i], epoch=trained.epoch, beta=float(config.beta),
      transitions=int(len(res["exact"])), draws=int(scoring.draws),
      num_policy=int(scoring.num_policy),
      **{k: res[f"{k}_mean"] for k in ("accuracy", "tightness", "accuracy_unscaled",
                                       "tightness_unscaled")},
      penalty_mean=res["penalty_mean"], penalty_unscaled_mean=res["penalty_unscaled_mean"],
      bellman_error_mean=res["bellman_error_mean"], below=run.below,
      **{k: _reading_value(res, k) for k in READING_COLUMNS}))
  log(f"{run.path} seed {trained.seeds[i]} ({run.states} states, moments {moments}): "
      f"{len(res['exact'])} tuples x {scoring.draws} draws, accuracy "
      f"{res['accuracy_mean']:.2f} (unscaled {res['accuracy_unscaled_mean']:.2f}), tightness "
      f"{res['tightness_mean']:.3g} (unscaled {res['tightness_unscaled_mean']:.3g})")


class _Seeds:
  """Per-seed values of one (env, dataset, algo) for tables.build_table."""

  def __init__(self, rows, rename=None):
    self.rows, self.rename = rows, rename or {}
    # What the runs have less of than the paper's setup (rows' `below`, paper_setup.shortfalls):
    # tables.build_table marks such a cell BELOW_MARK and keeps it out of the bold / underline
    # beside the paper's columns, the same rule as report.md's.
    self.shortfalls = sorted({part for r in rows for part in str(r.get("below") or "").split("; ")
                              if part})

  def stat(self, what):
    """(mean, std) over the seeds of column `what` (after `rename`); (None, None) where no seed
    has it (a reading not computed for this algorithm, rows of an older CSV)."""
    what = self.rename.get(what, what)
    x = np.array([r.get(what, np.nan) for r in self.rows], float)
    return (float(x.mean()), float(x.std())) if x.size and not np.isnan(x).all() else (None, None)


METRICS = (("accuracy", "Accuracy (U as trained: beta / lambda included)"),
           ("tightness", "Tightness (U as trained)"),
           ("accuracy_unscaled", "Accuracy (U / beta)"),
           ("tightness_unscaled", "Tightness (U / beta)"))


# The readings' blocks: (title, the paper's metric name, our column, the paper's column beside
# it?): the paper's Table 2 numbers go beside the as-trained ones, as beside METRICS[:2].
READING_BLOCKS = tuple(
    (f"{metric.capitalize()}, {what} ({scales[suffix]})", metric, f"{metric}{suffix}_{reading}",
     not suffix)
    for reading, what, scales in (
        ("real_reward", "B^ Q with the real reward", {"": "U as trained", "_unscaled": "U / beta"}),
        ("eq1", "MOMBO's U as eq. (1)", {"": "times the run's beta", "_unscaled": "no beta"}))
    for suffix in ("", "_unscaled")
    for metric in ("accuracy", "tightness"))


# The paper's Table 2 column goes beside the blocks of its metric names (accuracy, tightness: U as
# trained). Its appendix does not settle what its U was, so the note says so instead of choosing.
PAPER_NOTE = (
    "*({paper})* columns: the paper's Table 2 ({citation}): mean ± std over its 4 seeds, on tuples "
    "of 10 evaluation episodes of its trained policies, every 10th step and the last (our "
    "`--states=policy`); – where it has none (it reports the 12 D4RL tasks only). They stand "
    "beside our *U as trained* blocks (beta / lambda included: the penalty training subtracts), "
    "but the paper does not say whether its U carried the coefficient (its definitions of U carry "
    "none), so they are as comparable with the *U / beta* blocks. Nor does it say which MOMBO "
    "quantifier it scored: its MOMBO runs are the released code's (target `{target}`), its "
    "written U is eq. (1)'s moment-matched std (our `lcb`), and the released code holds no "
    "Table 2 script. Both open points are measured: the blocks *B^ Q with the real reward* and "
    "*MOMBO's U as eq. (1)* (docs/protocol.md, \"Table 2 (uncertainty quantifiers): the "
    "reading\").")


def table_markdown(rows):
  """uncertainty.md: the paper's table per metric (mean +- std over seeds; the paper's Table 2
  numbers beside the as-trained accuracy and tightness), then the mean U and Bellman error per
  task and algorithm."""
  groups = {}
  for r in rows:
    groups.setdefault((r["env"], r["dataset"], r["algo"]), []).append(r)
  table = tables.build_table({k: _Seeds(v) for k, v in groups.items()}, metrics=METRICS, digits=3,
                             paper=True)
  for title, metric, column, paper in READING_BLOCKS:
    if any(np.isfinite(r.get(column, np.nan)) for r in rows):
      # Built under the paper's metric name, so that its Table 2 column can stand beside it. A
      # block without that column is still part of a table beside the paper's numbers: its §
      # cells take no bold either (the report's rule, tables.build_table's below_ranked).
      extra = tables.build_table({k: _Seeds(v, {metric: column}) for k, v in groups.items()},
                                 metrics=((metric, title),), digits=3, paper=paper,
                                 below_ranked=False)
      assert extra.rows == table.rows and extra.algos == table.algos
      table.blocks += extra.blocks
  states = sorted({r["states"] for r in rows})
  draws = sorted({r["draws"] for r in rows})
  policy = sorted({r["num_policy"] for r in rows})
  text = markdown.render_markdown(
      table, title=f"Uncertainty quantifiers (paper Table 2), states={','.join(states)}",
      what="over seeds of each seed's mean over its tuples and draws")
  # render_markdown's first note on the paper's columns describes Table 1 (scores after training);
  # these are Table 2's.
  generic = footnotes.paper_footnotes(table)
  if generic:
    text = text.replace(generic[0], PAPER_NOTE.format(
        paper=tables.PAPER, citation=paper_results.CITATION,
        target=paper_results.PAPER_MOMBO_TARGET), 1)
  lines = ["", "Accuracy = 1(U >= |B Q - B^ Q|), tightness = U - |B Q - B^ Q|, B Q the exact "
           f"backup on the real s' ({','.join(map(str, policy))} policy samples), B^ Q one "
           f"draw of the learned model ({','.join(map(str, draws))} draws per tuple) with the "
           "model's reward; *B^ Q with the real reward*: the same draws with the tuple's reward; "
           "*MOMBO's U as eq. (1)*: sqrt(var_r + gamma^2 (1-d) v_MM) of the drawing elite "
           "(MOMBO runs). See experiments/uncertainty.py and docs/protocol.md, \"Table 2 "
           "(uncertainty quantifiers): the reading\".", "",
           "## Mean U and Bellman error", "",
           "| Dataset | Algorithm | Seeds | Tuples | beta | U (as trained) | U / beta "
           "| abs(B Q - B^ Q) | U eq. (1) (times beta) | U eq. (1) | abs(B Q - B^ Q), real r |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

  def cell(stat, k):
    mean, std = stat(k)
    return "–" if mean is None else f"{mean:.4g} ± {std:.2g}"

  for (env, dataset, algo), seeds in sorted(groups.items()):
    stat = _Seeds(seeds).stat
    cells = [cell(stat, k) for k in ("penalty_mean", "penalty_unscaled_mean",
                                     "bellman_error_mean", "penalty_eq1_mean",
                                     "penalty_unscaled_eq1_mean",
                                     "bellman_error_real_reward_mean")]
    tuples = int(round(np.mean([s["transitions"] for s in seeds])))
    betas = ",".join(sorted({f"{s['beta']:g}" for s in seeds}))
    lines.append(f"| {dataset} | {algo} | {len(seeds)} | {tuples} | {betas} | "
                 + " | ".join(cells) + " |")
  return text + "\n".join(lines) + "\n"


def write_outputs(rows, out: str, states: str = "policy"):
  """Writes the rows as <out>/uncertainty[_<states>].csv and their tables as the .md beside it;
  returns (csv path, md path)."""
  os.makedirs(out, exist_ok=True)
  csv_path, md_path = (os.path.join(out, name) for name in output_names(states))
  outputs.write_rows(csv_path, rows)
  with open(md_path, "w") as f:
    f.write(table_markdown(rows))
  return csv_path, md_path
