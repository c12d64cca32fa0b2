"""What a dataset build is asked (experiments.collect's flags as a value: `Options`), which of its
options shape the SAC run (hence its actors) and which a recorded dataset, and the command that
asks for a build again (`collect_command`). The builds themselves: recipes.py.
"""
from __future__ import annotations

import dataclasses
import shlex
from typing import Optional, Sequence


@dataclasses.dataclass(frozen=True)
class Options:
  """Everything a build needs (the CLI flags, as a value tests can construct directly)."""
  steps: int = 1_000_000
  sac_steps: int = 1_000_000
  start_steps: int = 10_000
  eval_every: int = 10_000
  eval_episodes: int = 10
  medium_fraction: float = 1.0 / 3.0
  medium_consecutive: int = 2
  checkpoint_every: int = 50_000
  train_every: int = 1000
  log_every: int = 5_000
  hidden: tuple = (256, 256)
  batch_size: int = 256
  rollout_policy: str = "stochastic"
  num_envs: int = 8
  max_episode_steps: Optional[int] = None
  seed: int = 0
  workdir: str = "runs/collect"
  overwrite: bool = False
  from_actors: Optional[str] = None   # record medium / expert from the actors saved in this folder
  actors_only: bool = False           # only export the SAC run's actors from its checkpoint


# Options that shape the SAC run (hence its actors), and those that shape a recorded dataset.
SAC_FLAGS = ("sac_steps", "start_steps", "eval_every", "eval_episodes", "medium_fraction",
             "medium_consecutive", "train_every", "hidden", "batch_size", "max_episode_steps",
             "seed", "workdir")
RECORD_FLAGS = ("seed", "num_envs", "rollout_policy", "max_episode_steps")


def collect_command(name: str, opts: "Options", keys: Sequence[str] = (), **extra) -> str:
  """`python -m experiments.collect --env=<name>` with the options among `keys` that differ from
  their defaults, then `extra` flags (True: a bare --flag)."""
  default = Options()
  parts = ["python -m experiments.collect", f"--env={name}"]
  items = [(k, getattr(opts, k)) for k in keys if getattr(opts, k) != getattr(default, k)]
  for k, v in items + list(extra.items()):
    if v is True:
      parts.append(f"--{k}")
    else:
      value = ",".join(str(x) for x in v) if isinstance(v, (tuple, list)) else str(v)
      parts.append(f"--{k}={shlex.quote(value)}")
  return " ".join(parts)
