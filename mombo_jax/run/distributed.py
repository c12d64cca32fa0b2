"""Several processes (hosts) training one program, with JAX's own distributed runtime.

Every process runs the same host program; `jax.distributed.initialize` joins them, and the cell
axis of the train state is sharded over the devices of ALL processes (placement.cell_mesh), each
process computing the cells on its own devices. Cells never communicate, so the compiled epoch has
no cross-process traffic; what crosses processes is gathered at the host boundaries only:

- `to_host(tree)`: the full (all cells) numpy values of globally sharded arrays, on every process
  (metrics once per epoch, actor parameters for evaluation);
- `agree(flag)`: one stop decision for all (a signal may reach only some processes);
- process 0 (`is_main`) evaluates, logs and writes the outputs; checkpoints are written through
  Orbax's own multi-process protocol, not gathered: every process calls save with the global
  arrays (placement.take_cells) and writes the shards on its own devices; the per-shard CRC32s are
  shared in one small allgather (checkpoint.py).

Joining is bounded (`initialize`): each process says what it waits for, gives up after a timeout
with one line naming the address and the processes expected, and honours SIGINT / SIGTERM while
waiting; once joined, SIGTERM is the run's again (JAX's preemption notifier takes it over).

With one process every function here is the plain single-host behaviour.
"""
from __future__ import annotations

import errno
import math
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Optional

from mombo_jax.errors import InvalidArgument

# initialize's parameters that say how to join (errors name them; the CLI names its flags)
_JOIN_PARAMS = ("coordinator_address", "num_processes", "process_id", "auto")
EXIT_INIT_TIMEOUT = 4   # the other processes did not all connect within the init timeout
# JAX's own connect deadline is ours plus this: it aborts the process (C++ stack), ours reports.
_JAX_DEADLINE_MARGIN = 60


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, auto: bool = False,
               timeout: float = 300.0) -> bool:
  """Joins the processes of a multi-process run; returns whether it did.

  Either all three of coordinator_address ('host:port' of process 0), num_processes and process_id,
  or auto=True (the cluster's own environment: SLURM, Open MPI, TPU pods, as JAX detects them), or
  nothing (a single process). Must run before anything else touches JAX's devices. Flag mistakes
  (and a coordinator port already taken on process 0) raise ValueError before any waiting.

  Waiting for the others is announced on stdout ("waiting for N processes at ADDR (process i)
  ...") and bounded: when they have not all connected within `timeout` seconds, the process writes
  one `error:` line to stderr (the address, the processes expected, what to check) and exits
  EXIT_INIT_TIMEOUT; SIGINT / SIGTERM while waiting end it at once with one line, exit 130 / 143.
  Those two exits are os._exit, by design: JAX's connect blocks in C++ (deaf to Python signal
  handlers) and, at its own deadline, aborts the process with a C++ stack trace, so it runs in a
  daemon thread under a later deadline than ours, and the process ends without the interpreter's
  teardown (which would stop the half-started coordinator service and log its complaints).
  """
  given = [coordinator_address is not None, num_processes is not None, process_id is not None]
  if not any(given) and not auto:
    return False
  if any(given) and not all(given):
    raise InvalidArgument("`coordinator_address`, `num_processes` and `process_id` go together: "
                          "pass all three (or auto=True alone, to read them from the cluster).",
                          params=_JOIN_PARAMS)
  if not (timeout > 0 and math.isfinite(timeout)):
    raise InvalidArgument(f"timeout={timeout:g} must be > 0 (seconds to wait for the other "
                          "processes).", params=("timeout",))
  local_devices = None
  if all(given):
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise InvalidArgument(f"process_id={process_id} must be in [0, num_processes="
                            f"{num_processes}).", params=("process_id", "num_processes"))
    _port(coordinator_address)
  else:
    coordinator_address, num_processes, process_id, local_devices = _detect(timeout)
  # JAX only when called: experiments.run imports this module before its flags
  import jax
  # CPU devices of different processes talk through gloo (the default CPU client has no
  # cross-process collectives); GPUs and TPUs use their own and ignore this setting.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if coordinator_address is None:             # the cluster's environment, undetected by us
    waiting = "waiting for the cluster's processes (--distributed) ..."
    kwargs = {}
  else:
    if process_id == 0 and "JAX_COORDINATOR_BIND_ADDRESS" not in os.environ:
      _check_port_free(coordinator_address)
    waiting = (f"waiting for {num_processes} processes at {coordinator_address} (process "
               f"{process_id}) ...")
    kwargs = dict(coordinator_address=coordinator_address, num_processes=int(num_processes),
                  process_id=int(process_id), local_device_ids=local_devices)
  _wait_for(_Join(kwargs, timeout), waiting, timeout, coordinator_address, num_processes,
            process_id)
  return True


class _Join:
  """jax.distributed.initialize with `kwargs`, run in a daemon thread by _wait_for: `done` is set
  once it returned, `failure` holds what it raised (a missing cluster as one line)."""

  def __init__(self, kwargs: dict, timeout: float):
    self.kwargs, self.timeout = kwargs, timeout
    self.done = threading.Event()
    self.failure: Optional[BaseException] = None

  def run(self):
    import jax  # lazy: experiments.run imports this module before its flags
    try:
      try:
        jax.distributed.initialize(
            **self.kwargs,
            initialization_timeout=int(math.ceil(self.timeout)) + _JAX_DEADLINE_MARGIN)
      except (ValueError, RuntimeError) as e:
        if self.kwargs:
          raise
        raise _no_cluster(e) from None
    except BaseException as e:                 # noqa: BLE001 - handed to the main thread
      self.failure = e
    self.done.set()


def _port(address: str) -> int:
  """The port of 'host:port' (ValueError naming the flag when there is none)."""
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise InvalidArgument(f"coordinator_address={address} must be host:port (e.g. host0:1234), "
                          "the same on every process.", params=("coordinator_address",))
  return int(port)


def _detect(timeout: float):
  """(address, count, id, local device ids) of the cluster's environment, as
  jax.distributed.initialize() would find them; ValueError when there is none. All None when
  this JAX's detection is not reachable (then JAX detects inside initialize)."""
  try:
    from jax._src import clusters  # private: JAX's own detection, to name the wait
    found = clusters.ClusterEnv.auto_detect_unset_distributed_params(
        os.environ.get("JAX_COORDINATOR_ADDRESS"), None, None, None, None, int(timeout))
  except (ImportError, AttributeError, TypeError):
    return None, None, None, None
  except (ValueError, RuntimeError) as e:
    raise _no_cluster(e) from None
  if None in found[:3]:
    raise _no_cluster("no SLURM, Open MPI or TPU environment")
  return found


def _no_cluster(why) -> ValueError:
  return InvalidArgument(f"auto=True found no cluster to join ({why}); outside SLURM, Open MPI "
                         "or a TPU pod pass `coordinator_address`, `num_processes` and "
                         "`process_id`.", params=_JOIN_PARAMS)


def _check_port_free(address: str):
  """Process 0 serves the coordinator on the address's port (all interfaces, as JAX binds it); a
  port already taken would crash JAX's service (a segmentation fault), so it is refused here."""
  port = _port(address)
  for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "")):
    try:
      sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
      continue                                 # no IPv6 on this host: try IPv4
    with sock:
      sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
      try:
        sock.bind((host, port))
        return
      except OSError as e:
        if e.errno == errno.EADDRINUSE:
          raise InvalidArgument(f"coordinator_address={address}: port {port} is already in use "
                                "on this host, where process 0 serves the coordinator; pass a "
                                "free port (the same on every process).",
                                params=("coordinator_address",)) from None
        if e.errno in (errno.EACCES,):
          raise InvalidArgument(f"coordinator_address={address}: port {port} cannot be opened "
                                f"here ({e.strerror}); pass a port above 1023.",
                                params=("coordinator_address",)) from None
  # Neither family could bind for another reason: let JAX try (and report) itself.


def _wait_for(join: _Join, waiting, timeout, address, num_processes, process_id):
  """Prints `waiting` and runs join.run() (jax.distributed.initialize) in a daemon thread; returns
  when it did, re-raises what it raised, and ends the process (one line, os._exit) on timeout or
  SIGINT / SIGTERM (the handlers are in place before `waiting` is out)."""
  received = []
  handlers = {sig: signal.signal(sig, lambda signum, frame: received.append(signum))
              for sig in (signal.SIGINT, signal.SIGTERM)}
  print(waiting, flush=True)
  try:
    threading.Thread(target=join.run, name="jax.distributed.initialize", daemon=True).start()
    deadline = time.monotonic() + timeout
    # Short waits: Python runs signal handlers on the main thread between them.
    while not join.done.wait(0.1):
      if received:
        name = signal.Signals(received[0]).name
        _end(f"{name} received while waiting for the other processes"
             f"{_where(address, num_processes, process_id)}: stopped before any work.",
             128 + received[0])
      if time.monotonic() > deadline:
        _end(_timeout_line(timeout, address, num_processes, process_id), EXIT_INIT_TIMEOUT)
  finally:
    # Also takes SIGTERM back from JAX's preemption notifier, which installs its own handler when
    # the processes join (a cluster's SIGTERM would never reach the run's stop flag).
    for sig, handler in handlers.items():
      signal.signal(sig, handler)
  if join.failure is not None:
    raise join.failure
  if received:           # came as the processes joined: the run's own handler takes it
    signal.raise_signal(received[0])


def _where(address, num_processes, process_id) -> str:
  if address is None:
    return ""
  return f" ({num_processes} at {address}, this is process {process_id})"


def _ids(ids) -> str:
  ids = list(ids)
  return ", ".join(map(str, ids)) if len(ids) <= 3 else f"{ids[0]}-{ids[-1]}"


def _timeout_line(timeout, address, num_processes, process_id) -> str:
  waited = f"waited {timeout:g} s"
  if address is None:
    return (f"error: {waited} for the cluster's processes (--distributed) to connect: check that "
            "every process of the job started, or raise --init_timeout.")
  others = [i for i in range(num_processes) if i != process_id]
  same = "the same --coordinator_address and --num_processes and its own --process_id"
  if process_id == 0:
    return (f"error: process 0 {waited} at {address} for process(es) {_ids(others)} "
            f"(--num_processes={num_processes}); not all connected. Start each with {same}, check "
            f"that they reach {address} (a name of this host, not localhost across hosts; no "
            "firewall on the port), or raise --init_timeout.")
  if not _answers(address):
    return (f"error: process {process_id} {waited} for the coordinator at {address} (process 0 "
            f"of --num_processes={num_processes}) and nothing answers there. Start process 0 on "
            f"that host with {same}, check the host name, port and firewall, or raise "
            "--init_timeout.")
  return (f"error: process {process_id} {waited} at {address}: the coordinator answers, but not "
          f"all of process(es) {_ids(range(num_processes))} connected. Start each with {same}, or "
          "raise --init_timeout.")


def _answers(address: str) -> bool:
  """Whether something accepts connections at 'host:port' (within a second)."""
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
      return True
  except OSError:
    return False


def _end(line: str, code: int):
  """Writes one line to stderr and ends the process now (see initialize: why not sys.exit)."""
  sys.stdout.flush()
  print(line, file=sys.stderr, flush=True)
  os._exit(code)


def process_count() -> int:
  import jax  # lazy: experiments.run imports this module
  return jax.process_count()


def is_multiprocess() -> bool:
  return process_count() > 1


def is_main() -> bool:
  """Process 0: the one that evaluates, logs and writes a run's outputs."""
  import jax  # lazy: experiments.run imports this module
  return jax.process_index() == 0


def to_host(tree: Any) -> Any:
  """Numpy copies of every leaf with all its cells, on every process (a collective: all
  processes must call it together)."""
  import jax  # lazy: experiments.run imports this module
  if not is_multiprocess():
    return jax.device_get(tree)
  from jax.experimental import multihost_utils  # lazy, as above
  return multihost_utils.process_allgather(tree, tiled=True)


def agree(flag: bool) -> bool:
  """True on every process when it is True on any (a collective: all processes call it)."""
  if not is_multiprocess():
    return bool(flag)
  # numpy and JAX only here: experiments.run imports this module before its flags
  import numpy as np
  from jax.experimental import multihost_utils
  return bool(np.any(multihost_utils.process_allgather(np.asarray([bool(flag)]))))
