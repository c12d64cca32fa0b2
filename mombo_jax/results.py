"""Our runs' results, as the report reads them (the paper's are in mombo_jax.paper_results).

`read_run` reads one finished run (its workdir.Workdir: config.json, metrics.csv, summary.json;
healthy seeds only) and `group_runs` pools the seeds of all runs of one (environment, dataset,
algorithm, setup) into a Pool (a table cell). The setup (`setup_of`) is everything in config.json
but the seeds and the evaluation's schedule (NOT_SETUP): runs that differ in beta, the budget
(epochs, steps_per_epoch, ...), any hyperparameter or the data's identity are never pooled.

Metrics per seed: the final score (the last evaluation, what the paper's tables report), the mean
of the last LAST_K evaluations (less sensitive to one noisy evaluation than the final score) and
the AULC (mean over all evaluations). A Pool gives per metric the mean over seeds, the std over
seeds (population std, ddof = 0, as summary.json's) and a 95% percentile-bootstrap interval of the
mean over seeds (`bootstrap_ci`: resampling seeds, fixed RNG seed, so a report is reproducible).

Algorithm labels name everything that must not be pooled: MOMBO's Bellman target
('MOMBO (elite_spread)'; config.target) always, and, where runs of one algorithm on one dataset
differ in their setup, exactly the fields that differ ('MOBILE (β=1.5)', 'MOMBO (elite_spread,
epochs=10)'). Labels, dataset types and environments sort in the paper's order (`label_key`,
TYPE_ORDER, ENV_ORDER).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from mombo_jax import outputs
from mombo_jax.errors import UserError
from mombo_jax.workdir import Workdir

# Column order of the paper (baselines first); MOMBO's targets in the order of SPEC.md section 3.
_BASE_ORDER = ("MOPO", "MOBILE", "MOMBO")
_TARGET_ORDER = ("lcb", "elite_spread", "mixture")
TYPE_ORDER = ("random", "medium", "medium-replay", "medium-expert", "expert")
ENV_ORDER = ("halfcheetah", "hopper", "walker2d")
# Evaluations averaged by the 'last' metric (fewer when a run has fewer: then all of them).
LAST_K = 10
# Percentile bootstrap over seeds: level, resamples, RNG seed (fixed: the same runs always give
# the same interval).
CI_LEVEL = 0.95
N_BOOTSTRAP = 10_000
BOOTSTRAP_SEED = 0
# config.json fields that are not part of a run's setup: the seeds (pooling them is the point), the
# evaluation's schedule and its record (eval_every, eval_episodes, eval_changes: they change how
# often and how precisely a run is measured, not what was trained; a warning names runs evaluated
# at different steps), how often dynamics training checkpoints, and the fields the group key
# holds already (env, dataset, algo, target).
NOT_SETUP = ("seed", "num_seeds", "eval_every", "eval_episodes", "eval_changes",
             "dyn_checkpoint_every_s", "env", "dataset", "algo", "target")


@dataclasses.dataclass
class Run:
  """One run workdir, healthy seeds only. final, last, aulc: [S]; steps [T]; scores [T, S]."""
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
  # The setup fields that tell it from the other setups of its algorithm on its dataset (the ones
  # its label names); empty when it is the only one.
  differs: List[str] = dataclasses.field(default_factory=list)

  def values(self, what: str) -> np.ndarray:
    """Per-seed values [S] of 'final', 'last' or 'aulc'."""
    x = getattr(self, what)
    return np.asarray([] if x is None else x, float)

  def stat(self, what: str) -> Tuple[Optional[float], Optional[float]]:
    """(mean, std) over seeds of 'final', 'last' or 'aulc'; (None, None) when no healthy seed is
    left."""
    x = self.values(what)
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


def algo_label(config: dict) -> str:
  """'MOPO', 'MOBILE', or 'MOMBO (<target>)': MOMBO's Bellman target (config.target: lcb |
  elite_spread | mixture) changes the algorithm, so every MOMBO label names it and runs of two
  targets are never pooled. A MOMBO config without a target is 'MOMBO (target?)' rather than a
  guess."""
  algo = str(config.get("algo", "?")).upper()
  if algo == "MOMBO":
    return f"MOMBO ({config.get('target') or 'target?'})"
  return algo


def _parse_label(label: str) -> Tuple[str, Optional[str], Optional[float], List[str]]:
  """'MOMBO (elite_spread, β=3, epochs=10)' -> ('MOMBO', 'elite_spread', 3.0, ['epochs=10']);
  'MOBILE' -> ('MOBILE', None, None, [])."""
  m = re.fullmatch(r"(.*?)(?: \((.*)\))?", label)
  base, inner = m.group(1), m.group(2)
  variant, beta, extra = None, None, []
  for part in (inner.split(", ") if inner else []):
    if part.startswith("β="):
      try:
        beta = float(part[2:])
      except ValueError:
        extra.append(part)
    elif "=" in part or variant is not None:
      extra.append(part)
    else:
      variant = part
  return base, variant, beta, extra


def label_key(label: str):
  """Sort key of column labels: the paper's order of algorithms, then target, then beta, then
  the other setup fields a label names."""
  base, variant, beta, extra = _parse_label(label)
  return (_BASE_ORDER.index(base) if base in _BASE_ORDER else len(_BASE_ORDER), base,
          _TARGET_ORDER.index(variant) if variant in _TARGET_ORDER else len(_TARGET_ORDER),
          variant or "", -math.inf if beta is None else beta, [_natural(p) for p in extra], label)


def _natural(text: str):
  """'epochs=100' sorts after 'epochs=20': numbers compare as numbers."""
  return [(0, float(t), "") if re.fullmatch(r"-?\d+(\.\d*)?(e-?\d+)?", t) else (1, 0.0, t)
          for t in re.split(r"(-?\d+(?:\.\d*)?(?:e-?\d+)?)", text) if t]


def ordered(values, order) -> list:
  """values sorted by their place in `order` (e.g. ENV_ORDER); the ones it lacks last, by name."""
  return sorted(values, key=lambda v: (order.index(v) if v in order else len(order), v))


def base_algo(label: str) -> str:
  """'MOMBO (elite_spread, β=3)' -> 'MOMBO'."""
  return _parse_label(label)[0]


def setup_of(config: dict) -> dict:
  """A run's setup: its config.json without the NOT_SETUP fields (JSON values: lists for
  tuples; 'data', the dataset's identity, included where recorded)."""
  return {k: v for k, v in config.items() if k not in NOT_SETUP}


def _setup_key(setup: dict) -> str:
  """Setups alike exactly when their keys are: JSON of the canonical values (1 and 1.0 alike: a
  flag typed as an integer changes nothing)."""
  return json.dumps(_canonical(setup), sort_keys=True, default=str)


def _canonical(value):
  if isinstance(value, dict):
    return {k: _canonical(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_canonical(v) for v in value]
  if isinstance(value, float) and value.is_integer():
    return int(value)
  return value


def value_text(name: str, value) -> str:
  """A setup field's value as a label prints it: numbers short but exact (0.5, 1e-05), lists
  joined by '/', the data's identity by its fingerprint, None as 'none'."""
  if value is None:
    return "none"
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, float):
    short = f"{value:g}"
    return short if float(short) == value else repr(value)
  if name == "data" and isinstance(value, dict):
    key = next((k for k in ("fingerprint", "sha256", "hash") if k in value), None)
    return str(value[key])[:12] if key else _short_json(value)
  if name == "epochs_changes" and isinstance(value, list):
    return "/".join(f"{c.get('from')}→{c.get('to')}" if isinstance(c, dict) else str(c)
                    for c in value)
  if isinstance(value, (list, tuple)):
    return "/".join(value_text(name, v) for v in value)
  if isinstance(value, dict):
    return _short_json(value)
  return str(value)


def _short_json(value) -> str:
  return json.dumps(value, sort_keys=True, separators=(",", ":")).replace(", ", ",")


def field_text(name: str, value) -> str:
  """'β=4.5' for beta (MOMBO / MOBILE beta, MOPO lambda), else 'name=value'."""
  return f"{'β' if name == 'beta' else name}={value_text(name, value)}"



def dataset_type(dataset: str) -> str:
  """'hopper-medium-replay' -> 'medium-replay'; a Minari id ('mujoco/hopper/expert-v0') is its
  own type."""
  env, _, quality = dataset.partition("-")
  return quality if env in ENV_ORDER and quality else dataset


def paper_dataset(dataset: str) -> Optional[str]:
  """The paper's name of the data a run trained on, or None: a short name is itself; D4RL's own
  files imported by experiments.import_d4rl ('d4rl/hopper/medium-replay-v2') and the datasets
  built here ('mombo/hopper/random-v0') are '<env>-<quality>'."""
  if "/" not in dataset:
    return dataset
  m = re.fullmatch(r"(?:d4rl/([a-z0-9]+)/(.+)-v2|mombo/([a-z0-9]+)/(.+)-v\d+)", dataset)
  if not m:
    return None
  env, quality = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
  return f"{env}-{quality}"


# ---------------------------------------------------------------------------------- discovery

def read_run(path: str) -> Run:
  """One workdir -> Run (healthy seeds only). Raises ValueError on unreadable or inconsistent
  files."""
  wd = Workdir(path)
  try:
    config, summary, rows = wd.read_record(), wd.read_summary(), wd.read_rows()
  except (OSError, ValueError, KeyError, UserError) as e:
    raise ValueError(f"unreadable ({type(e).__name__}: {e})") from None
  if not rows:
    raise ValueError("metrics.csv holds no evaluation rows")
  env = str(config.get("env", ""))
  dataset = str(config.get("dataset") or env)
  bad = {int(d["seed"]) for d in summary.get("diverged", [])}
  all_seeds = [int(s) for s in summary["seeds"]]
  keep = [i for i, s in enumerate(all_seeds) if s not in bad]
  seeds = [all_seeds[i] for i in keep]
  try:
    steps, table = outputs.score_table(rows, seeds, key="step")
  except KeyError as e:
    raise ValueError(f"metrics.csv lacks the evaluation {e} of a seed in summary.json") from None
  scores = table.reshape(len(steps), len(seeds))
  beta = config.get("beta")
  flags = summary.get("overestimated")
  over = ([all_seeds[i] for i in keep if flags[i]]
          if isinstance(flags, list) and len(flags) == len(all_seeds) else None)
  protocol = summary.get("protocol")
  return Run(path=path, env=env.partition("-")[0], dataset=dataset, algo=algo_label(config),
             seeds=seeds, final=np.asarray(summary["final_normalized_score"], float)[keep],
             aulc=np.asarray(summary["aulc"], float)[keep], steps=np.asarray(steps),
             scores=scores, last=scores[-LAST_K:].mean(axis=0),
             beta=None if beta is None else float(beta), overestimated=over,
             setup=setup_of(config), protocol=None if protocol is None else str(protocol))


def beta_text(beta: Optional[float]) -> str:
  """config.beta as labels and tables print it; '?' where a run did not record it."""
  return "?" if beta is None else f"{beta:g}"


def group_runs(runs: Sequence[Run]) -> Tuple[Dict[tuple, Pool], List[str]]:
  """{(env, dataset, label): Pool} pooling the seeds of the runs of one algorithm on one dataset
  with one setup (Run.setup_fields: config.json but the seeds and evaluation fields); curves are
  kept at the evaluation steps all of them share. Runs of one algorithm on one dataset whose
  setups differ are separate groups, each label naming the fields that differ ('MOBILE (β=1.5)',
  'MOMBO (elite_spread, epochs=10)'): pooling them would average two different experiments.
  Returns (groups, warnings)."""
  by_key: Dict[tuple, List[Run]] = {}
  for r in runs:
    by_key.setdefault((r.env, r.dataset, r.algo, _setup_key(r.setup_fields())), []).append(r)
  setups: Dict[tuple, Dict[str, dict]] = {}
  for (env, dataset, algo, skey), members in by_key.items():
    setups.setdefault((env, dataset, algo), {})[skey] = members[0].setup_fields()
  labels: Dict[tuple, Tuple[str, List[str]]] = {}
  for (env, dataset, algo), found in setups.items():
    names = _differing(list(found.values()))
    base, variant, _, _ = _parse_label(algo)
    made = {}
    for skey, setup in sorted(found.items()):
      parts = [field_text(n, setup[n]) if n in setup else f"{n}=?" for n in names]
      made[skey] = ([variant] if variant else []) + parts
    texts = [", ".join(p) for p in made.values()]
    for i, (skey, parts) in enumerate(made.items()):
      if texts.count(", ".join(parts)) > 1:   # printed alike (not for plain values): keep apart
        parts = parts + [f"#{i + 1}"]
      labels[(env, dataset, algo, skey)] = (
          f"{base} ({', '.join(parts)})" if parts else algo, names)
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
    seen: Dict[int, str] = {}
    for r in members:
      for s in r.seeds:
        if s in seen:
          warnings.append(f"warning: {label} on {dataset}: seed {s} appears in {seen[s]} and "
                          f"{r.path}; both are counted")
        seen[s] = r.path
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
    cols = [r.scores[np.isin(r.steps, steps)] for r in members]
    groups[key] = Pool(env=env, dataset=dataset, algo=label, runs=[r.path for r in members],
                        seeds=[s for r in members for s in r.seeds],
                        final=np.concatenate([r.final for r in members]),
                        aulc=np.concatenate([r.aulc for r in members]), steps=steps,
                        scores=np.concatenate(cols, axis=1),
                        last=np.concatenate([r.scores[-LAST_K:].mean(axis=0) if r.last is None
                                             else r.last for r in members]),
                        beta=beta, evaluations=evaluations, overestimated=over,
                        setup=members[0].setup_fields(), differs=list(names))
  return groups, warnings


def _differing(setups: Sequence[dict]) -> List[str]:
  """The fields whose values are not the same in all `setups` (a field missing from some counts
  as differing), beta first, then by name."""
  if len(setups) < 2:
    return []
  names = sorted({k for s in setups for k in s})
  out = [n for n in names
         if len({_setup_key({"v": s[n]}) if n in s else None for s in setups}) > 1]
  return sorted(out, key=lambda n: (n != "beta", n))
