"""The errors a user can act on, and the stop a signal asked for. The command-line programs print
them as one `error:` line (Interrupted: the resume command) without a traceback; anything else is
a bug and keeps its traceback."""
from __future__ import annotations

from typing import Optional


class UserError(Exception):
  """A problem the user can fix (a flag, a missing file, a run that does not match); printed as one
  `error:` line without a traceback."""


class DatasetNotFoundError(FileNotFoundError):
  """A dataset is neither local nor downloadable. `command` (or None) builds it locally.

  A FileNotFoundError, so that callers catching missing files catch it too."""

  def __init__(self, message: str, dataset_id: str, command: Optional[str] = None):
    super().__init__(message)
    self.dataset_id = dataset_id
    self.command = command


class Interrupted(Exception):
  """SIGINT / SIGTERM stopped the run at a safe point, after checkpointing what it had."""

  def __init__(self, signum: int, where: str):
    super().__init__(where)
    self.signum = signum
    self.where = where


_BOOLEAN_WORDS = ("true", "false", "yes", "no", "0", "1")


def stray_words(argv) -> Optional[str]:
  """The `error:` line for words absl left on a command line (argv[1:]), or for a list flag given
  empty (`--betas=`, which would otherwise mean "not given"), or None when all is well. Every
  option is a --flag, so a word is a mistake, and a silent one: absl reads `--flag false` as
  --flag (True) followed by the word "false", which this names."""
  words = list(argv[1:])
  empty = _empty_lists()
  if empty:
    return (f"error: {', '.join(f'--{n}=' for n in empty)} given empty; pass at least one value "
            "(comma-separated), or leave the flag out for its default.")
  if not words:
    return None
  hint = (" A boolean flag takes its value after '=' (--flag=false): `--flag false` sets it to "
          "True and leaves the word behind."
          if any(w.lower() in _BOOLEAN_WORDS for w in words) else "")
  return (f"error: unexpected argument(s) {' '.join(words)}: every option is a --flag (see "
          f"--help).{hint}")


def _empty_lists():
  """Names of the list flags given on the command line with no value."""
  from absl import flags
  values = flags.FLAGS
  out = []
  for name in sorted(values):
    flag = values[name]
    if flag.present and isinstance(flag.value, list) and not flag.value:
      out.append(name)
  return out
