"""Several processes (hosts) training one program, with JAX's own distributed runtime.

Every process runs the same host program; `jax.distributed.initialize` joins them, and the cell
axis of the train state is sharded over the devices of ALL processes (train.cell_mesh), each
process computing the cells on its own devices. Cells never communicate, so the compiled epoch has
no cross-process traffic; what crosses processes is gathered at the host boundaries only:

- `to_host(tree)`: the full (all cells) numpy values of globally sharded arrays, on every process
  (metrics once per epoch, actor parameters for evaluation, the state at a checkpoint);
- `agree(flag)`: one stop decision for all (a signal may reach only some processes);
- process 0 (`is_main`) evaluates, logs and writes the outputs; checkpoints are written through
  Orbax's own multi-process protocol (every process calls save, the primary process writes).

With one process every function here is the plain single-host behaviour.
"""
from __future__ import annotations

from typing import Any, Optional


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, auto: bool = False) -> bool:
  """Joins the processes of a multi-process run; returns whether it did.

  Either all three of coordinator_address ('host:port' of process 0), num_processes and process_id,
  or auto=True (the cluster's own environment: SLURM, Open MPI, TPU pods, as JAX detects them), or
  nothing (a single process). Must run before anything else touches JAX's devices.
  """
  given = [coordinator_address is not None, num_processes is not None, process_id is not None]
  if not any(given) and not auto:
    return False
  if any(given) and not all(given):
    raise ValueError("--coordinator_address, --num_processes and --process_id go together: pass "
                     "all three (or --distributed alone, to read them from the cluster).")
  if all(given):
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ValueError(f"--process_id={process_id} must be in [0, --num_processes="
                       f"{num_processes}).")
  import jax
  # CPU devices of different processes talk through gloo (the default CPU client has no
  # cross-process collectives); GPUs and TPUs use their own and ignore this setting.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if all(given):
    jax.distributed.initialize(coordinator_address, int(num_processes), int(process_id))
  else:
    try:
      jax.distributed.initialize()
    except (ValueError, RuntimeError) as e:
      raise ValueError(f"--distributed found no cluster to join ({e}); outside SLURM, Open MPI or "
                       "a TPU pod pass --coordinator_address, --num_processes and "
                       "--process_id.") from None
  return True


def process_count() -> int:
  import jax
  return jax.process_count()


def is_multiprocess() -> bool:
  return process_count() > 1


def is_main() -> bool:
  """Process 0: the one that evaluates, logs and writes a run's outputs."""
  import jax
  return jax.process_index() == 0


def to_host(tree: Any) -> Any:
  """Numpy copies of every leaf with all its cells, on every process (a collective: all
  processes must call it together)."""
  import jax
  if not is_multiprocess():
    return jax.device_get(tree)
  from jax.experimental import multihost_utils
  return multihost_utils.process_allgather(tree, tiled=True)


def agree(flag: bool) -> bool:
  """True on every process when it is True on any (a collective: all processes call it)."""
  if not is_multiprocess():
    return bool(flag)
  import numpy as np
  from jax.experimental import multihost_utils
  return bool(np.any(multihost_utils.process_allgather(np.asarray([bool(flag)]))))
