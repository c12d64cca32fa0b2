"""Where a local dataset comes from and what identifies it: the provenance its metadata records
(mombo_jax.collection.recipes writes it), whether it is a reduced build of its recipe, its
environment, and the identity (id, size, fingerprint) that saved dynamics are matched against.
"""
from __future__ import annotations

import json
import zlib
from typing import TYPE_CHECKING, List, Optional

import numpy as np

from mombo_jax.data import minari_io, names

if TYPE_CHECKING:
  from mombo_jax.data.transitions import Transitions

# The transitions of each recipe's full build (mombo_jax.collection.recipes; the report reads them
# without importing the builder, which loads JAX); None: the recipe fixes no size (medium-replay:
# the SAC run's buffer).
RECIPE_STEPS = {"random": 1_000_000, "medium": 1_000_000, "expert": 1_000_000,
                "medium-expert": 2_000_000, "medium-replay": None, "mixed": 1_000_000}
# D4RL's SAC run behind its expert datasets: 1M steps (the collector's default --sac_steps). An
# expert actor from a shorter run makes a reduced expert dataset, and a reduced mixed dataset of
# every mix it is the partner of, whatever their sizes (`reduced_notes`).
RECIPE_SAC_STEPS = 1_000_000


def provenance(name: str) -> Optional[dict]:
  """How a local dataset was built ({"recipe", "steps", "recipe_steps", "command"}), from its
  metadata; None when it is not local or records none (e.g. a downloaded Minari dataset)."""
  meta = minari_io.local_metadata(names.resolve(name))
  raw = meta.get(minari_io.PROVENANCE_KEY) if meta else None
  if not raw:
    return None
  try:
    out = json.loads(raw) if isinstance(raw, str) else dict(raw)
  except (TypeError, ValueError):
    return None
  return out if isinstance(out, dict) else None


def smaller_than_recipe(name: str) -> Optional[str]:
  """A sentence saying that a local dataset is a reduced build of its recipe (fewer transitions
  than the recipe's size), with the command that rebuilds it; None when it is full size or
  records no recipe."""
  prov = provenance(name)
  if not prov or not prov.get("recipe_steps") or prov.get("steps") is None:
    return None
  if int(prov["steps"]) >= int(prov["recipe_steps"]):
    return None
  return (f"{names.resolve(name)} is a reduced build: {int(prov['steps'])} transitions where its "
          f"recipe ({prov.get('recipe')}) has {int(prov['recipe_steps'])}. Rebuild it at full "
          f"size with `{prov.get('command')}`, or pass --allow_small_dataset to train on it "
          "anyway.")


def expert_notes(actors: Optional[dict]) -> List[str]:
  """The phrases saying that an expert actor among `actors` (provenance's {"actors": {quality:
  {"sac_step", ...}}}) comes from a SAC run shorter than RECIPE_SAC_STEPS; [] when none does."""
  expert = (actors or {}).get("expert")
  step = expert.get("sac_step") if isinstance(expert, dict) else None
  if step is None or int(step) >= RECIPE_SAC_STEPS:
    return []
  return [f"expert actor from a SAC run of {int(step):,} steps (D4RL's recipe: "
          f"{RECIPE_SAC_STEPS:,})"]


def reduced_notes(name: str) -> List[str]:
  """What a local dataset's provenance says it has less of than its recipe beside its size (which
  smaller_than_recipe tells): the "reduced" phrases the collector recorded (an expert actor from a
  shorter SAC run, inherited by the mixed datasets it is the partner of); [] when none."""
  notes = (provenance(name) or {}).get("reduced")
  return [str(n) for n in notes] if isinstance(notes, list) else []


def dataset_env(name: str) -> Optional[str]:
  """The environment a dataset belongs to, from its short name, or for an id from its local
  metadata (eval env spec, env spec) or the id itself; None when nothing tells."""
  try:
    return minari_io.env_name(name)
  except ValueError:
    return None


def dataset_identity(name: str, transitions: "Transitions") -> dict:
  """What identifies the data a model was trained on: the Minari id, the number of transitions and
  the fingerprint of the arrays (saved dynamics are reused only when all three match)."""
  return {"dataset": names.resolve(name), "num_transitions": int(len(transitions.rewards)),
          "fingerprint": fingerprint(transitions)}


def identity_changes(recorded: dict, identity: dict) -> str:
  """What differs between the data identity a run recorded (config.json's "data") and
  dataset_identity of the data now, as "fingerprint: 'a' -> 'b', ..."; "" when nothing does.
  Training (workdir.Workdir.check_data) and the analyses of a trained run (trained.check_data)
  refuse data that differs, naming this."""
  return ", ".join(f"{k}: {recorded.get(k)!r} -> {identity[k]!r}" for k in identity
                   if recorded.get(k) != identity[k])


def fingerprint(transitions: "Transitions", samples: int = 4096) -> str:
  """A cheap, process-independent fingerprint of a dataset's arrays: CRC32 over the shapes and a
  fixed strided subsample (<= `samples` rows) of every field. Tells datasets apart (another env,
  size, recipe or rebuild) without hashing gigabytes."""
  crc = 0
  for field in transitions:
    arr = np.ascontiguousarray(np.asarray(field, np.float32))
    crc = zlib.crc32(repr(arr.shape).encode(), crc)
    step = max(1, arr.shape[0] // samples)
    crc = zlib.crc32(np.ascontiguousarray(arr[::step]).tobytes(), crc)
  return f"{crc:08x}"
