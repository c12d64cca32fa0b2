"""The XLA options this package's training programs are compiled with, in one place.

On CPU, XLA (jaxlib 0.10) hands every dot to YNNPACK by default. At this package's shapes (an
ensemble of 3x256 critics, batch 256; a 7-member 4x200 dynamics ensemble) Eigen's dots are
faster: a MOPO training epoch took 0.87x the time with YNNPACK off, measured side by side on a
2-core Xeon (benchmarks/bench_epoch_changes.py and its record). YNNPACK runs each dot on one thread
and relies on running independent dots side by side; Eigen splits every dot over all cores.

`options()` is what `train`'s compiled programs (the epoch and the chunk of epochs, through
`jit` below) pass to `jax.jit(..., compiler_options=...)`:
  - on CPU: {"xla_cpu_experimental_ynn_fusion_type": ""} (no YNNPACK fusion of any kind);
  - on GPU / other backends: None (XLA's defaults; the option concerns the CPU only);
  - cpu_dots='xla' (MOMBO_JAX_CPU_DOTS=xla in the environment, read above the core by
    settings/environment.py and passed down): None everywhere (XLA's default CPU dots), for
    comparisons and for CPUs where YNNPACK wins.
The choice changes how dot products are summed, hence the last bits of every result: runs are
reproducible under one choice, not across the two.

jax.jit accepts compiler options only on a top-level function: a program built with them cannot
be traced inside another jit (trace its `__wrapped__` function instead).

The matmul precision (`at_precision`) is no compiler option but the precision config each float32
dot carries in the traced program (jax.default_matmul_precision, read when the dot is traced): the
run's Config.matmul_precision, pinned by the functions that build a program's body
(train.make_epoch, dynamics_training's compiled pieces), so any jit of them, the package's or a
benchmark's, computes at the run's precision whatever JAX's default on the backend (on a GPU with
tensor cores: TF32, which the PyTorch references do not use).
"""
import functools
from typing import Optional

import jax

CPU_DOTS = ("eigen", "xla")
_CPU_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": ""}


def options(cpu_dots: str = "eigen") -> Optional[dict]:
  """compiler_options for jax.jit of a training program (see the module docstring); cpu_dots:
  'eigen' or 'xla' (settings.environment.cpu_dots())."""
  if cpu_dots not in CPU_DOTS:
    raise ValueError(f"cpu_dots={cpu_dots!r}: one of {CPU_DOTS}.")
  if jax.default_backend() != "cpu" or cpu_dots == "xla":
    return None
  return _accepted(tuple(sorted(_CPU_OPTIONS.items())))


@functools.lru_cache(maxsize=None)
def _accepted(items):
  """The options if this jaxlib knows them, else None (an older or newer XLA may not: its
  defaults are then used, as they would be without this module)."""
  opts = dict(items)
  try:
    jax.jit(lambda x: x + 1, compiler_options=opts).lower(jax.numpy.zeros(())).compile()
  except Exception:  # noqa: BLE001 - any refusal means: not this XLA's option
    return None
  return opts


def jit(fn, cpu_dots: str = "eigen", **kwargs):
  """jax.jit(fn, **kwargs) with `options(cpu_dots)`: the one way the package compiles a training
  program."""
  return jax.jit(fn, compiler_options=options(cpu_dots), **kwargs)


def at_precision(fn, precision: str):
  """fn whose every trace (under jit, grad, vmap, the transposes of its dots included) runs under
  jax.default_matmul_precision(precision): each float32 dot in it carries that precision
  ('float32': HIGHEST, full float32 inputs; 'tensorfloat32': HIGH, TF32 inputs where the device has
  them). Set inside the trace, so an enclosing context cannot override it; XLA:CPU computes every
  precision alike (the CPU's results do not change)."""
  @functools.wraps(fn)
  def traced(*args, **kwargs):
    with jax.default_matmul_precision(precision):
      return fn(*args, **kwargs)
  return traced
