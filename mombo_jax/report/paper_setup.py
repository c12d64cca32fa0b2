"""A run against the paper's setup of its task: the config the paper preset gives its task and
algorithm (`paper_config`), what the run has less of (`shortfalls`: fewer gradient steps, a smaller
preset's settings, a reduced build of the dataset), and which of its fields sit at that preset's
value (`token`, for the report's column labels: a field is named where runs differ from the
paper's setup in different ways, not where tasks differ by design).

Everything is read from a run's config.json (the Config fields, "dataset", and "data": the
dataset's identity recorded at training, provenance.dataset_identity) and the package's own tables
(config.make_config, provenance.RECIPE_STEPS); no dataset needs to be present.
"""
from __future__ import annotations

import functools
import json
import re
from typing import List, Optional

from mombo_jax.data import provenance
from mombo_jax.settings import config as config_lib

# The fields that pick a task's reference table rather than take a value from it: passed to
# make_config, and always compared as they are (a run of another reference is another setup even
# though each sits at its own reference's values). `reference`: the settings source, where this
# version's Config has it.
SELECTORS = ("target", "reference")
# The scale of a run beside its gradient steps: what the smaller presets (config.PRESETS quick,
# tiny) cut. A run with less of any of these than the paper preset's is below the paper's budget.
# (field, what it is, the algorithm it matters to or None: all): numbers compare as numbers,
# hidden-layer tuples by depth and width.
SCALE = (("rollout_batch_size", "model rollouts per epoch", None),
         ("batch_size", "batch size", None), ("actor_hidden", "actor layers", None),
         ("critic_hidden", "critic layers", None), ("dyn_hidden", "dynamics layers", None),
         ("dyn_members", "dynamics members", None), ("dyn_elites", "dynamics elites", None),
         ("dyn_max_epochs", "dynamics epochs cap", None),
         ("mobile_num_samples", "MOBILE's next-state samples", "mobile"))
# paper_setup.token's words for a field at its task's paper-preset value, and for a field a
# setup lacks (a config.json written before the field existed).
DEFAULT = "<paper preset>"
MISSING = "<missing>"


def paper_config(config: dict) -> Optional[dict]:
  """The config (JSON values) the paper preset gives config.json's task (its "env": the short
  name whose settings it ran with) and algorithm, with its SELECTORS; None where this version
  cannot build one (an unknown task or field)."""
  fields = set(config_lib.Config.setting_names())
  chosen = tuple((k, _hashable(config[k])) for k in SELECTORS if k in config and k in fields)
  return _paper_config(str(config.get("env")), str(config.get("algo")), chosen)


@functools.lru_cache(maxsize=None)
def _paper_config(env: str, algo: str, chosen: tuple) -> Optional[dict]:
  try:
    made = config_lib.make_config(env, algo, "paper", **dict(chosen))
  except (ValueError, TypeError):
    return None
  return json.loads(json.dumps(made.settings()))


def _hashable(value):
  return json.dumps(value, sort_keys=True) if isinstance(value, (list, dict)) else value


def gradient_steps(config: dict) -> Optional[int]:
  """epochs x steps_per_epoch of a config (None where it lacks either)."""
  try:
    return int(config["epochs"]) * int(config["steps_per_epoch"])
  except (KeyError, TypeError, ValueError):
    return None


def recipe_size(dataset: str) -> Optional[int]:
  """The transitions of the full build of a dataset made here with D4RL's recipe (a short name or
  its id mombo/<env>/<quality>-v0): provenance.RECIPE_STEPS; None where the recipe fixes no size
  (medium-replay: the SAC run's buffer) or the dataset is not built here (D4RL's imported files
  are its files, whole; Minari's own datasets)."""
  if "/" in dataset and not dataset.startswith("mombo/"):
    return None
  name = paper_dataset(dataset)
  quality = (name or "").partition("-")[2]
  if not quality:
    return None
  return provenance.RECIPE_STEPS.get("mixed" if quality.endswith("pct") else quality)


def transitions(config: dict) -> Optional[int]:
  """The transitions the run trained on (config.json's data record), None where not recorded."""
  data = config.get("data")
  try:
    return int(data["num_transitions"]) if isinstance(data, dict) else None
  except (KeyError, TypeError, ValueError):
    return None


def shortfalls(config: dict) -> List[str]:
  """What a run (its config.json) has less of than the paper's setup of its task, one phrase
  each: fewer gradient steps than the paper preset's, less of a SCALE field (a smaller preset),
  fewer transitions than its dataset's recipe, a reduced recipe its data records (config.json's
  data_reduced: an expert partner from a shorter SAC run). Empty: nothing known falls short (a
  run whose config or data record is too old to tell is not marked)."""
  out = []
  paper = paper_config(config)
  steps = gradient_steps(config)
  if paper is not None and steps is not None:
    full = gradient_steps(paper)
    if steps < full:
      out.append(f"{steps:,} gradient steps (paper: {full:,})")
    for name, what, algo in SCALE:
      if algo not in (None, config.get("algo")):
        continue
      if name in config and name in paper and _less(config[name], paper[name]):
        out.append(f"{what} {_text(config[name])} (paper: {_text(paper[name])})")
  n, full = transitions(config), recipe_size(str(config.get("dataset") or config.get("env")))
  if n is not None and full is not None and n < full:
    out.append(f"dataset of {n:,} transitions (its recipe: {full:,})")
  # A reduced recipe beside the size (config.json's data_reduced: provenance.reduced_notes).
  out += [f"dataset: {note}" for note in config.get("data_reduced") or []]
  return out


def _less(value, paper) -> bool:
  """value below paper: numbers as numbers (None: no cap, more than any number), layer lists
  fewer or any narrower."""
  if isinstance(value, list) or isinstance(paper, list):
    value, paper = list(value or []), list(paper or [])
    return len(value) < len(paper) or any(v < p for v, p in zip(value, paper))
  if value is None:
    return False
  if paper is None:
    return True
  try:
    return float(value) < float(paper)
  except (TypeError, ValueError):
    return False


def _text(value) -> str:
  if value is None:
    return "none"
  if isinstance(value, list):
    return "x".join(str(v) for v in value)
  return f"{value:,}" if isinstance(value, int) else str(value)


def token(name: str, setup: dict, paper: Optional[dict]):
  """What field `name` of a setup is, for telling setups apart over a whole table: DEFAULT where
  it holds the paper preset's value of its own task (so runs of different tasks at their tasks'
  values are alike), else its value; MISSING where the setup lacks the field. SELECTORS always
  compare by value."""
  if name not in setup:
    return MISSING
  value = json.loads(json.dumps(setup[name], default=str))
  if paper is not None and name in paper and name not in SELECTORS and \
      _same(value, paper[name]):
    return DEFAULT
  return value


def _same(a, b) -> bool:
  """Equal as the report compares setups (setup_key: 1 and 1.0 alike)."""
  return setup_key({"v": a}) == setup_key({"v": b})


def setup_key(setup: dict) -> str:
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
