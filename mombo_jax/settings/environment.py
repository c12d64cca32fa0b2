"""The environment variables that choose how the training programs are compiled, read here, above
the core, which takes their values as arguments (core/cell_layout.py, core/xla_options.py):

  MOMBO_JAX_CELLS     'vmap' | 'loop': how one program runs over its cells; unset: the backend's
                      default (loop on CPU, vmap elsewhere: cell_layout.layout(None))
  MOMBO_JAX_CPU_DOTS  'eigen' (the default) | 'xla': which dots XLA:CPU compiles
                      (xla_options.options; a compiler option of the CPU only, no-op elsewhere)
  MOMBO_JAX_PREDICT_ROWS   'none' | a positive int: the rollout's dynamics predictions and actor
                      in pieces of that many rows, or in one piece; unset: the backend's default
                      (1000 on CPU, none elsewhere: core/rewrites.py)
  MOMBO_JAX_CRITIC_MATMUL  'rewrite' | 'jax': the layers' gradients written out for Eigen's dots
                      or JAX's own transpose rule (critics.matmul); unset: the backend's default
                      ('rewrite' on CPU, 'jax' elsewhere: core/rewrites.py)

Read when a program is built (program.compile_chunk, the dynamics training), so set them before
the first run in a process; preflight.validate refuses a bad value before any work.
"""
import os
from typing import Optional, Union

from mombo_jax.errors import InvalidArgument

CELLS_ENV = "MOMBO_JAX_CELLS"
DOTS_ENV = "MOMBO_JAX_CPU_DOTS"
PREDICT_ROWS_ENV = "MOMBO_JAX_PREDICT_ROWS"
CRITIC_MATMUL_ENV = "MOMBO_JAX_CRITIC_MATMUL"
LAYOUTS = ("vmap", "loop")
CPU_DOTS = ("eigen", "xla")
CRITIC_MATMULS = ("rewrite", "jax")


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


def predict_rows() -> Union[None, int, str]:
  """Rows per piece of the rollout's predictions from $MOMBO_JAX_PREDICT_ROWS: a positive int,
  'none' (one piece), or None when unset (the backend's default: rewrites.choose)."""
  value = os.environ.get(PREDICT_ROWS_ENV, "").strip().lower()
  if not value:
    return None
  if value == "none":
    return value
  if value.isdigit() and int(value) > 0:
    return int(value)
  raise InvalidArgument(f"{PREDICT_ROWS_ENV}={value!r}: use a positive number of rows per piece "
                        "or 'none' (one piece), or unset it (1000 on CPU, none elsewhere).")


def critic_matmul() -> Optional[str]:
  """'rewrite' or 'jax' from $MOMBO_JAX_CRITIC_MATMUL; None when unset (the backend's default:
  rewrites.choose)."""
  value = os.environ.get(CRITIC_MATMUL_ENV, "").strip().lower()
  if not value:
    return None
  if value not in CRITIC_MATMULS:
    raise InvalidArgument(f"{CRITIC_MATMUL_ENV}={value!r}: use 'rewrite' (gradients written out "
                          "for Eigen's dots) or 'jax' (JAX's own transpose rule), or unset it "
                          "(rewrite on CPU, jax elsewhere).")
  return value
