"""What D4RL's v2 MuJoCo files hold, by name: their published return statistics (`PUBLISHED`, the
one table of them: dataset cards compare with it), and the expectation an import of a file under
a name is checked against (`expectation`, `quality_check`): a file that is not what its name says
(a random-policy file imported as hopper-medium) gets a one-line warning with the numbers.

The expectation of a name, as a D4RL-normalised score of the mean episode return (100 (R - R_random)
/ (R_expert - R_random), D4RL's reference returns of the env, scores.D4RL_REF_SCORES):
- medium, medium-replay, expert: the published mean episode return of that file (PUBLISHED);
- medium-expert: between the published medium and expert means (D4RL's medium-expert file holds
  the medium file's and the expert file's episodes, Fu et al. 2020, so its mean episode return is
  a weighted mean of theirs); no published statistics of the file itself were found;
- random: no published return statistics of D4RL's random files were found in a readable
  source. The expectation is derived instead: normalised 0, i.e. D4RL's random reference return
  R_random (d4rl/infos.py REF_MIN_SCORE: the return of a random policy, by which D4RL's
  normalisation puts a random policy at 0), as the recipe of the random files (1M steps of a
  randomly initialised policy, Fu et al. 2020) implies.
A mean farther from that value (or range) than TOLERANCE_POINTS normalised points, or
TOLERANCE_FRACTION of the expected normalised score where that is more, is "far apart": the file
is then likely of another quality (random is ~0, medium-replay 15-27, medium 40-62, expert 88-108).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple

import numpy as np

from mombo_jax.data.names import parse_name
from mombo_jax.data.scores import D4RL_REF_SCORES

# Published statistics of D4RL's v2 MuJoCo files: (rows in complete episodes, mean and std of the
# episode return). Source: the recorded output of the Decision Transformer repository's
# gym/data/download_d4rl_datasets.py (github.com/kzl/decision-transformer), which splits each v2
# file at terminals and timeouts exactly as d4rl.to_episodes does. random sets are 1M rows (D4RL
# paper, Fu et al. 2020); their return statistics are not in that output.
PUBLISHED = {
    "halfcheetah-medium": (1_000_000, 4770.33, 355.75),
    "halfcheetah-medium-replay": (202_000, 3093.29, 1680.69),
    "halfcheetah-expert": (1_000_000, 10656.43, 441.68),
    "hopper-medium": (999_906, 1422.06, 378.95),
    "hopper-medium-replay": (402_000, 467.30, 511.03),
    "hopper-expert": (999_494, 3511.36, 328.59),
    "walker2d-medium": (999_995, 2852.09, 1095.44),
    "walker2d-medium-replay": (302_000, 682.70, 895.96),
    "walker2d-expert": (999_214, 4920.51, 136.39),
    "halfcheetah-random": (1_000_000, None, None),
    "hopper-random": (1_000_000, None, None),
    "walker2d-random": (1_000_000, None, None),
}

TOLERANCE_POINTS = 10.0
TOLERANCE_FRACTION = 0.25


@dataclasses.dataclass(frozen=True)
class Expectation:
  """The mean episode return expected of a file named `name`: raw returns low..high (equal for a
  published mean), what they are (`source`, words for a message)."""
  name: str
  low: float
  high: float
  source: str

  def normalised(self, value: float) -> float:
    low, high = D4RL_REF_SCORES[self.name.partition("-")[0]]
    return 100.0 * (value - low) / (high - low)

  def accepted(self) -> Tuple[float, float]:
    """The normalised range a mean episode return may lie in without a warning."""
    lo, hi = self.normalised(self.low), self.normalised(self.high)
    return (lo - max(TOLERANCE_POINTS, TOLERANCE_FRACTION * abs(lo)),
            hi + max(TOLERANCE_POINTS, TOLERANCE_FRACTION * abs(hi)))


def expectation(name: str) -> Optional[Expectation]:
  """The Expectation of D4RL's file of short name `name` (module docstring); None for a name D4RL
  has no file of (the mixed datasets) or an unknown name."""
  try:
    env, quality = parse_name(name)
  except ValueError:
    return None
  published = PUBLISHED.get(name)
  if published and published[1] is not None:
    return Expectation(name, published[1], published[1],
                       f"D4RL's published {name}-v2 has {published[1]:.1f}")
  if quality == "medium-expert":
    low, high = PUBLISHED[f"{env}-medium"][1], PUBLISHED[f"{env}-expert"][1]
    return Expectation(name, low, high, f"D4RL's {name}-v2 is its medium and expert files, whose "
                       f"published means are {low:.1f} and {high:.1f}")
  if quality == "random":
    r_random = D4RL_REF_SCORES[env][0]
    return Expectation(name, r_random, r_random,
                       f"expected about D4RL's random reference return {r_random:.1f} (a "
                       "random policy's; no published statistics of D4RL's random files)")
  return None


def quality_check(name: str, returns: Sequence[float]) -> Tuple[Optional[bool], str]:
  """(ok, sentence) comparing the mean of the episode returns [E] of a file imported as `name`
  with the expectation: ok True within it, False far from it (the sentence says by how much and
  what to check), None when there is nothing to compare with."""
  exp = expectation(name)
  if exp is None:
    return None, f"no published D4RL statistics for {name}"
  mean = float(np.mean(np.asarray(returns, np.float64)))
  norm = exp.normalised(mean)
  lo, hi = exp.accepted()
  want = (f"{exp.normalised(exp.low):.1f}" if exp.low == exp.high else
          f"{exp.normalised(exp.low):.1f} to {exp.normalised(exp.high):.1f}")
  text = (f"mean episode return {mean:.1f} (normalised {norm:.1f}) over {len(returns)} "
          f"episodes; {exp.source}: normalised {want} (accepted {lo:.1f} to {hi:.1f})")
  return lo <= norm <= hi, text
