"""Stopping within seconds: the stop request (StopFlag, set by SIGINT / SIGTERM, and passed on to a
child process by run_child), how long device calls of a long loop may run (Chunks), and the stop
check between them (check). Process signals, not environments: every layer from env/ up polls it.
The host state an exact resume of a host loop needs (numpy Generators, a MuJoCo env mid-episode):
mombo_jax/env/host_state.py.

A stop request (StopFlag: SIGINT / SIGTERM) is a flag the loops poll between device calls
and env steps; a compiled call cannot be interrupted, so the loops that would otherwise hand the
device minutes of work at once (an epoch of dynamics training, the collector's chunk of gradient
steps) run it as a traced-bound fori_loop in calls of about POLL_SECONDS each. Where the calls
split the work changes no bit of the result (the same loop body; the carry passes on unchanged).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Callable, Optional

from mombo_jax.errors import Interrupted

# Longest a device call of a long loop should run, by the last call's pace: a stop request waits
# about this long (plus the checkpoint), not for an epoch (minutes on a 1M-transition dataset on a
# loaded CPU) or a chunk of 1000 SAC updates (~10 s there).
POLL_SECONDS = 1.0


class StopFlag:
  """Callable flag set by SIGINT / SIGTERM: the run stops at the next safe point (within seconds:
  the loops poll it between device calls of about signals.POLL_SECONDS and between env steps),
  checkpoints and exits; a second signal aborts at once. SIGUSR1 is a stop request passed on by a
  parent process (run_child): it sets the flag like the first signal and never aborts, so
  that a Ctrl-C that reached both processes is not taken twice."""

  def __init__(self):
    self.signum = None
    self._from_parent = False         # the flag was set by the parent's stop request (SIGUSR1)

  def __call__(self) -> bool:
    return self.signum is not None

  def install(self):
    for sig in (signal.SIGINT, signal.SIGTERM):
      signal.signal(sig, self._handle)
    if hasattr(signal, "SIGUSR1"):
      signal.signal(signal.SIGUSR1, self._passed_on)

  def _handle(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if self.signum is not None and not self._from_parent:
      print(f"\n{name} again: aborting at once; the last checkpoint stays usable.",
            file=sys.stderr, flush=True)
      os._exit(128 + signum)
    if self.signum is None:
      print(f"\n{name} received: stopping within seconds, after saving a checkpoint "
            f"(send it again to abort at once).", file=sys.stderr, flush=True)
    self.signum, self._from_parent = signum, False

  def _passed_on(self, signum, frame):
    del signum, frame
    if self.signum is None:
      self.signum, self._from_parent = signal.SIGTERM, True
      print("\nStop requested by the parent launch: stopping within seconds, after saving a "
            "checkpoint.", file=sys.stderr, flush=True)


def run_child(cmd, should_stop=None) -> int:
  """Runs cmd (argv list) in a child process to its end; returns its exit status. Once
  should_stop fires (this launch got SIGINT / SIGTERM), passes the stop on to the child once, as
  SIGUSR1 (StopFlag: a stop request that never aborts), so that a SIGTERM sent to this process
  alone stops the child within seconds too, and a Ctrl-C that reached both counts once."""
  proc = subprocess.Popen(cmd)
  passed = False
  while True:
    try:
      return proc.wait(timeout=0.2)
    except subprocess.TimeoutExpired:
      pass
    if not passed and should_stop is not None and should_stop():
      proc.send_signal(getattr(signal, "SIGUSR1", signal.SIGTERM))
      passed = True



def check(should_stop: Optional[Callable[[], bool]], where: str):
  """Raises errors.Interrupted(should_stop's signum, where) when should_stop (None: never) fires."""
  if should_stop is not None and should_stop():
    raise Interrupted(getattr(should_stop, "signum", None), where)


class Chunks:
  """Lengths of the device calls of a loop of `total` iterations: about seconds (POLL_SECONDS) by
  the last call's pace, one iteration while the pace is unknown (the first call compiles).
  first_pace() tells the caller, once, the first pace without compilation (after the second
  call)."""

  def __init__(self, total: int, seconds: Optional[float] = None):
    self.total = int(total)
    self.seconds = POLL_SECONDS if seconds is None else seconds
    self.pace = None                  # seconds per iteration of the last call
    self.calls = 0
    self._told = False                # first_pace has answered

  def next(self, left: int) -> int:
    """Iterations of the next call (1 <= n <= left)."""
    if self.pace is None:
      return 1
    return max(1, min(int(left), int(self.seconds / max(self.pace, 1e-9))))

  def run(self, fn: Callable, start: int, n: int):
    """fn(start, start + n), blocked until its result is ready and timed; returns the result."""
    # JAX only when timed: experiments.import_d4rl imports signals without JAX
    import jax
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(start, start + n))
    self.pace, self.calls = (time.perf_counter() - t0) / n, self.calls + 1
    return out

  def first_pace(self) -> Optional[float]:
    """Seconds per iteration right after the second call (the first pace without compilation),
    once: None at every other time."""
    if self.calls == 2 and not self._told:
      self._told = True
      return self.pace
    return None
