"""Algorithms as values: one frozen `Algorithm` per algorithm, and the registry that names them.

An `Algorithm` holds everything that tells one model-based offline RL algorithm from another; the
training core (train, sac, rollout, targets) reads its fields, never an algorithm's name:

  bellman_target  the Bellman target (a function; Config.target is the name of MOMBO's variant),
                  targets' signature: target(agent, batch, key, *, dyn,
                  config, term_fn, beta=None, real_rows=None, auto_alpha=None) -> (y [B], aux)
  penalty         its uncertainty U(s, a) [B], unscaled (targets' penalty_<algo> signature), or
                  None for an algorithm without one (plain SAC)
  penalise_reward rollouts subtract beta x its penalty from the model reward instead of the
                  target penalising (MOPO): a penalty of every member's Gaussians
                  (targets.EnsemblePenalty, MOPO's targets.penalty_mopo) comes from the rollout's
                  own model step, any other is called on the step's rows. (Spelled
                  penalize_reward before; that keyword still works, with a DeprecationWarning.)
  moment_matching the critics see the state's variance: the actor is trained on their moment-
                  matched mean at the batch's obs_var (adinlab/MOMBO policies/mombo.py), and the
                  quantifier study reports eq. (1)'s U beside the run's own (MOMBO)
  references      the key of its reference settings tables in references.SOURCES that
                  config.make_config fills a run from (another algorithm's, for one that borrows
                  them); None: none, the Config defaults
  min_elites      the elites its penalty needs (a std over elites needs two)
  coefficient     what beta is called for it ("lambda" for MOPO)
  origin          one phrase: where this variant comes from (groups.describe_algorithm)

A run names its algorithm by Config.algo and, for an algorithm with several variants (MOMBO's
Bellman targets), Config.target; `get(algo, target)` / `Config.algorithm` give the Algorithm, and
targets.get_target / get_penalty / bind its functions (the one way: built-in Algorithms hold
stand-ins, _Target, that load no JAX). The
"algo[-target]" names runs carry (workdirs, titles, report columns) come from `label` alone.
docs/architecture.md ("Add an algorithm") shows how to register one from outside the package.

The moment modes of a moment-matching algorithm's targets (Config.agent.moments, `parse_moments`;
here, beside the registry, because the settings and run records check and name them without JAX):
  diagonal     the paper's Algorithm 1 and the released code's: independent units after every
               layer (moment_matching/moments.py, the critic's MMDense path); the default.
  lowrank      the input's low-rank covariance carried through the critic
               (moment_matching/lowrank.py), every random input dimension kept (rank = the
               state's dimension).
  lowrank<k>   the same with at most k input dimensions kept correlated per row (k >= 1).
  full         propagate's full covariance (moment_matching/full.py): for the analyses (Table 2's
               quantifier, mm_vs_mc); ~1,000x the plain network, refused for training.
`register` notes the module that registered a name (`module_of`); runs record it (config.json's
algo_module), and their readers import it again (`ensure`); `from_spec` reads the command line's
`--algo=NAME` or `--algo=MODULE:NAME`.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import re
import sys
import warnings
from typing import Callable, Dict, Optional, Tuple

from mombo_jax.errors import UserError

DEFAULT_MOMENTS = "diagonal"
_LOWRANK = re.compile(r"lowrank([1-9][0-9]*)?")


def parse_moments(moments) -> Tuple[str, Optional[int]]:
  """(kind, rank) of a moments setting (module docstring): ("diagonal", None), ("full", None),
  ("lowrank", None) (full rank) or ("lowrank", k) for "lowrank<k>". ValueError naming the
  choices."""
  if moments in ("diagonal", "full"):
    return moments, None
  match = _LOWRANK.fullmatch(moments) if isinstance(moments, str) else None
  if match is None:
    raise ValueError(f"moments must be diagonal, lowrank, lowrank<k> (k >= 1: at most k state "
                     f"dimensions kept correlated) or full, got {moments!r}.")
  return "lowrank", int(match.group(1)) if match.group(1) else None


@dataclasses.dataclass(frozen=True)
class _Target:
  """Stands for the function targets.<name> in a built-in Algorithm: the registry (names, variants,
  labels, tables) then loads without JAX, so the run records and the report read runs without
  importing it (tests/test_records.py). Compared and hashed by name (two stand-ins of one name
  are equal), never with the function itself: the core takes an Algorithm's functions only through
  targets.get_target / get_penalty / bind, which resolve stand-ins (`function`), and compares
  those."""
  name: str

  @property
  def function(self) -> Callable:
    # JAX: targets imports jax, which `import mombo_jax.core.algorithms` must not load.
    from mombo_jax.core import targets
    return getattr(targets, self.name)

  def __call__(self, *args, **kwargs):
    return self.function(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class Algorithm:
  """One algorithm (one variant of it). Hashable: a static argument of the compiled epoch."""
  name: str
  bellman_target: Callable
  penalty: Optional[Callable] = None
  variant: str = ""
  penalise_reward: bool = False
  moment_matching: bool = False
  references: Optional[str] = None
  min_elites: int = 1
  coefficient: str = "beta"
  origin: str = ""

  def __post_init__(self):
    if not self.name or not self.name.replace("_", "").isalnum() or self.name != self.name.lower():
      raise ValueError(f"Algorithm name {self.name!r}: use lower-case letters, digits and _.")
    if not callable(self.bellman_target):
      raise ValueError(f"Algorithm {self.name!r}: bellman_target must be a function, got "
                       f"{self.bellman_target!r}.")
    if self.penalise_reward and self.penalty is None:
      raise ValueError(f"Algorithm {self.name!r}: penalise_reward needs a penalty to subtract "
                       "(targets.penalty_mopo for MOPO's, or your own).")

  @property
  def label(self) -> str:
    """'mombo-elite_spread', 'mobile': label(name, variant)."""
    return label(self.name, self.variant)


_RENAMED = ("Algorithm's penalize_reward is spelled penalise_reward now (one spelling, as the "
            "package's other words: normalise, optimiser); the old name will go in a later "
            "release.")


def _penalize_reward(algorithm: Algorithm) -> bool:
  """The old spelling, read: algorithm.penalise_reward, with a DeprecationWarning."""
  warnings.warn(_RENAMED, DeprecationWarning, stacklevel=2)
  return algorithm.penalise_reward


def _taking_old_spelling(init):
  """Algorithm's generated __init__, also taking the old keyword penalize_reward (a
  DeprecationWarning). Not a field (an InitVar would be read back by dataclasses.replace and
  override a new penalise_reward), so equality, hash and replace know only penalise_reward."""
  @functools.wraps(init)
  def __init__(self, *args, penalize_reward=None, **kwargs):
    if penalize_reward is not None:
      warnings.warn(_RENAMED, DeprecationWarning, stacklevel=2)
      kwargs["penalise_reward"] = penalize_reward
    init(self, *args, **kwargs)
  return __init__


Algorithm.__init__ = _taking_old_spelling(Algorithm.__init__)
Algorithm.penalize_reward = property(_penalize_reward)

_REGISTRY: Dict[str, Dict[str, Algorithm]] = {}
# name -> the module whose import registers it (the caller of register): what a run records
# (config.json's "algo_module") so that every reader can import it again (`ensure`).
_MODULES: Dict[str, str] = {}


def register(algorithm: Algorithm, module: Optional[str] = None) -> Algorithm:
  """Adds `algorithm` under (name, variant); registering an equal Algorithm again is a no-op.
  module: the module whose import registers it (default: the caller's, which is right when the
  register call sits at a module's top level); runs record it, and readers import it again.
  ValueError when another Algorithm holds that name and variant, or when a name would hold both
  a plain Algorithm and variants."""
  if module is None:
    module = sys._getframe(1).f_globals.get("__name__", "__main__")
  have = _REGISTRY.setdefault(algorithm.name, {})
  old = have.get(algorithm.variant)
  if old is not None and old != algorithm:
    raise ValueError(f"An algorithm {algorithm.label!r} is registered already; pick another name.")
  if have and ("" in have) != (algorithm.variant == ""):
    raise ValueError(f"{algorithm.name!r} mixes a plain algorithm and variants; give every "
                     "Algorithm of one name a variant, or none.")
  if have and next(iter(have.values())).references != algorithm.references:
    raise ValueError(f"The variants of {algorithm.name!r} must share one references table key.")
  have[algorithm.variant] = algorithm
  _MODULES.setdefault(algorithm.name, module)
  return algorithm


def module_of(name: str) -> Optional[str]:
  """The module whose import registers algorithm `name` (None for an unregistered name)."""
  return _MODULES.get(name)


def ensure(name: str, module: Optional[str] = None) -> None:
  """Makes algorithm `name` registered for a reader of a run that recorded it (config.json's algo
  and algo_module): nothing when it is, else imports `module`, the one that registered it when the
  run trained. UserError in one line naming the module to put on the path when that fails, or
  when the run recorded none (a run written before runs recorded it, or an algorithm registered
  by a script, __main__, which cannot be imported again)."""
  have = _MODULES.get(name)
  if name in _REGISTRY and (not module or module in ("__main__", have)):
    return
  fix = ("put the folder holding that module on PYTHONPATH (or import it before reading the "
         "run); docs/architecture.md, \"Add an algorithm\"")
  if not module or module == "__main__":
    where = ("was registered by a script (__main__), which cannot be imported again"
             if module == "__main__" else "is not registered and the run does not say where it "
             "comes from")
    raise UserError(f"The run's algorithm {name!r} {where}: move its register call into a "
                    f"module, import that module first ({fix}).")
  try:
    importlib.import_module(module)
  except ImportError as e:
    raise UserError(f"The run's algorithm {name!r} comes from module {module!r}, which cannot "
                    f"be imported ({e}): {fix}.") from None
  except ValueError as e:      # its register call met another Algorithm of that name (register)
    raise UserError(f"The run's algorithm {name!r} comes from module {module!r}, but {have!r} "
                    f"registered another algorithm of that name here ({e}).") from None
  if name not in _REGISTRY:
    raise UserError(f"The run's algorithm {name!r} was registered by module {module!r}, but "
                    "importing it registers no such algorithm now: register it there again "
                    "(mombo_jax.core.algorithms.register).")


def from_spec(spec: str) -> str:
  """The algorithm name of a command line's `NAME` (a registered one) or `MODULE:NAME` (MODULE
  imported first: its register call adds NAME). ValueError in one line naming the choices, or
  the module that cannot be imported and what to put on the path."""
  module, _, name = spec.rpartition(":")
  if module:
    try:
      importlib.import_module(module)
    except ImportError as e:
      raise ValueError(f"cannot import module {module!r} ({e}); put the folder holding it on "
                       "PYTHONPATH, or run from that folder.") from None
    if name not in _REGISTRY:
      raise ValueError(f"module {module!r} registers no algorithm {name!r}; it registers "
                       f"{', '.join(n for n, m in _MODULES.items() if m == module) or 'none'}.")
    return name
  if name not in _REGISTRY:
    raise ValueError(f"value should be one of <{'|'.join(names())}>, or MODULE:NAME for an "
                     "algorithm registered by your own module.")
  return name


def names() -> Tuple[str, ...]:
  """The registered algorithm names, in registration order."""
  return tuple(_REGISTRY)


def variants(name: str) -> Tuple[str, ...]:
  """The variants (targets) registered for `name`; () for a plain algorithm or an unknown name."""
  return tuple(v for v in _REGISTRY.get(name, ()) if v)


def get(name: str, target: Optional[str] = None) -> Algorithm:
  """The Algorithm registered as `name` (its variant `target` where it has variants; ignored
  where it has none). ValueError naming the registered ones."""
  if name not in _REGISTRY:
    raise ValueError(f"Unknown algo {name!r}; choose one of {', '.join(names())} (or register "
                     "one: mombo_jax.core.algorithms.register).")
  have = _REGISTRY[name]
  if "" in have:
    return have[""]
  if target not in have:
    raise ValueError(f"Unknown target {target!r} for {name}; choose one of "
                     f"{', '.join(variants(name))}.")
  return have[target]


def tables(name: str) -> Optional[str]:
  """The references.SOURCES key of algorithm `name`'s settings tables (shared by its variants),
  None for none. ValueError for an unknown name."""
  return get(name, next(iter(variants(name)), None)).references


def label(algo: str, target: Optional[str] = None, form: str = "name") -> str:
  """The one label builder of a run's algorithm (a config's algo and target; an unregistered name
  counts as having no variants, so old or foreign runs still get a label):

  form "name":   'mombo-elite_spread', 'mobile' (workdir names);
  form "title":  'mombo (elite_spread)', 'mobile' (plot titles, logger lines);
  form "column": 'MOMBO (elite_spread)', 'MOBILE' (the report's columns; a variant algorithm's
                 config without its target gives 'MOMBO (target?)', never a guess).
  """
  has = bool(variants(algo))
  variant = (target or "target?") if has else ""
  if form == "name":
    return algo + (f"-{variant}" if variant else "")
  if form == "title":
    return algo + (f" ({variant})" if variant else "")
  if form == "column":
    return algo.upper() + (f" ({variant})" if variant else "")
  raise ValueError(f"label form {form!r}: choose name, title or column.")


def variant_of(algo: str, target: Optional[str]) -> str:
  """target where `algo` has variants, else '' (a run's variant as tables record it)."""
  return (target or "") if variants(algo) else ""


# ------------------------------------------------------------------------------ the built-ins

# MOMBO: the adinlab/MOMBO code (policies/mombo.py) and the paper; its Bellman target is the
# variant (config.target). The per-task tables are the authors' (adinlab/MOMBO configs/gym).
MOMBO_LCB = register(Algorithm(
    "mombo", _Target("mombo_lcb"), _Target("penalty_mombo_lcb"), variant="lcb",
    moment_matching=True, references="mombo", origin="the paper's eq. (1)"))
MOMBO_ELITE_SPREAD = register(Algorithm(
    "mombo", _Target("mombo_elite_spread"), _Target("penalty_elite_spread"),
    variant="elite_spread", moment_matching=True, references="mombo", min_elites=2,
    origin="the released code's"))
MOMBO_MIXTURE = register(Algorithm(
    "mombo", _Target("mombo_mixture"), _Target("penalty_mixture"), variant="mixture",
    moment_matching=True, references="mombo", min_elites=2, origin="law of total variance"))
# MOBILE (OfflineRL-Kit offlinerlkit/policy/model_based/mobile.py): a std over elites.
MOBILE = register(Algorithm("mobile", _Target("mobile"), _Target("penalty_mobile"),
                            references="mobile", min_elites=2))
# MOPO (OfflineRL-Kit offlinerlkit/policy/model_based/mopo.py): the reward is penalised in the
# rollouts, the target is plain SAC's; beta is its lambda.
MOPO = register(Algorithm("mopo", _Target("mopo"), _Target("penalty_mopo"), penalise_reward=True,
                          references="mopo", coefficient="lambda"))
# Plain SAC, no penalty: online SAC's (mombo_jax.collection.online_sac builds datasets with it). Not
# registered: it is no offline algorithm, so make_config refuses algo="sac".
SAC = Algorithm("sac", _Target("plain"))
