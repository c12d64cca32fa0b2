"""Files written whole or not at all: every file is written through a temporary file renamed over
the target (`atomic_write`), so a reader never sees half a file and a failed write leaves the
committed one as it was. A write the OS refuses (read-only file system, no space left, a file where
a folder should be) raises `WriteError`: a UserError of one line naming the path and the cause, its
temporary file removed. Used by every writer of the package (a run's outputs, reports, saved
actors, sweep records)."""
import errno
import json
import os
import tempfile
from typing import Callable

from mombo_jax.errors import UserError

# What to do about a refused write, by errno.
_WRITE_FIXES = {
    errno.ENOSPC: "free some space and run again",
    errno.EDQUOT: "free some space (disk quota) and run again",
    errno.EROFS: "pass a folder on a writable file system",
    errno.EACCES: "pass a folder you may write to",
    errno.EPERM: "pass a folder you may write to",
    errno.ENOTDIR: "a part of the path is a file, not a folder; pass another folder",
    errno.EEXIST: "a file stands where a folder should be; pass another folder",
}


class WriteError(UserError):
  """A file or folder the OS refused to write (read-only file system, no space, no permission, a
  file in the way). One line: the path, the OS's cause, the fix. path: what was being written;
  cause: the OS's words (strerror); errno: the OSError's errno."""

  def __init__(self, path: str, error: OSError):
    self.path = str(path)
    self.errno = error.errno
    self.cause = error.strerror or str(error)
    fix = _WRITE_FIXES.get(error.errno)
    super().__init__(f"Cannot write {self.path}: {self.cause}" + (f"; {fix}." if fix else "."))


def write_error(path: str, error: OSError) -> WriteError:
  """The WriteError for `error` (an OSError) raised while writing `path`: for callers that write
  through their own code (os.makedirs, a library's save) and want the same one-line refusal."""
  return WriteError(path, error)


def make_dirs(path: str):
  """os.makedirs(path, exist_ok=True); WriteError instead of an OSError."""
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise WriteError(path, e) from None


def check_writable(folder: str):
  """Creates `folder` if needed and checks that a file can be written in it (a temporary file,
  removed at once); WriteError naming the folder otherwise. For a program's output folder, before
  any work."""
  make_dirs(folder)
  try:
    with tempfile.TemporaryFile(dir=folder):
      pass
  except OSError as e:
    raise WriteError(folder, e) from None


def atomic_write(path: str, write: Callable, binary: bool = False):
  """Writes `path` through `<path>.tmp`: write(f) fills the open temporary file, which is then
  renamed over `path`. On any failure the temporary file is removed and `path` is untouched; an
  OSError (of the open, the write or the rename) becomes a WriteError naming `path`."""
  tmp = path + ".tmp"
  try:
    with open(tmp, "wb" if binary else "w", **({} if binary else {"newline": ""})) as f:
      write(f)
    os.replace(tmp, path)
  except BaseException as e:
    try:
      os.remove(tmp)
    except OSError:
      pass
    if isinstance(e, OSError):
      raise WriteError(path, e) from None
    raise


def write_text(path: str, text: str):
  """Atomically writes `text` (report.md, report.tex, ...)."""
  atomic_write(path, lambda f: f.write(text))


def save_figure(fig, path: str, **kwargs):
  """Atomically saves a matplotlib figure (format from path's extension)."""
  fmt = os.path.splitext(path)[1].lstrip(".") or "png"
  atomic_write(path, lambda f: fig.savefig(f, format=fmt, **kwargs), binary=True)


def write_json(path: str, obj, indent: int = 1):
  """Atomically writes obj as JSON. WriteError when the OS refuses."""
  atomic_write(path, lambda f: json.dump(obj, f, indent=indent))
