"""Column labels and setups of the report (mombo_jax.report.results pools runs by them).

A run's setup (`setup_of`) is its config.json without NOT_SETUP (seeds, the evaluation's fields,
the group key's fields); setups alike exactly when their `_setup_key`s are. A label names the
algorithm (`algo_label`: MOMBO's Bellman target always) and, where runs of one algorithm differ in
their setup anywhere in the table, the fields that differ (`column_labels`), in every label of that
algorithm on every dataset: one column is one setup over all its rows. Tasks differ by design
(each has its own paper settings, config.TASKS), so a field counts as differing by how it stands
to its task's paper-preset value (paper_setup.token), not by its value. `label_key` sorts labels
in the paper's order.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from mombo_jax.core import algorithms
from mombo_jax.report import paper_setup

# Setups alike exactly when their keys are; defined beside the paper setup it compares against.
from mombo_jax.report.paper_setup import setup_key as _setup_key

# The paper's column order (baselines first); MOMBO's targets in docs/spec.md section 3's order.
_BASE_ORDER = ("MOPO", "MOBILE", "MOMBO")
_TARGET_ORDER = ("lcb", "elite_spread", "mixture")

# config.json fields that are not part of a run's setup: the seeds (pooling them is the point), the
# evaluation's schedule and its record (eval_every, eval_episodes, eval_changes: they change how
# often and how precisely a run is measured, not what was trained; a warning names runs evaluated
# at different steps), how often dynamics training checkpoints, and the fields the group key
# holds already (env, dataset, algo, target; algo_module: where the algorithm is registered).
NOT_SETUP = ("seed", "num_seeds", "eval_every", "eval_episodes", "eval_changes",
             "dyn_checkpoint_every_s", "env", "dataset", "algo", "target", "algo_module")

# Fields told apart within one dataset only: the data's identity differs between datasets by
# nature, and so does what a dataset's recipe lacks (data_reduced: a mixed dataset's partner from
# a shorter SAC run; paper_setup.shortfalls names it in the table cell's footnote).
PER_DATASET = ("data", "data_reduced")


def algo_label(config: dict) -> str:
  """'MOPO', 'MOBILE', or 'MOMBO (<target>)': MOMBO's Bellman target (config.target: lcb |
  elite_spread | mixture) changes the algorithm, so every MOMBO label names it and runs of two
  targets are never pooled. A MOMBO config without a target is 'MOMBO (target?)' rather than a
  guess."""
  return algorithms.label(str(config.get("algo", "?")), config.get("target"), "column")


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


def base_algo(label: str) -> str:
  """'MOMBO (elite_spread, β=3)' -> 'MOMBO'."""
  return _parse_label(label)[0]


def setup_of(config: dict) -> dict:
  """A run's setup: its config.json without the NOT_SETUP fields (JSON values: lists for
  tuples; 'data', the dataset's identity, included where recorded)."""
  return {k: v for k, v in config.items() if k not in NOT_SETUP}


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


def column_labels(setups: Dict[tuple, Any]) -> Dict[tuple, Tuple[str, List[str]]]:
  """{(env, dataset, algo, setup key): (label, named fields)} for one results.Run of each setup
  (its setup_fields() and .paper: the paper preset's config of its task, or None). Per
  algorithm (algo_label), a field is named in every label of it when its setups differ in it
  anywhere in the table: by paper_setup.token (a value at its task's paper-preset value is
  DEFAULT, so tasks at their own settings are alike); PER_DATASET fields on a dataset where
  only they tell its setups apart. A DEFAULT is printed as its value where all of them share
  one, else as 'default'. Setups printed alike on one dataset get '#i'."""
  by_algo: Dict[str, List[tuple]] = {}
  for key in setups:
    by_algo.setdefault(key[2], []).append(key)
  labels = {}
  for algo, keys in by_algo.items():
    tokens = {k: (setups[k].setup_fields(), setups[k].paper) for k in keys}
    fields = sorted({n for setup, _ in tokens.values() for n in setup})
    named = sorted((n for n in fields if n not in PER_DATASET and len(
        {_setup_key({"v": paper_setup.token(n, *tokens[k])}) for k in keys}) > 1),
        key=lambda n: (n != "beta", n))
    shared = {}
    for n in named:
      values = {_setup_key({"v": tokens[k][0][n]}) for k in keys
                if paper_setup.token(n, *tokens[k]) == paper_setup.DEFAULT}
      shared[n] = len(values) <= 1
    base, variant, _, _ = _parse_label(algo)
    for dataset in sorted({k[1] for k in keys}):
      here = sorted(k for k in keys if k[1] == dataset)

      def parts_of(k, names):
        setup, paper = tokens[k]
        parts = []
        for n in names:
          if n not in setup:
            parts.append(f"{n}=?")
          elif paper_setup.token(n, setup, paper) == paper_setup.DEFAULT and not shared[n]:
            parts.append(f"{'β' if n == 'beta' else n}=default")
          else:
            parts.append(field_text(n, setup[n]))
        return ([variant] if variant else []) + parts

      names = named
      texts = [", ".join(parts_of(k, names)) for k in here]
      if len(set(texts)) < len(texts):   # only the data tells them apart: name it here
        local = _differing([tokens[k][0] for k in here])
        names = sorted(named + [n for n in PER_DATASET if n in local],
                       key=lambda n: (n != "beta", n))
      made = {k: parts_of(k, names) for k in here}
      texts = [", ".join(p) for p in made.values()]
      for i, (k, parts) in enumerate(made.items()):
        if texts.count(", ".join(parts)) > 1:   # printed alike (not for plain values): keep apart
          parts = parts + [f"#{i + 1}"]
        labels[k] = (f"{base} ({', '.join(parts)})" if parts else algo, names)
  return labels


def _differing(setups: Sequence[dict]) -> List[str]:
  """The fields whose values are not the same in all `setups` (a field missing from some counts
  as differing), beta first, then by name."""
  if len(setups) < 2:
    return []
  names = sorted({k for s in setups for k in s})
  out = [n for n in names
         if len({_setup_key({"v": s[n]}) if n in s else None for s in setups}) > 1]
  return sorted(out, key=lambda n: (n != "beta", n))
