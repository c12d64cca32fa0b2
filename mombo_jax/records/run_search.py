"""Finding the runs under folders (for the report and the analyses): a folder holding a run's
files (workdir.RUN_FILES by default) is one run, and is not searched further."""
import os
from typing import List, Sequence, Tuple

from mombo_jax.errors import UserError
from mombo_jax.records.workdir import RUN_FILES, SUMMARY


def find_runs(dirs: Sequence[str], need: Sequence[str] = RUN_FILES) -> Tuple[List[str], List[str]]:
  """(run workdirs, warnings) under `dirs`: a folder holding any of `need` is a run (its
  subfolders are not searched); one missing some of them is skipped with a warning naming what
  is missing. UserError for a DIR that is not a folder."""
  found, warnings = [], []
  for top in dirs:
    if not os.path.isdir(top):
      raise UserError(f"{top} is not a folder; pass folders that hold run workdirs (written by "
                      "experiments.run).")
    for root, subdirs, files in os.walk(top):
      present = [f for f in need if f in files or f in subdirs]
      if not present:
        subdirs.sort()
        continue
      missing = [f for f in need if f not in files and f not in subdirs]
      subdirs[:] = []                 # a run's subfolders (checkpoints, dynamics) are not runs
      if missing:
        why = " (unfinished run?)" if SUMMARY in missing else ""
        warnings.append(f"warning: skipping {root}: missing {', '.join(missing)}{why}")
      else:
        found.append(os.path.normpath(root))
  return sorted(set(found)), warnings
