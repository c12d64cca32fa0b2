"""The environment variables that choose how the training programs are compiled, read here, above
the core, which takes their values as arguments (core/cell_layout.py, core/xla_options.py):

  MOMBO_JAX_CELLS     'vmap' | 'loop': how one program runs over its cells; unset: the backend's
                      default (loop on CPU, vmap elsewhere: cell_layout.layout(None))
  MOMBO_JAX_CPU_DOTS  'eigen' (the default) | 'xla': which dots XLA:CPU compiles
                      (xla_options.options)

Read when a program is built (program.compile_chunk, the dynamics training), so set them before
the first run in a process; preflight.validate refuses a bad value before any work.
"""
import os
from typing import Optional

from mombo_jax.errors import InvalidArgument

CELLS_ENV = "MOMBO_JAX_CELLS"
DOTS_ENV = "MOMBO_JAX_CPU_DOTS"
LAYOUTS = ("vmap", "loop")
CPU_DOTS = ("eigen", "xla")


def cells() -> Optional[str]:
  """'vmap' or 'loop' from $MOMBO_JAX_CELLS; None when unset (the backend's default)."""
  value = os.environ.get(CELLS_ENV, "").strip().lower()
  if not value:
    return None
  if value not in LAYOUTS:
    raise InvalidArgument(f"{CELLS_ENV}={value!r}: use 'vmap' (cells side by side) or 'loop' (one "
                          "after another), or unset it (loop on CPU, vmap elsewhere).")
  return value


def cpu_dots() -> str:
  """'eigen' (this package's default on CPU) or 'xla' (XLA's own default, YNNPACK), from
  $MOMBO_JAX_CPU_DOTS."""
  value = os.environ.get(DOTS_ENV, "eigen").strip().lower()
  if value not in CPU_DOTS:
    raise InvalidArgument(f"{DOTS_ENV}={value!r}: use 'eigen' (the default) or 'xla' (XLA's "
                          "default CPU dots), or unset it.")
  return value
