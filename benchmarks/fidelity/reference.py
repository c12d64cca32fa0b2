"""The reference checkout --reference names: checked for the pinned commit, then its code imported
from there (never copied into this repository), with the stubs a CPU without gym / d4rl needs.

Checking. A git checkout (DIR is its top level): `git rev-parse HEAD` must be the pinned commit and
the Python files the harness imports must have no local changes. Any other folder (an archive, a
copy): the sha256 over those files (paths and contents, sorted) must equal the pinned tree's.
Either failure, or a folder that is not the reference at all, ends the run with one line naming
what was expected and the command that gets it.

This module imports no torch (the suite tests the refusal without it).
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import types
from typing import List, Tuple


@dataclasses.dataclass(frozen=True)
class Pinned:
  name: str
  url: str
  commit: str              # the full hash; its first 7 characters are what messages quote
  marker: str              # a file only this reference has (a wrong folder lacks it)
  folders: Tuple[str, ...]  # where the Python files the harness imports live
  sha256: str              # over those files at the commit (digest())


MOMBO = Pinned("adinlab/MOMBO", "https://github.com/adinlab/MOMBO",
               "079def7449c50c5b14351949d56dbba2586d3df5", "policies/mombo.py",
               ("policies", "dynamics", "models", "utils"),
               "1494cd4cc57e11fccb6cd82c17ab0232ea82fe7d7f4b4c259b9d63ab1a3a9327")
# mombo_jax/settings/references.py cites this commit for the baselines' settings.
KIT = Pinned("OfflineRL-Kit", "https://github.com/yihaosun1124/OfflineRL-Kit",
             "43ec147727d735c9584ff83284a3858159e98b68",
             "offlinerlkit/policy/model_based/mobile.py", ("offlinerlkit",),
             "c597dca0ba4c0c985c3e47c83f49a4103ddeeb23729cf4736d62fec3b076a183")
PINNED = {"mombo": MOMBO, "mombo-lcb": MOMBO, "mobile": KIT, "mopo": KIT}


def _get(pin: Pinned) -> str:
  folder = pin.url.rsplit("/", 1)[1]
  return f"git clone {pin.url} && git -C {folder} checkout {pin.commit[:7]}"


def _files(path: str, pin: Pinned) -> List[str]:
  out = []
  for folder in pin.folders:
    for top, _, names in os.walk(os.path.join(path, folder)):
      out += [os.path.relpath(os.path.join(top, n), path) for n in names if n.endswith(".py")]
  return sorted(out)


def digest(path: str, pin: Pinned) -> str:
  """sha256 over the reference's imported Python files (relative path, NUL, contents; sorted)."""
  h = hashlib.sha256()
  for rel in _files(path, pin):
    h.update(rel.encode() + b"\0")
    with open(os.path.join(path, rel), "rb") as f:
      h.update(f.read())
  return h.hexdigest()


def _git(path: str, *args: str):
  try:
    done = subprocess.run(["git", "-C", path, *args], capture_output=True, text=True, timeout=60)
  except (OSError, subprocess.TimeoutExpired):
    return None
  return done.stdout.strip() if done.returncode == 0 else None


def check(algo: str, path: str) -> str:
  """The reference's commit (full hash) if `path` is the pinned checkout for algo; SystemExit with
  one line otherwise."""
  pin = PINNED[algo]
  short = pin.commit[:7]
  path = os.path.abspath(path)
  if not os.path.isfile(os.path.join(path, pin.marker)):
    raise SystemExit(f"--reference={path} has no {pin.marker}: --algo={algo} needs a checkout of "
                     f"{pin.name} at {short}: {_get(pin)}")
  top = _git(path, "rev-parse", "--show-toplevel")
  if top is not None and os.path.realpath(top) == os.path.realpath(path):
    head = _git(path, "rev-parse", "HEAD")
    if head != pin.commit:
      raise SystemExit(f"--reference={path} is {pin.name} at {(head or 'no commit')[:7]}; the "
                       f"harness is pinned to {short}: git -C {path} checkout {short}")
    changed = _git(path, "status", "--porcelain", "--", *pin.folders)
    if changed:
      raise SystemExit(f"--reference={path} is {pin.name} at {short} with local changes "
                       f"({changed.splitlines()[0].strip()}, ...): git -C {path} stash, or "
                       f"{_get(pin)}")
    return head
  if digest(path, pin) != pin.sha256:
    raise SystemExit(f"--reference={path} is no git checkout and its files differ from {pin.name} "
                     f"at {short}: {_get(pin)}")
  return pin.commit


def load(algo: str, path: str) -> Tuple[types.SimpleNamespace, List[str]]:
  """(their modules, [one line per stub]) imported from the checked `path`.

  Stubs: gym, an empty module with the three names their imported files touch at import time
  (gym.spaces.Space, gym.Env and gym.envs.mujoco.mujoco_env.MujocoEnv in annotations, the last
  in offlinerlkit/dynamics/mujoco_oracle_dynamics.py); torch.utils.tensorboard where tensorboard is
  missing (OfflineRL-Kit's logger imports it); none of it runs in an update. d4rl is imported
  only by their train scripts, which the harness does not import.
  """
  notes = []
  if "gym" not in sys.modules:
    gym = types.ModuleType("gym")
    gym.spaces = types.SimpleNamespace(Space=object)
    gym.Env = object
    gym.envs = types.ModuleType("gym.envs")
    gym.envs.mujoco = types.ModuleType("gym.envs.mujoco")
    gym.envs.mujoco.mujoco_env = types.ModuleType("gym.envs.mujoco.mujoco_env")
    gym.envs.mujoco.mujoco_env.MujocoEnv = object
    for name, module in (("gym", gym), ("gym.envs", gym.envs), ("gym.envs.mujoco", gym.envs.mujoco),
                         ("gym.envs.mujoco.mujoco_env", gym.envs.mujoco.mujoco_env)):
      sys.modules[name] = module
    notes.append("gym: an empty module (gym.spaces.Space, gym.Env: annotations; "
                 "gym.envs.mujoco.mujoco_env.MujocoEnv: an annotation in a dynamics file the "
                 "update never runs)")
  if PINNED[algo] is KIT and "torch.utils.tensorboard" not in sys.modules:
    try:
      import tensorboard  # noqa: F401,E402  (optional: only their Logger would use it)
    except ImportError:
      board = types.ModuleType("torch.utils.tensorboard")
      board.SummaryWriter = object
      sys.modules["torch.utils.tensorboard"] = board
      notes.append("torch.utils.tensorboard: a module with SummaryWriter = object (tensorboard is "
                   "not installed; offlinerlkit/utils/logger.py imports it for their Logger, "
                   "which no update uses)")
  sys.path.insert(0, os.path.abspath(path))
  # Their code needs torch (benchmarks/fidelity/requirements.txt), not a product requirement:
  # imported here, when a comparison runs, so that check() works without it.
  if PINNED[algo] is MOMBO:
    import dynamics  # noqa: E402  (adinlab/MOMBO dynamics/)
    import models.actor_critic  # noqa: E402
    import models.dist  # noqa: E402
    import models.dynamics_model  # noqa: E402
    import models.nets  # noqa: E402
    import policies  # noqa: E402
    import utils.scaler  # noqa: E402
    import utils.termination_fns  # noqa: E402
    mods = types.SimpleNamespace(policies=policies, dynamics=dynamics, models=models, utils=utils)
  else:
    import offlinerlkit.dynamics  # noqa: E402
    import offlinerlkit.modules  # noqa: E402
    import offlinerlkit.nets  # noqa: E402
    import offlinerlkit.policy  # noqa: E402
    import offlinerlkit.utils.scaler  # noqa: E402
    import offlinerlkit.utils.termination_fns  # noqa: E402
    mods = types.SimpleNamespace(kit=offlinerlkit)
  return mods, notes
