"""Each algorithm's reference settings, by source: whose code a run's per-task settings follow.

A source is a reference code base whose runs this project reproduces: its per-task table (the
D4RL tasks), the settings it uses for every task (its argparse defaults or default config), and
the cadence at which the paper preset evaluates a run of it. `Config.reference` names the source
(config.json records it); `config.make_config(..., reference=...)` / `--reference=` selects one.

  mombo   authors         adinlab/MOMBO configs/gym/<task>.py: the paper's MOMBO column (default)
  mobile  offlinerl_kit   OfflineRL-Kit run_example/run_mobile.py: the paper's MOBILE column, read
                          from OfflineRL-Kit's log files (paper, section 5) (default)
          authors         the MOBILE authors' yihaosun1124/mobile configs/gym/<task>.py
  mopo    offlinerl_kit   OfflineRL-Kit run_example/run_mopo.py; the random datasets from the MOPO
                          authors' tianheyu927/mopo (OfflineRL-Kit suggests nothing for them)
                          (default)

Keys of `tasks` and `settings` are Config fields; everything not listed keeps the Config default,
which all three references share (adinlab/MOMBO configs/gym/default.py, yihaosun1124/mobile
configs/gym/default.py and OfflineRL-Kit run_mopo.py / run_mobile.py argparse defaults agree on
lr, networks, gamma, tau, batch, 3000 x 1000 steps, 50k rollouts, 5 retained epochs, real ratio
0.05, 7/5 members/elites, 10 evaluation episodes). `beta` is MOMBO's / MOBILE's penalty_coef,
MOPO's lambda. Where a reference fixes alpha (auto_alpha False) it uses its default alpha 0.2.
No algorithm inherits another's extras. docs/protocol.md ("Reference settings and evaluation
cadence") says how each source's evaluation relates to this project's numbers.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional


@dataclasses.dataclass(frozen=True)
class Source:
  """One reference code base's settings for one algorithm.

  code: the repository and file the settings come from.
  tasks: D4RL short name -> Config overrides (each row cites its file).
  settings: Config overrides for every dataset run under this source (its argparse defaults).
  eval_every: the paper preset's epochs between evaluations for this source.
  reference_eval_every: epochs between the reference trainer's own evaluations (each also
    evaluates at its last epoch); differs from eval_every where that cadence is impractical here.
  """
  code: str
  tasks: Dict[str, dict]
  settings: dict
  eval_every: int
  reference_eval_every: int


# MOMBO: the released code, adinlab/MOMBO configs/gym/<task>.py (the file of each task named
# beside it). These are the settings that produced the paper's Table 1.
MOMBO_AUTHORS = {
    "halfcheetah-random": dict(rollout_length=5, beta=0.5),    # halfcheetah_random.py
    "halfcheetah-medium": dict(rollout_length=5, beta=0.75),   # halfcheetah_medium.py
    "halfcheetah-medium-replay": dict(rollout_length=5, beta=0.2),  # halfcheetah_medium_replay.py
    "halfcheetah-medium-expert": dict(rollout_length=5, beta=1.0,   # halfcheetah_medium_expert.py
                                      real_ratio=0.5),
    "hopper-random": dict(rollout_length=5, beta=4.5),         # hopper_random.py
    "hopper-medium": dict(rollout_length=5, beta=3.0,          # hopper_medium.py
                          auto_alpha=False, alpha=0.2),
    "hopper-medium-replay": dict(rollout_length=5, beta=0.15,  # hopper_medium_replay.py
                                 auto_alpha=False, alpha=0.2),
    "hopper-medium-expert": dict(rollout_length=5, beta=1.5),  # hopper_medium_expert.py
    "walker2d-random": dict(rollout_length=5, beta=2.5),       # walker2d_random.py
    "walker2d-medium": dict(rollout_length=5, beta=0.75,       # walker2d_medium.py
                            dyn_max_epochs=30),
    "walker2d-medium-replay": dict(rollout_length=1, beta=0.5),     # walker2d_medium_replay.py
    "walker2d-medium-expert": dict(rollout_length=1, beta=1.5),     # walker2d_medium_expert.py
}

# MOBILE as OfflineRL-Kit runs it: run_example/run_mobile.py's "suggested hypers" block (rollout
# length, penalty coef; auto-alpha=False on hopper-medium alone) with its argparse defaults for the
# rest: real ratio 0.05 on every task (halfcheetah-medium-expert too), learned alpha elsewhere
# (hopper-medium-replay too), dynamics.train(max_epochs=args.dynamics_max_epochs) with
# --dynamics-max-epochs 30 for every task (`settings` below), deterministic backup. The block
# and the 30-epoch default are from its commit 43ec147 (2024-04-15); docs/protocol.md says what
# that leaves open.
MOBILE_OFFLINERL_KIT = {
    "halfcheetah-random": dict(rollout_length=5, beta=0.5),    # run_mobile.py
    "halfcheetah-medium": dict(rollout_length=5, beta=0.5),    # run_mobile.py
    "halfcheetah-medium-replay": dict(rollout_length=5, beta=0.1),  # run_mobile.py
    "halfcheetah-medium-expert": dict(rollout_length=5, beta=2.0),  # run_mobile.py
    "hopper-random": dict(rollout_length=5, beta=5.0),         # run_mobile.py
    "hopper-medium": dict(rollout_length=5, beta=1.5,          # run_mobile.py
                          auto_alpha=False, alpha=0.2),
    "hopper-medium-replay": dict(rollout_length=5, beta=0.1),  # run_mobile.py
    "hopper-medium-expert": dict(rollout_length=5, beta=1.5),  # run_mobile.py
    "walker2d-random": dict(rollout_length=5, beta=2.0),       # run_mobile.py
    "walker2d-medium": dict(rollout_length=5, beta=0.5),       # run_mobile.py
    "walker2d-medium-replay": dict(rollout_length=1, beta=0.5),     # run_mobile.py
    "walker2d-medium-expert": dict(rollout_length=1, beta=1.5),     # run_mobile.py
}

# MOBILE as its authors run it: yihaosun1124/mobile configs/gym/<task>.py. Its extras (fixed
# alpha on hopper-medium / -medium-replay, walker2d-medium's 30 dynamics epochs,
# halfcheetah-medium-expert's real ratio 0.5) are MOBILE's own; MOMBO's code copied them.
MOBILE_AUTHORS = {
    "halfcheetah-random": dict(rollout_length=5, beta=0.5),    # halfcheetah_random.py
    "halfcheetah-medium": dict(rollout_length=5, beta=0.5),    # halfcheetah_medium.py
    "halfcheetah-medium-replay": dict(rollout_length=5, beta=0.1),  # halfcheetah_medium_replay.py
    "halfcheetah-medium-expert": dict(rollout_length=5, beta=1.0,   # halfcheetah_medium_expert.py
                                      real_ratio=0.5),
    "hopper-random": dict(rollout_length=5, beta=5.0),         # hopper_random.py
    "hopper-medium": dict(rollout_length=5, beta=1.5,          # hopper_medium.py
                          auto_alpha=False, alpha=0.2),
    "hopper-medium-replay": dict(rollout_length=5, beta=0.1,   # hopper_medium_replay.py
                                 auto_alpha=False, alpha=0.2),
    "hopper-medium-expert": dict(rollout_length=5, beta=1.5),  # hopper_medium_expert.py
    "walker2d-random": dict(rollout_length=5, beta=2.0),       # walker2d_random.py
    "walker2d-medium": dict(rollout_length=5, beta=0.5,        # walker2d_medium.py
                            dyn_max_epochs=30),
    "walker2d-medium-replay": dict(rollout_length=1, beta=0.5),     # walker2d_medium_replay.py
    "walker2d-medium-expert": dict(rollout_length=1, beta=1.5),     # walker2d_medium_expert.py
}

# MOPO: OfflineRL-Kit, run_example/run_mopo.py ("suggested hypers" for the -v2 datasets): learned
# alpha (--auto-alpha True) for every task, real ratio 0.05 everywhere, no dynamics epoch cap
# (dynamics.train(..., max_epochs_since_update=5)), soft backup, no target clamp (SACPolicy).
# OfflineRL-Kit suggests nothing for the random datasets: those come from the MOPO authors' code,
# tianheyu927/mopo examples/config/d4rl/<env>_random.py (D4RL -v0; rollout_length, penalty_coeff).
MOPO_OFFLINERL_KIT = {
    # tianheyu927/mopo halfcheetah_random.py
    "halfcheetah-random": dict(rollout_length=5, beta=0.5),
    "halfcheetah-medium": dict(rollout_length=5, beta=0.5),    # run_mopo.py
    "halfcheetah-medium-replay": dict(rollout_length=5, beta=0.5),  # run_mopo.py
    "halfcheetah-medium-expert": dict(rollout_length=5, beta=2.5),  # run_mopo.py
    "hopper-random": dict(rollout_length=5, beta=1.0),         # tianheyu927/mopo hopper_random.py
    "hopper-medium": dict(rollout_length=5, beta=5.0),         # run_mopo.py
    "hopper-medium-replay": dict(rollout_length=5, beta=2.5),  # run_mopo.py
    "hopper-medium-expert": dict(rollout_length=5, beta=5.0),  # run_mopo.py
    "walker2d-random": dict(rollout_length=1, beta=1.0),       # tianheyu927/mopo walker2d_random.py
    "walker2d-medium": dict(rollout_length=5, beta=0.5),       # run_mopo.py
    "walker2d-medium-replay": dict(rollout_length=1, beta=2.5),     # run_mopo.py
    "walker2d-medium-expert": dict(rollout_length=1, beta=2.5),     # run_mopo.py
}

# The expert datasets are in none of the references' tables: each algorithm, under each source,
# reuses its own medium-expert settings.
for _table in (MOMBO_AUTHORS, MOBILE_OFFLINERL_KIT, MOBILE_AUTHORS, MOPO_OFFLINERL_KIT):
  for _name in [n for n in _table if n.endswith("-medium-expert")]:
    _table[_name.replace("-medium-expert", "-expert")] = _table[_name]

# Evaluation cadences of the references' trainers (epochs between evaluations):
# - adinlab/MOMBO utils/policy_trainer.py: `if e % 50 == 0 or e == self._epoch` -> 50.
# - yihaosun1124/mobile utils/policy_trainer.py: `if e % 10 == 0` -> 10.
# - OfflineRL-Kit offlinerlkit/policy_trainer/mb_policy_trainer.py: after every epoch -> 1. Here
#   every evaluation point is also a checkpoint (Launch.evaluate), and one evaluation of a 48-cell
#   program takes longer than an epoch of training (BENCHMARKS.md), so OfflineRL-Kit's sources
#   evaluate every 10 epochs, the MOBILE authors' cadence (docs/protocol.md says what changes).
SOURCES = {
    "mombo": {
        "authors": Source("adinlab/MOMBO configs/gym/<task>.py", MOMBO_AUTHORS, {},
                          eval_every=50, reference_eval_every=50),
    },
    "mobile": {
        "offlinerl_kit": Source("OfflineRL-Kit run_example/run_mobile.py", MOBILE_OFFLINERL_KIT,
                                # run_mobile.py: --dynamics-max-epochs default 30
                                dict(dyn_max_epochs=30), eval_every=10, reference_eval_every=1),
        "authors": Source("yihaosun1124/mobile configs/gym/<task>.py", MOBILE_AUTHORS, {},
                          eval_every=10, reference_eval_every=10),
    },
    "mopo": {
        # MOPO is plain SAC on the penalised reward: soft backup, no target clamp (OfflineRL-Kit
        # offlinerlkit/policy/model_free/sac.py).
        "offlinerl_kit": Source("OfflineRL-Kit run_example/run_mopo.py (random datasets: "
                                "tianheyu927/mopo examples/config/d4rl)", MOPO_OFFLINERL_KIT,
                                dict(deterministic_backup=False, clip_target_min=None),
                                eval_every=10, reference_eval_every=1),
    },
}

# The source whose runs the paper reports for each algorithm: what make_config uses by default.
DEFAULT = {"mombo": "authors", "mobile": "offlinerl_kit", "mopo": "offlinerl_kit"}
# The source of a config.json written before runs recorded theirs (no "reference" field): the one
# table each algorithm had then. MOBILE's was its authors', not today's default.
LEGACY = {"mombo": "authors", "mobile": "authors", "mopo": "offlinerl_kit"}


def choices(algo: str) -> str:
  """'offlinerl_kit (default: OfflineRL-Kit run_example/run_mobile.py), authors (...)'."""
  return ", ".join(f"{name} ({'default: ' if name == DEFAULT[algo] else ''}{s.code})"
                   for name, s in SOURCES[algo].items())


def check(algo: str, reference: Optional[str]) -> str:
  """`reference` (None: the algorithm's default) checked against algo's sources; ValueError naming
  the valid ones."""
  if reference is None:
    return DEFAULT[algo]
  if reference not in SOURCES[algo]:
    raise ValueError(f"Unknown reference {reference!r} for {algo}; choose one of {choices(algo)}.")
  return reference


def source(algo: str, reference: Optional[str] = None) -> Source:
  """The Source of `algo` named `reference` (None: the default)."""
  return SOURCES[algo][check(algo, reference)]


def describe(config) -> str:
  """The opening progress line's account of where config's settings come from, and how its
  evaluation cadence relates to the source's own, e.g. "MOBILE settings
  (--reference=offlinerl_kit): OfflineRL-Kit run_example/run_mobile.py; evaluation every 10 epochs
  (the reference evaluates every epoch; docs/protocol.md, ...)"."""
  name = config.algo.upper()
  if config.reference is None:
    return f"{name} settings: set by hand, from no reference table."
  src = SOURCES[config.algorithm.references][config.reference]   # its own or borrowed tables
  every = lambda n: "every epoch" if n == 1 else f"every {n} epochs"  # noqa: E731
  cadence = f"evaluation {every(config.evaluation.eval_every)}"
  if config.evaluation.eval_every != src.reference_eval_every:
    cadence += (f" (the reference evaluates {every(src.reference_eval_every)}; "
                "docs/protocol.md, 'Reference settings and evaluation cadence')")
  return f"{name} settings (--reference={config.reference}): {src.code}; {cadence}."


def upgrade_record(record: dict) -> dict:
  """A config.json record read as the version that wrote it meant it: one written before runs
  recorded their source (no "reference" key) gets the source its algorithm's table came from
  then (LEGACY), so it is neither read as today's default nor as a different setup."""
  if "reference" in record or record.get("algo") not in LEGACY:
    return record
  return dict(record, reference=LEGACY[record["algo"]])
