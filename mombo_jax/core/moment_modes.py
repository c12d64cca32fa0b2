"""The moment modes of MOMBO's targets (Config.agent.moments; no JAX, so that the settings and the
run records can check and name them):

  diagonal     the paper's Algorithm 1 and the released code's: independent units after every
               layer (moments.py, the critic's MMDense path); the default.
  lowrank      the input's low-rank covariance carried through the critic (lowrank_moments.py),
               every random input dimension kept (rank = the state's dimension).
  lowrank<k>   the same with at most k input dimensions kept correlated per row (k >= 1).
  full         propagate's full covariance (propagate_full.py): for the analyses (Table 2's
               quantifier, mm_vs_mc); ~1,000x the plain network, refused for training.
"""
import re
from typing import Optional, Tuple

DEFAULT = "diagonal"
CHOICES = ("diagonal", "lowrank", "lowrank<k>", "full")
_LOWRANK = re.compile(r"lowrank([1-9][0-9]*)?")


def parse(moments) -> Tuple[str, Optional[int]]:
  """(kind, rank) of a moments setting: ("diagonal", None), ("full", None), ("lowrank", None)
  (full rank) or ("lowrank", k) for "lowrank<k>". ValueError naming the choices."""
  if moments in ("diagonal", "full"):
    return moments, None
  match = _LOWRANK.fullmatch(moments) if isinstance(moments, str) else None
  if match is None:
    raise ValueError(f"moments must be diagonal, lowrank, lowrank<k> (k >= 1: at most k state "
                     f"dimensions kept correlated) or full, got {moments!r}.")
  return "lowrank", int(match.group(1)) if match.group(1) else None
