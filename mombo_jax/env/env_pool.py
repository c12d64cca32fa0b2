"""The N envs of an evaluation, stepped by W worker processes (W = 1: in this process, no worker).

    pool = EnvPool(envs.make_env("hopper"), num_envs=480, workers=16)
    obs = pool.reset(seeds)                                   # seeds [N] -> obs [N, obs_dim]
    obs, reward, terminated, truncated = pool.step(actions, active)   # actions [N, A], active [N]
    pool.close()

Env i lives in worker i % W (interleaved, so that the episodes of one cell, which tend to end
together, are spread over the workers). Every env is reset with its own seed, which sets its whole
state, so the same seeds give the same trajectories for any W. Only active envs are stepped: an
evaluation stops stepping an env once its episode ended (the vector env this replaces auto-reset
it and stepped on).

Workers are plain `python` subprocesses running this file alone (runpy), not multiprocessing
children: fork is unsafe under JAX's threads, and multiprocessing's spawn re-imports the launching
program's __main__ (experiments.run imports jax) and unpickles its target from `mombo_jax`, whose
package import is jax's. A worker imports only the standard library, numpy and gymnasium. Each
runs in its own session (a terminal's Ctrl-C reaches the parent only) and ignores SIGINT; it exits
when told to (close) or when its socket to the parent closes (the parent exited or was killed), so
none outlives its parent.

Transport: the step's arrays (actions, active flags, reset seeds, observations, rewards, flags) live
in one shared memory block (an anonymous file both sides map); per step the parent writes the
actions, sends each worker one byte on its socket and waits for one byte back: ~20-40 us of the
parent's time per worker and step on the 2-core host of benchmarks/bench_eval.txt. Pickled arrays
over the same sockets (measured first) cost it ~190 us per worker and step: with 16 workers ~3 ms
a step, 3 s of a 1000-step evaluation.

This file's top level imports nothing from mombo_jax (a worker runs it).
"""
from __future__ import annotations

import mmap
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
import weakref
from multiprocessing.connection import Connection
from typing import Dict, List, Sequence, Tuple

import numpy as np

WORKER_RUN_NAME = "__mombo_jax_env_worker__"
# Runs this file in a fresh interpreter; argv: this file's path, the socket's fd, the shared
# block's fd.
_BOOT = "import runpy, sys; runpy.run_path(sys.argv[1], run_name=%r)" % WORKER_RUN_NAME
# auto_workers: fewer envs than MIN_ENVS_FOR_WORKERS are stepped in this process (a small
# evaluation, as in tests and tiny runs, does not repay starting workers, ~1 s each); more get one
# worker per ENVS_PER_WORKER envs up to the host's cores. A worker costs the parent ~25-50 us per
# step (its round trip) and saves its envs' steps (~100-400 us each), so even 2 envs a worker pay,
# and idle cores are best used (benchmarks/bench_eval.txt).
MIN_ENVS_FOR_WORKERS = 8
ENVS_PER_WORKER = 2
_CLOSE_TIMEOUT_S = 10.0
# One-byte commands (parent -> worker) and the worker's reply when it went well.
_RESET, _STEP, _PING, _CLOSE, _OK = b"r", b"s", b"p", b"c", b"k"
_DOING = {"init": "building its envs", _RESET: "resetting its envs", _STEP: "stepping its envs",
          _PING: "answering a ping"}


class WorkerError(RuntimeError):
  """An env worker failed (its traceback is in the message) or died (its exit status is)."""


def host_cores() -> int:
  """The cores this process may run on (its CPU affinity, e.g. a scheduler's allocation), else
  os.cpu_count()."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return os.cpu_count() or 1


def auto_workers(num_envs: int, cores: int = None) -> int:
  """Workers for `num_envs` envs (1: no worker process): 1 below MIN_ENVS_FOR_WORKERS envs, else
  one per ENVS_PER_WORKER envs, at most `cores` (default: host_cores())."""
  num_envs = int(num_envs)
  if num_envs < MIN_ENVS_FOR_WORKERS:
    return 1
  return max(1, min(host_cores() if cores is None else int(cores), num_envs // ENVS_PER_WORKER))


def _layout(num_envs, obs_space, action_space):
  """The shared arrays: {name: (offset, shape, dtype str)} and the block's size in bytes."""
  fields = [("obs", (num_envs, *obs_space.shape), obs_space.dtype),
            ("reward", (num_envs,), np.float64), ("seeds", (num_envs,), np.int64),
            ("actions", (num_envs, *action_space.shape), action_space.dtype),
            ("active", (num_envs,), np.bool_), ("terminated", (num_envs,), np.bool_),
            ("truncated", (num_envs,), np.bool_)]
  out, offset = {}, 0
  for name, shape, dtype in fields:
    dtype = np.dtype(dtype)
    out[name] = (offset, tuple(shape), dtype.str)
    offset += -(-int(np.prod(shape)) * dtype.itemsize // 64) * 64      # 64-byte aligned
  return out, max(offset, 1)


def _views(buffer, layout) -> Dict[str, np.ndarray]:
  return {name: np.frombuffer(buffer, np.dtype(dtype), int(np.prod(shape)), offset).reshape(shape)
          for name, (offset, shape, dtype) in layout.items()}


class _Envs:
  """Some envs of one spec stepped in turn, reading and writing `arrays` (each [n, ...]: rows of
  the shared block, or plain arrays when W = 1): a worker's share, or all envs when W = 1."""

  def __init__(self, envs: list, arrays: Dict[str, np.ndarray]):
    self.envs, self.a = envs, arrays

  def reset(self):
    a = self.a
    for i, env in enumerate(self.envs):
      a["obs"][i], _ = env.reset(seed=int(a["seeds"][i]))

  def step(self):
    """Steps the active envs with their actions; the others are left as they are (the parent
    zeroed their reward and flags)."""
    a = self.a
    obs, reward, terminated, truncated, actions = (a["obs"], a["reward"], a["terminated"],
                                                   a["truncated"], a["actions"])
    for i in np.flatnonzero(a["active"]):
      obs[i], reward[i], terminated[i], truncated[i], _ = self.envs[i].step(actions[i])

  def close(self):
    for env in self.envs:
      env.close()
    self.envs = []


class EnvPool:
  """`num_envs` copies of one gymnasium env stepped by `workers` processes (module docstring).

  first: a gymnasium env (the pool owns and closes it); the others are gym.make(first.spec), so
    its spec must rebuild it (true of gym.make'd and Minari-recovered envs).
  num_envs N >= 1; workers W: 1 steps every env in this process; W > 1 starts min(W, N) worker
    processes, once, used by every reset / step until close().
  """

  def __init__(self, first, num_envs: int, workers: int = 1):
    # gymnasium only when a pool is built: env.evaluate imports this module
    import gymnasium as gym
    num_envs, workers = int(num_envs), int(workers)
    if num_envs < 1:
      raise ValueError(f"num_envs must be >= 1, got {num_envs}.")
    if workers < 1:
      raise ValueError(f"workers must be >= 1, got {workers}.")
    self.num_envs, self.workers = num_envs, min(workers, num_envs)
    self.observation_space, self.action_space = first.observation_space, first.action_space
    self.spec = first.spec
    layout, size = _layout(num_envs, self.observation_space, self.action_space)
    self._local, self._procs, self._conns, self._closed = None, [], [], False
    if self.workers == 1:
      self._arrays = _views(bytearray(size), layout)
      self._local = _Envs([first] + [gym.make(self.spec) for _ in range(num_envs - 1)],
                          self._arrays)
      return
    first.close()
    fd = _anonymous_file(size)
    try:
      self._block = mmap.mmap(fd, size)
      self._arrays = _views(self._block, layout)
      # Reaps the workers at close(), when the pool is dropped unclosed, or at interpreter exit
      # (at most once; it sees the workers appended below).
      self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._conns)
      try:
        for _ in range(self.workers):
          proc, conn = _start_worker(fd)
          self._procs.append(proc)
          self._conns.append(conn)
        spec = pickle.dumps(self.spec)
        for w, conn in enumerate(self._conns):     # every worker builds its envs at once
          conn.send_bytes(pickle.dumps(("init", spec, layout, size, w, self.workers)))
        for w in range(self.workers):
          self._recv(w, "init")
      except BaseException:
        self.close()
        raise
    finally:
      os.close(fd)                                 # the mappings keep the block

  def pids(self) -> List[int]:
    """The worker processes' PIDs ([] when W = 1)."""
    return [p.pid for p in self._procs]

  def reset(self, seeds: Sequence[int]) -> np.ndarray:
    """Resets env i with seeds[i]; returns the observations [N, *obs_shape]."""
    seeds = np.asarray(seeds, np.int64).reshape(-1)
    if len(seeds) != self.num_envs:
      raise ValueError(f"reset needs {self.num_envs} seeds (one per env), got {len(seeds)}.")
    self._check_open()
    self._arrays["seeds"][:] = seeds
    self._run(_RESET)
    return self._arrays["obs"].copy()

  def step(self, actions, active=None) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Steps the active envs (active [N] bool; None: all) with actions [N, A] (in the env's bounds
    and dtype, envs.to_env_action). Returns obs [N, *obs_shape], reward [N] float64, terminated
    [N] bool, truncated [N] bool; an inactive env keeps its last observation, reward 0, False,
    False."""
    a = self._arrays
    active = True if active is None else np.asarray(active, bool)
    if np.shape(actions) != a["actions"].shape or np.ndim(active) and active.shape != (
        self.num_envs,):
      raise ValueError(f"step needs actions {list(a['actions'].shape)} and active flags "
                       f"[{self.num_envs}], got {list(np.shape(actions))} and "
                       f"{list(np.shape(active))}.")
    self._check_open()
    a["actions"][:] = actions
    a["active"][:] = active
    a["reward"][:], a["terminated"][:], a["truncated"][:] = 0.0, False, False
    self._run(_STEP)
    return a["obs"].copy(), a["reward"].copy(), a["terminated"].copy(), a["truncated"].copy()

  def ping(self):
    """A round trip to every worker that does no work: the transport's floor per step (for
    benchmarks/bench_eval.py; a no-op when W = 1)."""
    self._check_open()
    if self._local is None:
      self._run(_PING)

  def _run(self, command):
    """Has every env of the pool do `command` on the shared arrays; returns when all are done."""
    if self._local is not None:
      if command == _RESET:
        self._local.reset()
      elif command == _STEP:
        self._local.step()
      return
    try:
      for w, conn in enumerate(self._conns):
        try:
          conn.send_bytes(command)
        except OSError:
          self._recv(w, command)       # a closed socket: the worker died; raises naming it
      for w in range(self.workers):
        self._recv(w, command)
    except BaseException:
      # Interrupted (e.g. Ctrl-C) or failed half way: replies may be pending, so the pool cannot
      # be used again.
      self._broken()
      raise

  def _recv(self, w, command):
    conn, proc = self._conns[w], self._procs[w]
    doing = _DOING.get(command, command)
    try:
      reply = conn.recv_bytes()
    except (EOFError, OSError):
      self._broken()
      status = _exit_status(proc)
      raise WorkerError(f"env worker {w} of {self.workers} (pid {proc.pid}) died while {doing} "
                        f"({status}); the evaluation cannot go on"
                        + (" (SIGKILL: often the out-of-memory killer)." if proc.returncode == -9
                           else ".")) from None
    if reply != _OK:
      self._broken()
      raise WorkerError(f"env worker {w} of {self.workers} (pid {proc.pid}) failed while "
                        f"{doing}:\n{pickle.loads(reply)}")

  def _broken(self):
    """After one worker failed the others may be mid-command: end them all now."""
    for proc in self._procs:
      if proc.poll() is None:
        proc.kill()
    self.close()

  def _check_open(self):
    if self._closed:
      raise WorkerError("This EnvPool is closed (or one of its workers failed); build a new one.")

  def close(self):
    """Ends the workers (waiting for each to exit: no zombie is left) or closes the local envs.
    Safe to call twice."""
    if self._local is not None:
      self._local.close()
      self._local = None
    elif hasattr(self, "_finalizer"):
      self._finalizer()
    self._closed = True

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


# ------------------------------------------------------------------------------------ plumbing

def _anonymous_file(size) -> int:
  """A file descriptor of `size` bytes of memory no path names (memfd; elsewhere an unlinked
  temporary file): the shared block, passed to the workers by descriptor."""
  if hasattr(os, "memfd_create"):
    fd = os.memfd_create("mombo_jax_env_pool")        # close-on-exec: passed by pass_fds only
  else:
    with tempfile.TemporaryFile() as f:
      fd = os.dup(f.fileno())
  os.ftruncate(fd, size)
  return fd


def _start_worker(block_fd):
  """A worker process and the parent's end of its socket."""
  parent, child = socket.socketpair()
  env = dict(os.environ)
  # One thread per worker: W workers already use W cores.
  env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
  try:
    proc = subprocess.Popen([sys.executable, "-c", _BOOT, os.path.abspath(__file__),
                             str(child.fileno()), str(block_fd)],
                            pass_fds=(child.fileno(), block_fd), env=env,
                            stdin=subprocess.DEVNULL, start_new_session=True)
  finally:
    child.close()
  return proc, Connection(parent.detach())


def _exit_status(proc) -> str:
  try:
    code = proc.wait(timeout=2.0)
  except subprocess.TimeoutExpired:
    return "still running, its socket closed"
  if code < 0:
    try:
      return f"killed by signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
      return f"killed by signal {-code}"
  return f"exit status {code}"


def _shutdown(procs, conns, timeout=_CLOSE_TIMEOUT_S):
  """Asks each worker to close, then waits for it (killing one that does not exit in time)."""
  for conn in conns:
    try:
      conn.send_bytes(_CLOSE)
    except (OSError, ValueError):
      pass
  for proc in procs:
    try:
      proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
  for conn in conns:
    conn.close()


def _serve(sock_fd: int, block_fd: int):
  """A worker's loop: builds its envs on its rows of the shared block, then does each command
  until close or EOF."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is the parent's to handle
  conn, envs, block = Connection(sock_fd), None, None
  try:
    while True:
      try:
        message = conn.recv_bytes()
      except (EOFError, OSError):                   # the parent is gone
        return
      if message == _CLOSE:
        return
      try:
        if envs is None:                            # the first message: init
          # gymnasium only with the init message: the worker boots without it
          import gymnasium as gym
          _, spec, layout, size, w, workers = pickle.loads(message)
          block = mmap.mmap(block_fd, size)
          os.close(block_fd)
          rows = {k: v[w::workers] for k, v in _views(block, layout).items()}
          spec = pickle.loads(spec)
          envs = _Envs([gym.make(spec) for _ in range(len(rows["seeds"]))], rows)
        elif message == _RESET:
          envs.reset()
        elif message == _STEP:
          envs.step()
        elif message != _PING:
          raise ValueError(f"unknown command {message!r}")
        reply = _OK
      except Exception:                              # noqa: BLE001 (sent to the parent)
        reply = pickle.dumps(traceback.format_exc())
      try:
        conn.send_bytes(reply)
      except OSError:
        return
  finally:
    if envs is not None:
      envs.close()
    conn.close()


if __name__ == WORKER_RUN_NAME:
  _serve(int(sys.argv[2]), int(sys.argv[3]))
