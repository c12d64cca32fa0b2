r"""The paper's published numbers, to print beside ours (mombo_jax.report.writer) and to compare
with.

Source: A. Akgül, M. Haußmann, M. Kandemir, "Deterministic Uncertainty Propagation for Improved
Model-Based Offline Reinforcement Learning", NeurIPS 2024 (its LaTeX source is
mombo-neurips2024.tex). Every number below is the paper's, copied from its tables (checked
against the .tex by tests/test_paper_results.py), not one of ours:

- D4RL: Table 1, \label{table:results_d4rl}, "Performance evaluation on the D4RL dataset":
  normalised score at 3M gradient steps ("final", the last evaluation) and AULC, mean and std over
  four seeds (0-3), of MOPO, MOBILE and MOMBO.
- MIXED: the appendix table \label{table:results_mixed}, "Performance evaluation on the mixed
  dataset": the same two metrics at 2M gradient steps on random + medium / random + expert data
  with 1, 5, 10, 50 % of the better policy (Hong et al. 2023), keyed here by this package's short
  names (`hopper-random-expert-5pct`).
- UNCERTAINTY: Table 2, \label{tab:uncertainty_experiment_d4rl}, "Uncertainty quantification on the
  D4RL dataset": accuracy and tightness of each algorithm's uncertainty quantifier, mean and std
  over four seeds.

The paper's MOMBO is the released code (adinlab/MOMBO), whose Bellman target is the one this
package calls `elite_spread` (docs/spec.md section 3): PAPER_MOMBO_TARGET. The paper's datasets are
D4RL's own (v2) and Hong et al.'s; datasets rebuilt here with D4RL's recipe
(experiments.collect) are not the same data, so agreement is expected in level, not to the decimal.

Layout: TABLE[metric][dataset][algo] = (mean, std), algo in ALGOS; `lookup` and `score` /
`uncertainty` read them, returning None where the paper has no number (expert datasets, Minari ids,
other algorithms).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

ALGOS = ("MOPO", "MOBILE", "MOMBO")
PAPER_MOMBO_TARGET = "elite_spread"
CITATION = ("Akgül, Haußmann, Kandemir, \"Deterministic Uncertainty Propagation for Improved "
            "Model-Based Offline Reinforcement Learning\", NeurIPS 2024")

# Table 1 (\label{table:results_d4rl}): normalised score at 3M steps and AULC, mean and std over
# 4 seeds. The table cells are copied as printed. The paper's own average rows match the means of
# these table cells (to its rounding) for MOBILE and MOMBO, but not for MOPO: printed 67.6 (final)
# and 57.5 (AULC) against 67.9 and 57.7 from its table cells (its medium-replay averages differ
# likewise).
D4RL = {
    "final": {
        "halfcheetah-random": {"MOPO": (37.2, 1.6), "MOBILE": (41.2, 1.1), "MOMBO": (43.6, 1.1)},
        "hopper-random": {"MOPO": (31.7, 0.1), "MOBILE": (31.3, 0.1), "MOMBO": (25.4, 10.2)},
        "walker2d-random": {"MOPO": (8.2, 5.6), "MOBILE": (22.1, 0.9), "MOMBO": (21.5, 0.1)},
        "halfcheetah-medium": {"MOPO": (72.4, 4.2), "MOBILE": (75.8, 0.8), "MOMBO": (76.1, 0.8)},
        "hopper-medium": {"MOPO": (62.8, 38.1), "MOBILE": (103.6, 1.0), "MOMBO": (104.2, 0.5)},
        "walker2d-medium": {"MOPO": (85.4, 2.9), "MOBILE": (88.3, 2.5), "MOMBO": (86.4, 1.2)},
        "halfcheetah-medium-replay":
            {"MOPO": (72.1, 3.8), "MOBILE": (71.9, 3.2), "MOMBO": (72.0, 4.3)},
        "hopper-medium-replay":
            {"MOPO": (92.7, 20.7), "MOBILE": (105.1, 1.3), "MOMBO": (104.8, 1.0)},
        "walker2d-medium-replay":
            {"MOPO": (85.9, 5.3), "MOBILE": (90.5, 1.7), "MOMBO": (89.6, 3.8)},
        "halfcheetah-medium-expert":
            {"MOPO": (83.6, 12.5), "MOBILE": (100.9, 1.5), "MOMBO": (103.3, 0.8)},
        "hopper-medium-expert":
            {"MOPO": (74.9, 44.2), "MOBILE": (112.5, 0.2), "MOMBO": (112.6, 0.3)},
        "walker2d-medium-expert":
            {"MOPO": (108.2, 4.3), "MOBILE": (114.5, 2.2), "MOMBO": (113.9, 0.9)},
    },
    "aulc": {
        "halfcheetah-random": {"MOPO": (36.3, 1.0), "MOBILE": (39.5, 1.2), "MOMBO": (41.4, 1.0)},
        "hopper-random": {"MOPO": (28.6, 1.4), "MOBILE": (23.6, 3.7), "MOMBO": (17.3, 1.3)},
        "walker2d-random": {"MOPO": (5.4, 3.2), "MOBILE": (18.0, 0.4), "MOMBO": (19.2, 0.5)},
        "halfcheetah-medium": {"MOPO": (70.9, 2.0), "MOBILE": (72.1, 1.0), "MOMBO": (73.0, 0.9)},
        "hopper-medium": {"MOPO": (37.0, 15.3), "MOBILE": (82.2, 7.3), "MOMBO": (95.9, 2.5)},
        "walker2d-medium": {"MOPO": (77.6, 1.3), "MOBILE": (79.0, 1.3), "MOMBO": (84.0, 1.1)},
        "halfcheetah-medium-replay":
            {"MOPO": (68.4, 4.7), "MOBILE": (67.9, 2.8), "MOMBO": (68.7, 3.9)},
        "hopper-medium-replay": {"MOPO": (81.7, 4.6), "MOBILE": (78.7, 4.0), "MOMBO": (87.3, 2.0)},
        "walker2d-medium-replay":
            {"MOPO": (65.3, 12.7), "MOBILE": (79.9, 4.3), "MOMBO": (80.8, 5.6)},
        "halfcheetah-medium-expert":
            {"MOPO": (77.1, 4.0), "MOBILE": (94.5, 1.8), "MOMBO": (95.2, 0.7)},
        "hopper-medium-expert": {"MOPO": (55.6, 17.3), "MOBILE": (82.7, 7.3), "MOMBO": (84.3, 4.7)},
        "walker2d-medium-expert":
            {"MOPO": (88.3, 6.3), "MOBILE": (94.3, 0.9), "MOMBO": (98.9, 3.3)},
    },
}

# Appendix table \label{table:results_mixed}: normalised score at 2M steps and AULC, mean and std
# over 4 seeds. Dataset "<env>-random-<partner>-<p>pct" is the paper's ratio p %, type
# random-<partner>.
MIXED = {
    "final": {
        "halfcheetah-random-medium-1pct":
            {"MOPO": (42.1, 12.0), "MOBILE": (51.3, 2.7), "MOMBO": (55.4, 2.1)},
        "hopper-random-medium-1pct":
            {"MOPO": (48.9, 25.7), "MOBILE": (22.9, 4.0), "MOMBO": (30.4, 2.0)},
        "walker2d-random-medium-1pct":
            {"MOPO": (0.1, 0.0), "MOBILE": (15.9, 6.3), "MOMBO": (22.0, 0.4)},
        "halfcheetah-random-expert-1pct":
            {"MOPO": (33.5, 3.3), "MOBILE": (51.8, 2.0), "MOMBO": (41.0, 16.9)},
        "hopper-random-expert-1pct":
            {"MOPO": (42.8, 32.9), "MOBILE": (30.7, 16.9), "MOMBO": (51.5, 35.6)},
        "walker2d-random-expert-1pct":
            {"MOPO": (-0.1, 0.0), "MOBILE": (21.6, 0.0), "MOMBO": (21.8, 0.4)},
        "halfcheetah-random-medium-5pct":
            {"MOPO": (62.1, 2.7), "MOBILE": (62.4, 1.4), "MOMBO": (62.2, 3.5)},
        "hopper-random-medium-5pct":
            {"MOPO": (32.0, 6.7), "MOBILE": (46.8, 11.8), "MOMBO": (60.0, 27.3)},
        "walker2d-random-medium-5pct":
            {"MOPO": (5.2, 5.4), "MOBILE": (10.6, 6.5), "MOMBO": (21.7, 0.1)},
        "halfcheetah-random-expert-5pct":
            {"MOPO": (33.8, 10.2), "MOBILE": (54.0, 22.0), "MOMBO": (39.1, 19.7)},
        "hopper-random-expert-5pct":
            {"MOPO": (43.6, 30.2), "MOBILE": (43.0, 27.3), "MOMBO": (17.1, 12.6)},
        "walker2d-random-expert-5pct":
            {"MOPO": (1.6, 2.0), "MOBILE": (13.8, 7.4), "MOMBO": (24.0, 2.6)},
        "halfcheetah-random-medium-10pct":
            {"MOPO": (66.2, 0.7), "MOBILE": (65.4, 0.7), "MOMBO": (68.0, 1.1)},
        "hopper-random-medium-10pct":
            {"MOPO": (37.3, 9.0), "MOBILE": (45.0, 29.0), "MOMBO": (58.4, 14.8)},
        "walker2d-random-medium-10pct":
            {"MOPO": (44.5, 5.5), "MOBILE": (11.1, 6.9), "MOMBO": (17.8, 6.7)},
        "halfcheetah-random-expert-10pct":
            {"MOPO": (29.5, 9.8), "MOBILE": (74.5, 8.2), "MOMBO": (58.1, 16.8)},
        "hopper-random-expert-10pct":
            {"MOPO": (20.0, 5.7), "MOBILE": (80.3, 21.4), "MOMBO": (77.8, 29.5)},
        "walker2d-random-expert-10pct":
            {"MOPO": (4.2, 3.6), "MOBILE": (14.9, 7.9), "MOMBO": (21.3, 4.0)},
        "halfcheetah-random-medium-50pct":
            {"MOPO": (73.4, 1.4), "MOBILE": (72.0, 0.8), "MOMBO": (73.5, 1.9)},
        "hopper-random-medium-50pct":
            {"MOPO": (67.2, 34.5), "MOBILE": (106.5, 2.0), "MOMBO": (108.0, 0.6)},
        "walker2d-random-medium-50pct":
            {"MOPO": (64.4, 30.6), "MOBILE": (36.1, 25.0), "MOMBO": (14.7, 8.2)},
        "halfcheetah-random-expert-50pct":
            {"MOPO": (42.1, 10.5), "MOBILE": (72.9, 29.1), "MOMBO": (33.4, 12.0)},
        "hopper-random-expert-50pct":
            {"MOPO": (24.7, 3.7), "MOBILE": (70.3, 39.8), "MOMBO": (88.6, 37.9)},
        "walker2d-random-expert-50pct":
            {"MOPO": (16.0, 11.4), "MOBILE": (15.7, 8.5), "MOMBO": (16.4, 9.7)},
    },
    "aulc": {
        "halfcheetah-random-medium-1pct":
            {"MOPO": (41.4, 6.6), "MOBILE": (46.0, 2.1), "MOMBO": (48.5, 1.3)},
        "hopper-random-medium-1pct":
            {"MOPO": (35.5, 3.0), "MOBILE": (21.8, 2.2), "MOMBO": (27.3, 2.8)},
        "walker2d-random-medium-1pct":
            {"MOPO": (0.1, 0.0), "MOBILE": (13.1, 5.1), "MOMBO": (18.7, 0.7)},
        "halfcheetah-random-expert-1pct":
            {"MOPO": (31.2, 1.8), "MOBILE": (38.2, 3.0), "MOMBO": (32.3, 8.5)},
        "hopper-random-expert-1pct":
            {"MOPO": (32.3, 2.4), "MOBILE": (32.7, 7.0), "MOMBO": (32.0, 7.2)},
        "walker2d-random-expert-1pct":
            {"MOPO": (0.3, 0.7), "MOBILE": (16.6, 0.9), "MOMBO": (18.2, 1.0)},
        "halfcheetah-random-medium-5pct":
            {"MOPO": (54.3, 1.5), "MOBILE": (56.4, 0.2), "MOMBO": (58.1, 1.1)},
        "hopper-random-medium-5pct":
            {"MOPO": (29.5, 3.7), "MOBILE": (38.3, 3.3), "MOMBO": (50.1, 8.2)},
        "walker2d-random-medium-5pct":
            {"MOPO": (4.7, 4.5), "MOBILE": (10.3, 4.7), "MOMBO": (18.5, 0.7)},
        "halfcheetah-random-expert-5pct":
            {"MOPO": (33.6, 2.3), "MOBILE": (49.7, 10.6), "MOMBO": (30.3, 9.7)},
        "hopper-random-expert-5pct":
            {"MOPO": (29.2, 4.8), "MOBILE": (42.1, 4.7), "MOMBO": (39.6, 3.5)},
        "walker2d-random-expert-5pct":
            {"MOPO": (2.0, 1.2), "MOBILE": (13.3, 3.7), "MOMBO": (18.4, 1.8)},
        "halfcheetah-random-medium-10pct":
            {"MOPO": (59.5, 1.0), "MOBILE": (59.9, 0.4), "MOMBO": (61.2, 1.2)},
        "hopper-random-medium-10pct":
            {"MOPO": (33.0, 2.1), "MOBILE": (58.4, 16.8), "MOMBO": (60.1, 8.7)},
        "walker2d-random-medium-10pct":
            {"MOPO": (24.5, 4.4), "MOBILE": (10.9, 3.8), "MOMBO": (16.8, 2.9)},
        "halfcheetah-random-expert-10pct":
            {"MOPO": (32.9, 3.8), "MOBILE": (64.7, 2.3), "MOMBO": (62.4, 6.6)},
        "hopper-random-expert-10pct":
            {"MOPO": (19.2, 2.1), "MOBILE": (40.3, 6.1), "MOMBO": (45.5, 6.2)},
        "walker2d-random-expert-10pct":
            {"MOPO": (2.9, 1.6), "MOBILE": (14.0, 3.4), "MOMBO": (17.2, 1.0)},
        "halfcheetah-random-medium-50pct":
            {"MOPO": (68.4, 0.2), "MOBILE": (67.3, 0.8), "MOMBO": (69.3, 0.8)},
        "hopper-random-medium-50pct":
            {"MOPO": (34.1, 14.1), "MOBILE": (80.9, 5.9), "MOMBO": (82.9, 4.8)},
        "walker2d-random-medium-50pct":
            {"MOPO": (58.9, 16.5), "MOBILE": (29.6, 3.2), "MOMBO": (37.7, 9.1)},
        "halfcheetah-random-expert-50pct":
            {"MOPO": (30.7, 3.6), "MOBILE": (47.3, 6.7), "MOMBO": (44.1, 9.6)},
        "hopper-random-expert-50pct":
            {"MOPO": (22.5, 1.8), "MOBILE": (62.5, 9.2), "MOMBO": (65.4, 8.5)},
        "walker2d-random-expert-50pct":
            {"MOPO": (7.7, 1.1), "MOBILE": (9.8, 4.8), "MOMBO": (11.8, 4.1)},
    },
}

# Table 2 (\label{tab:uncertainty_experiment_d4rl}): accuracy and tightness, mean and std over 4
# seeds. walker2d-random MOPO's tightness is printed in the paper as -17*10^7 +- 16*10^7.
UNCERTAINTY = {
    "accuracy": {
        "halfcheetah-random": {"MOPO": (0.02, 0.0), "MOBILE": (0.25, 0.02), "MOMBO": (0.24, 0.07)},
        "hopper-random": {"MOPO": (0.14, 0.04), "MOBILE": (0.85, 0.03), "MOMBO": (0.61, 0.07)},
        "walker2d-random": {"MOPO": (0.01, 0.01), "MOBILE": (0.55, 0.04), "MOMBO": (0.74, 0.06)},
        "halfcheetah-medium": {"MOPO": (0.06, 0.01), "MOBILE": (0.25, 0.0), "MOMBO": (0.34, 0.04)},
        "hopper-medium": {"MOPO": (0.04, 0.01), "MOBILE": (0.41, 0.01), "MOMBO": (0.55, 0.03)},
        "walker2d-medium": {"MOPO": (0.02, 0.0), "MOBILE": (0.16, 0.01), "MOMBO": (0.38, 0.02)},
        "halfcheetah-medium-replay":
            {"MOPO": (0.09, 0.01), "MOBILE": (0.04, 0.0), "MOMBO": (0.16, 0.0)},
        "hopper-medium-replay":
            {"MOPO": (0.02, 0.01), "MOBILE": (0.03, 0.01), "MOMBO": (0.17, 0.01)},
        "walker2d-medium-replay":
            {"MOPO": (0.08, 0.01), "MOBILE": (0.14, 0.01), "MOMBO": (0.36, 0.02)},
        "halfcheetah-medium-expert":
            {"MOPO": (0.13, 0.02), "MOBILE": (0.36, 0.03), "MOMBO": (0.44, 0.03)},
        "hopper-medium-expert":
            {"MOPO": (0.04, 0.02), "MOBILE": (0.43, 0.02), "MOMBO": (0.51, 0.04)},
        "walker2d-medium-expert":
            {"MOPO": (0.05, 0.01), "MOBILE": (0.47, 0.02), "MOMBO": (0.45, 0.02)},
    },
    "tightness": {
        "halfcheetah-random":
            {"MOPO": (-14.58, 0.63), "MOBILE": (-6.88, 0.61), "MOMBO": (-6.21, 0.28)},
        "hopper-random": {"MOPO": (-1.68, 0.22), "MOBILE": (-0.64, 0.2), "MOMBO": (-0.31, 0.65)},
        "walker2d-random":
            {"MOPO": (-1.7e8, 1.6e8), "MOBILE": (-0.27, 0.08), "MOMBO": (-0.14, 0.02)},
        "halfcheetah-medium":
            {"MOPO": (-15.71, 0.68), "MOBILE": (-10.03, 0.53), "MOMBO": (-9.06, 0.26)},
        "hopper-medium": {"MOPO": (-4.16, 1.24), "MOBILE": (-3.14, 0.08), "MOMBO": (-1.3, 0.21)},
        "walker2d-medium": {"MOPO": (-8.91, 0.61), "MOBILE": (-5.02, 0.52), "MOMBO": (-4.03, 0.24)},
        "halfcheetah-medium-replay":
            {"MOPO": (-11.67, 0.94), "MOBILE": (-11.85, 0.41), "MOMBO": (-10.4, 0.66)},
        "hopper-medium-replay":
            {"MOPO": (-5.35, 0.71), "MOBILE": (-3.4, 0.04), "MOMBO": (-3.17, 0.04)},
        "walker2d-medium-replay":
            {"MOPO": (-4.47, 0.43), "MOBILE": (-4.56, 0.13), "MOMBO": (-3.78, 0.39)},
        "halfcheetah-medium-expert":
            {"MOPO": (-21.25, 2.87), "MOBILE": (-13.22, 0.47), "MOMBO": (-11.88, 0.5)},
        "hopper-medium-expert":
            {"MOPO": (-9.77, 7.24), "MOBILE": (-3.5, 0.03), "MOMBO": (-3.38, 0.02)},
        "walker2d-medium-expert":
            {"MOPO": (-9.77, 0.02), "MOBILE": (-5.52, 0.36), "MOMBO": (-5.29, 0.14)},
    },
}

# Footnotes of the paper's table cells, keyed (metric, dataset, algo).
NOTES = {
    ("final", "hopper-random", "MOMBO"):
        "high std from one failed repetition of four (the paper's footnote); median 31.3",
}

_D4RL_SOURCE = ("Table 1 (table:results_d4rl)", D4RL)
_MIXED_SOURCE = ("the appendix table table:results_mixed", MIXED)
_UNCERTAINTY_SOURCE = ("Table 2 (tab:uncertainty_experiment_d4rl)", UNCERTAINTY)
# metric -> the (source name, table) pairs that report it.
_TABLES = {"final": (_D4RL_SOURCE, _MIXED_SOURCE), "aulc": (_D4RL_SOURCE, _MIXED_SOURCE),
           "accuracy": (_UNCERTAINTY_SOURCE,), "tightness": (_UNCERTAINTY_SOURCE,)}
METRICS = tuple(_TABLES)


def lookup(metric: str, dataset: str, algo: str) -> Optional[Tuple[float, float]]:
  """The paper's (mean, std) of `algo` (MOPO | MOBILE | MOMBO, any case) on `dataset` (short name,
  e.g. 'hopper-medium-replay') for `metric` (final | aulc | accuracy | tightness); None where the
  paper has no number. ValueError for a metric the paper does not report."""
  if metric not in _TABLES:
    raise ValueError(f"The paper reports no {metric!r}; one of {', '.join(METRICS)}.")
  for _, table in _TABLES[metric]:
    number = table[metric].get(dataset, {}).get(str(algo).upper())
    if number is not None:
      return number
  return None


def source(metric: str, dataset: str) -> Optional[str]:
  """Which table of the paper holds `metric` on `dataset` (for citing a number); None if none."""
  for name, table in _TABLES.get(metric, ()):
    if dataset in table[metric]:
      return name
  return None


def score(dataset: str, algo: str, metric: str = "final") -> Optional[Tuple[float, float]]:
  """Table 1 / mixed table: the paper's normalised score ('final') or 'aulc', (mean, std)."""
  if metric not in ("final", "aulc"):
    raise ValueError(f"score: metric is 'final' or 'aulc', got {metric!r}.")
  return lookup(metric, dataset, algo)


def uncertainty(dataset: str, algo: str, metric: str) -> Optional[Tuple[float, float]]:
  """Table 2: the paper's 'accuracy' or 'tightness' of `algo` on `dataset`, (mean, std)."""
  if metric not in ("accuracy", "tightness"):
    raise ValueError(f"uncertainty: metric is 'accuracy' or 'tightness', got {metric!r}.")
  return lookup(metric, dataset, algo)


def datasets(metric: str = "final") -> Dict[str, str]:
  """{dataset: source table} of every dataset the paper reports `metric` on."""
  return {d: name for name, table in _TABLES[metric] for d in table[metric]}
