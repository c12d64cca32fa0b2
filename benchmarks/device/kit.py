"""The device record's kit: the one git-ignored folder `benchmarks.device.prepare` fills on the CPU
and a lent device's `run` call carries, and what the record reads from it. Standard library only:
the record reads it before the carried wheels are installed.

  .device_record/              (KIT, at the repository's root; .gitignore names it)
    whl/*.whl                  the wheels the device image lacks, one version of each (WHEELS)
    minari/<minari id>/...     MINARI_DATASETS_PATH of part d: its dataset, built by the collector
    manifest.json              what was built: dataset, its id and size, wheels, commit, when
    build/                     the collector's SAC run and logs (never carried)

The carried paths are CARRY; `prepare` prints them and checks the working tree plus them against
the device's 64 MiB.
"""
from __future__ import annotations

import json
import os
import subprocess
from typing import List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KIT = ".device_record"
CARRY = (f"{KIT}/whl", f"{KIT}/minari", f"{KIT}/manifest.json")
MANIFEST = "manifest.json"
# What travels at most: the working tree plus the carried paths (the device tool's limit).
LIMIT_BYTES = 64 * 2**20

# The packages experiments.run imports that the device image ('cuda', KINDS.md: JAX 0.11, flax,
# optax, chex, orbax, absl, h5py, pandas, matplotlib, typer, packaging, ...) lacks, at the versions
# this project pins (requirements.txt) or that its pins installed beside them. mujoco's own
# dependency mujoco-studio (12.8 MB: the viewer) and its websockets are left out: stepping
# gymnasium's v5 envs imports neither (checked with mujoco 4.0.0 and gymnasium 1.4.0, whose
# imports load mujoco, mujoco_core's modules and glfw only), and the carry has 64 MiB in all.
WHEELS = ("mujoco", "mujoco-core", "glfw", "pyopengl", "gymnasium", "farama-notifications",
          "minari")
# The device image's interpreter (KINDS.md: Python 3.12.3) and its platform tags, for pip download.
PYTHON_VERSION = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")


def kit_path(kit: Optional[str] = None, *parts) -> str:
  """An absolute path inside the kit (default: KIT at the repository's root)."""
  base = kit if kit else os.path.join(ROOT, KIT)
  return os.path.join(os.path.abspath(base), *parts)


def read_manifest(kit: Optional[str] = None) -> Optional[dict]:
  """The kit's manifest.json, or None when there is none."""
  path = kit_path(kit, MANIFEST)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def wheels(kit: Optional[str] = None) -> List[str]:
  """The kit's wheel files (absolute paths, sorted)."""
  folder = kit_path(kit, "whl")
  if not os.path.isdir(folder):
    return []
  return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".whl"))


def folder_bytes(path: str) -> int:
  """Bytes of the files under path (a file: its size; missing: 0)."""
  if os.path.isfile(path):
    return os.path.getsize(path)
  total = 0
  for top, _, files in os.walk(path):
    total += sum(os.path.getsize(os.path.join(top, f)) for f in files
                 if not os.path.islink(os.path.join(top, f)))
  return total


def tree_bytes(root: str = ROOT) -> int:
  """Bytes of what a `run` call sends besides the carried paths: tracked files and untracked ones
  git does not ignore (git ls-files), and a shared/ folder inside the checkout."""
  out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       cwd=root, capture_output=True, check=True).stdout
  names = {n for n in out.decode().split("\0") if n}
  total = sum(os.path.getsize(os.path.join(root, n)) for n in names
              if os.path.isfile(os.path.join(root, n)) and not n.startswith("shared/"))
  return total + folder_bytes(os.path.join(root, "shared"))


def git_commit(root: str = ROOT) -> str:
  """HEAD's commit, with '+dirty' when the tracked files differ from it; 'unknown' without git."""
  try:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                          check=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                           capture_output=True, check=True, text=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "unknown"
  return head + ("+dirty" if dirty else "")


def manifest_and_dataset(kit: Optional[str] = None):
  """(manifest, its dataset's name) of the kit, for a part that trains on it; exits with one
  error line when the kit holds no dataset (prepare has not run)."""
  manifest = read_manifest(kit) or {}
  dataset = manifest.get("dataset")
  if not dataset:
    raise SystemExit(f"error: no dataset in the kit {kit_path(kit)}: run "
                     "`python3 -m benchmarks.device.prepare` first.")
  return manifest, dataset


def part_args(doc: str, extra=None):
  """The flags every part of the record takes (record.run_part passes them): --out (the record's
  folder), --work (scratch shared by the parts), --kit, --soft_s (seconds the part should end
  within; it is killed GRACE_S later), --smoke, --epochs (part d)."""
  import argparse
  parser = argparse.ArgumentParser(description=doc.splitlines()[0])
  parser.add_argument("--out", required=True)
  parser.add_argument("--work", required=True)
  parser.add_argument("--kit", default=None)
  parser.add_argument("--soft_s", type=float, default=600.0)
  parser.add_argument("--smoke", action="store_true")
  parser.add_argument("--epochs", type=int, default=None)
  for name, kw in (extra or {}).items():
    parser.add_argument(name, **kw)
  return parser.parse_args()


def write_rates(work: str, part: str, rates: dict):
  """A part's measured rates, for the record's sizing of the later parts and its record.json."""
  with open(os.path.join(work, f"rates_{part}.json"), "w") as f:
    json.dump(rates, f, indent=1)
