"""The errors a user can act on. The command-line programs print them as one `error:` line without
a traceback; anything else is a bug and keeps its traceback."""
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
