"""The errors a user can act on, and the stop a signal asked for. They speak Python: a message
names the parameters (or config fields) it is about as `name=value`, `name=` or `name` in
backticks, and lists them in `params`, so that a command line (experiments/_cli.py) can name its
flags instead. The command-line programs print them as one `error:` line (Interrupted: the resume
command) without a traceback; anything else is a bug and keeps its traceback."""
from __future__ import annotations

from typing import Optional, Sequence


class UserError(Exception):
  """A problem the user can fix (a parameter, a missing file, a run that does not match); printed
  as one `error:` line without a traceback. params: the Python parameters / config fields the
  message names (as `name=...` or `name` in backticks)."""

  def __init__(self, message: str = "", *, params: Sequence[str] = ()):
    super().__init__(message)
    self.params = tuple(params)


class InvalidArgument(UserError, ValueError):
  """A parameter's value is refused (out of range, of another env, not a number, ...). A
  ValueError too, so that callers catching ValueError catch it as before."""


class InvalidValue(InvalidArgument):
  """A value no call could take, whatever is on disk: out of its range (`seeds` of 0), not one of
  the names it may be (a logger, a dataset). A command line's own mistake: its program exits 2
  (experiments/_cli.py), where an InvalidArgument that depends on the world (a port in use, a
  run's seeds) exits 1."""


class DatasetNotFoundError(UserError, FileNotFoundError):
  """A dataset is neither local nor downloadable. `command` (or None) builds it locally.

  A FileNotFoundError too, so that callers catching missing files catch it."""

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
