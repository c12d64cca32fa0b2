"""One writer per folder: an exclusive OS lock (flock) on a lock file, taken before any work and
held for the launch. The OS releases it when the process dies (kill -9 leaves nothing stale: the
lock file may stay, but nobody holds it). A second launch is refused at once, naming the holder.

Used through workdir.Workdir.lock (a run's folder) and dynamics_store.get_dynamics (a dynamics
ensemble
while it is trained or read). flock works on local filesystems; on some network filesystems it
is a no-op or fails: `check_locks_work` (docs/reliability.md) tells which.
"""
from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket
import sys
from typing import Dict, Optional

from mombo_jax.errors import UserError

# Locks this process holds, by lock file: taking one again (a --betas grid's groups share one
# dynamics ensemble) only counts, as flock would refuse a second open file of the same process.
_HELD: Dict[str, "FolderLock"] = {}


class LockedError(UserError):
  """The folder is held by another process."""


def _holder_text(path: str) -> str:
  try:
    with open(path) as f:
      info = json.load(f)
  except (OSError, ValueError):
    return "another process (it has not written its name yet)"
  return (f"PID {info.get('pid')} on host {info.get('host')} since {info.get('started')}"
          + (f" ({info['command']})" if info.get("command") else ""))


class FolderLock:
  """Exclusive (or shared) lock on <folder>/<name>.

  acquire() creates the folder when missing (remembered: release(cleanup=True) removes it again
  when it then holds nothing but the lock file, so a refused launch leaves no empty folder).
  shared=True: several readers may hold it at once, a writer none (and the reverse).
  what / fix: the words of the refusal ("--workdir", "pass another --workdir").
  """

  def __init__(self, folder: str, name: str = ".lock", *, shared: bool = False,
               what: str = "folder", fix: str = "wait for it to finish or stop it"):
    self.folder = os.path.abspath(folder)
    self.path = os.path.join(self.folder, name)
    self.shared, self.what, self.fix = shared, what, fix
    self._fd: Optional[int] = None
    self._count = 0
    self._created: Optional[str] = None
    self._owner: Optional["FolderLock"] = None    # the lock object of this process holding it

  def acquire(self) -> "FolderLock":
    held = _HELD.get(self.path)
    if held is not None:
      if held.shared != self.shared:
        raise UserError(f"{self.path} is already locked by this process in another mode.")
      held._count += 1
      self._owner = held
      return self
    if not os.path.isdir(self.folder):
      top = self.folder               # the topmost folder this creates (removed on cleanup)
      while not os.path.exists(os.path.dirname(top)):
        top = os.path.dirname(top)
      try:
        os.makedirs(self.folder)
        self._created = top
      except FileExistsError:
        pass
      except OSError as e:
        raise UserError(f"{self.folder} cannot be created ({e.strerror or e}); pass a writable "
                        f"{self.what}.") from None
    try:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
      raise UserError(f"Cannot open the lock file {self.path} ({e.strerror or e}); pass a "
                      f"writable {self.what}.") from None
    try:
      fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise LockedError(f"{self.folder} is in use by another launch: "
                          f"{_holder_text(self.path)}. One process writes a {self.what} at a "
                          f"time: {self.fix}.") from None
      raise UserError(f"Cannot lock {self.path} ({e.strerror or e}): this filesystem may not "
                      "support locks (see docs/reliability.md).") from None
    if not self.shared:       # readers share the file: only a writer names itself in it
      info = dict(pid=os.getpid(), host=socket.gethostname(),
                  started=datetime.datetime.now(datetime.timezone.utc).strftime(
                      "%Y-%m-%d %H:%M:%S UTC"),
                  command=" ".join([os.path.basename(sys.executable)] + sys.argv))
      try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
      except OSError:
        pass                  # the lock holds without the name (e.g. disk full)
    self._fd, self._count = fd, 1
    _HELD[self.path] = self
    return self

  def release(self, cleanup: bool = False):
    """Releases one acquire; the last one unlocks. cleanup: remove the folder when this lock
    created it and it holds nothing else (a refused launch)."""
    if self._owner is not None:
      owner, self._owner = self._owner, None
      owner.release(cleanup)
      return
    if self._fd is None:
      return
    self._count -= 1
    if self._count > 0:
      return
    _HELD.pop(self.path, None)
    remove = cleanup and self._created and os.listdir(self.folder) == [os.path.basename(self.path)]
    if remove:
      try:
        os.remove(self.path)
      except OSError:
        remove = False
    fcntl.flock(self._fd, fcntl.LOCK_UN)
    os.close(self._fd)
    self._fd = None
    if remove:
      folder = self.folder
      while True:                     # the folder, then the parents it created while empty
        try:
          os.rmdir(folder)
        except OSError:
          break
        if folder == self._created:
          break
        folder = os.path.dirname(folder)

  def __enter__(self):
    return self.acquire()

  def __exit__(self, exc_type, exc, tb):
    self.release(cleanup=exc_type is not None)


def check_locks_work(folder: str) -> bool:
  """True when two open files of `folder`'s filesystem exclude each other under flock (local
  filesystems do; some network filesystems silently do not)."""
  path = os.path.join(folder, ".lock-probe")
  a = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  b = os.open(path, os.O_RDWR)
  try:
    fcntl.flock(a, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
      fcntl.flock(b, fcntl.LOCK_EX | fcntl.LOCK_NB)
      return False
    except OSError:
      return True
  finally:
    os.close(a)
    os.close(b)
    os.remove(path)
