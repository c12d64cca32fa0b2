"""Dataset names, owned here (settings/config.py reads them, never the other way). The project's
datasets: the D4RL tasks `<env>-<quality>` (D4RL_TASKS, e.g. `walker2d-medium-replay`)
and its mixed datasets `<env>-random-<partner>-<p>pct` (e.g. `hopper-random-expert-5pct`), all
listed by valid_names() (as two patterns in words: valid_names_text()) and split by
parse_name(). A short name maps to the local Minari id that `experiments/collect.py` writes:
`mombo/<env>/<quality>-v0` (`minari_id`). Any Minari dataset id (`mujoco/hopper/medium-v0`,
`test/hopper/tiny-v0`) is used as it is (`resolve`). `env_of` tells the environment of either
from the name and the env ids its metadata records (`minari_io.env_name` reads them): this
module does no I/O.
"""
from __future__ import annotations

import difflib
from typing import Optional, Sequence

ENVS = ("halfcheetah", "hopper", "walker2d")
D4RL_QUALITIES = ("random", "medium", "medium-replay", "medium-expert", "expert")
# The D4RL tasks: every env at every D4RL quality. Every reference table (settings/references.py)
# has one row each.
D4RL_TASKS = tuple(f"{env}-{quality}" for env in ENVS for quality in D4RL_QUALITIES)
# The mixed datasets (the paper's appendix): random data with p % of a partner's.
MIXED_PARTNERS = ("medium", "expert")
MIXED_PERCENTS = (1, 5, 10, 50)

NAMESPACE = "mombo"
VERSION = 0


def valid_names() -> list:
  """All short dataset names: the D4RL tasks (sorted), then the mixed datasets."""
  names = sorted(D4RL_TASKS)
  for env in ENVS:
    for partner in MIXED_PARTNERS:
      names += [f"{env}-random-{partner}-{p}pct" for p in MIXED_PERCENTS]
  return names


def valid_names_text(name: Optional[str] = None) -> str:
  """The valid names as their two patterns, each part's choices listed once (the 39 names in a
  row read as one 1,100-character line), and the closest valid name to `name` when there is one."""
  close = difflib.get_close_matches(name, valid_names(), n=1) if isinstance(name, str) else []
  return ((f"Did you mean {close[0]}? " if close else "")
          + f"Valid names: <env>-<quality> with <env> one of {'|'.join(ENVS)} and <quality> one "
          f"of {'|'.join(D4RL_QUALITIES)} (e.g. hopper-medium-replay), or the mixed "
          f"<env>-random-<{'|'.join(MIXED_PARTNERS)}>-<{'|'.join(map(str, MIXED_PERCENTS))}>pct "
          "(e.g. hopper-random-expert-5pct)")


def parse_name(name: str) -> tuple:
  """'walker2d-medium-replay' -> ('walker2d', 'medium-replay'). Raises ValueError with the valid
  names."""
  env, _, quality = name.partition("-")
  if env not in ENVS or name not in valid_names():
    raise ValueError(f"Unknown dataset name {name!r}. {valid_names_text(name)}; or pass a Minari "
                     "dataset id with --dataset.")
  return env, quality


def minari_id(name: str) -> str:
  """'hopper-random-medium-5pct' -> 'mombo/hopper/random-medium-5pct-v0'. ValueError if unknown."""
  env, quality = parse_name(name)
  return f"{NAMESPACE}/{env}/{quality}-v{VERSION}"


def short_name(dataset_id: str) -> Optional[str]:
  """Inverse of `minari_id` for our own namespace ('mombo/hopper/random-v0' -> 'hopper-random'),
  None for any other id."""
  parts = dataset_id.split("/")
  if len(parts) != 3 or parts[0] != NAMESPACE:
    return None
  quality, _, _ = parts[2].rpartition("-v")
  name = f"{parts[1]}-{quality}"
  return name if name in valid_names() else None


def is_dataset_id(name: str) -> bool:
  """A Minari id (namespace/env/name-vN) rather than a short name or env name."""
  return "/" in name


def resolve(name: str) -> str:
  """Minari dataset id for a short name or an id. Unknown short names raise ValueError at once."""
  if not isinstance(name, str) or not name:
    raise ValueError(f"Dataset name must be a non-empty string, got {name!r}. "
                     f"{valid_names_text()}; or a Minari id such as mujoco/hopper/medium-v0.")
  if is_dataset_id(name):
    # minari only for a dataset id: the report imports data/ without it
    from minari.dataset.minari_dataset import parse_dataset_id
    try:
      parse_dataset_id(name)
    except Exception as e:  # minari raises several types for malformed ids
      raise ValueError(f"Malformed Minari dataset id {name!r} ({e}); expected "
                       "namespace/env/name-vN, e.g. mujoco/hopper/medium-v0.") from e
    return name
  return minari_id(name)


def _env_from_text(text: str) -> Optional[str]:
  """'hopper' for 'Hopper-v5', 'mujoco/hopper/medium-v0', 'hopper-random', ...; None if absent."""
  low = text.lower()
  for env in ENVS:
    # 'hopper', 'Hopper-v5', 'hopper-random', '.../hopper/...'
    if low == env or low.startswith(env + "-") or f"/{env}/" in f"/{low}/":
      return env
  return None


def env_of(name: str, spec_ids: Sequence[str]) -> str:
  """The environment (halfcheetah | hopper | walker2d) of a short name, env name or dataset id. An
  id's comes from `spec_ids` (the env ids its metadata records, eval env first; empty when it has
  none: minari_io.env_name reads them), else from the id itself."""
  if name in ENVS:
    return name
  if not is_dataset_id(name):
    return parse_name(name)[0]
  for spec_id in spec_ids:
    env = _env_from_text(spec_id) if spec_id else None
    if env:
      return env
  env = _env_from_text(name)
  if env is None:
    raise ValueError(f"Cannot tell the environment of dataset {name!r}: its id names none of "
                     f"{', '.join(ENVS)} and it has no env spec in its metadata.")
  return env


def collector_command(dataset_id: str) -> Optional[str]:
  """The collector command that builds this dataset (or its D4RL-recipe twin), if there is one."""
  name = short_name(dataset_id)
  if name is None:
    parts = dataset_id.split("/")
    env = _env_from_text(dataset_id)
    quality = parts[-1].rpartition("-v")[0] if parts else ""
    candidate = f"{env}-{quality}"
    name = candidate if env and candidate in valid_names() else None
  return None if name is None else f"python -m experiments.collect --env={name}"
