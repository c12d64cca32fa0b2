"""#29's CPU rewrites of the training epoch, chosen per backend as the cells' layout is
(cell_layout): the CPU keeps its measured choices, bit for bit; other backends (a GPU) get the
plain program, where the rewrites' reasons (caches, Eigen's dot forms) do not hold.

  predict_rows   the rollout's dynamics predictions (dynamics.predict) and its actor (train's
                 policy) run as a loop over pieces of this many rows (pieces.map_rows), or in one
                 piece (None). CPU: PREDICT_ROWS = 1000 (a rollout's activations stay in the caches:
                 a MOPO epoch 0.87x the time on a 2-core Xeon, benchmarks/bench_epoch_changes.txt);
                 elsewhere None (on a GPU each of the 5 model steps walked 50 pieces in series,
                 issue 43).
  critic_matmul  how the networks' layers (critics.matmul: the critics and the actor) get their
                 gradients: 'rewrite', the backward written out for Eigen's dots (kernel.T and x.T
                 behind optimization_barrier, a scalar head's weight gradient as a gemv), or 'jax',
                 JAX's own transpose rule of dot_general (cuBLAS takes transposed operands itself,
                 and the barriers stop XLA's fusions). CPU: 'rewrite'; elsewhere 'jax'. The
                 forward pass is the same dot_general either way.

`choose(predict_rows, critic_matmul)` resolves the choices passed down from above the core
(settings/environment.py reads MOMBO_JAX_PREDICT_ROWS and MOMBO_JAX_CRITIC_MATMUL; None: the
backend's default). A compiled program is traced under its choices (`tracing`, entered by
train.make_epoch), and the code they concern reads them when traced (`in_effect`): outside any
program, the backend's defaults. The core reads no environment variable.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Optional, Union

import jax

PREDICT_ROWS = 1000
CRITIC_MATMULS = ("rewrite", "jax")


@dataclasses.dataclass(frozen=True)
class Rewrites:
  """The rewrites one program is traced with (see the module docstring). Hashable: a compiled
  program's cache key."""
  predict_rows: Optional[int]     # rows per piece; None: one piece
  critic_matmul: str              # 'rewrite' | 'jax'

  def __post_init__(self):
    if self.predict_rows is not None and (not isinstance(self.predict_rows, int)
                                          or self.predict_rows < 1):
      raise ValueError(f"predict_rows={self.predict_rows!r}: a positive int, or None (one piece).")
    if self.critic_matmul not in CRITIC_MATMULS:
      raise ValueError(f"critic_matmul={self.critic_matmul!r}: one of {CRITIC_MATMULS}.")


def choose(predict_rows: Union[None, int, str] = None,
           critic_matmul: Optional[str] = None) -> Rewrites:
  """The Rewrites of the choices passed down (settings.environment.predict_rows() /
  critic_matmul()): predict_rows a positive int, 'none' (one piece) or None (the backend's
  default); critic_matmul 'rewrite', 'jax' or None (the backend's default). ValueError otherwise."""
  cpu = jax.default_backend() == "cpu"
  if predict_rows is None:
    predict_rows = PREDICT_ROWS if cpu else None
  elif predict_rows == "none":
    predict_rows = None
  if critic_matmul is None:
    critic_matmul = "rewrite" if cpu else "jax"
  return Rewrites(predict_rows=predict_rows, critic_matmul=critic_matmul)


_TRACING: contextvars.ContextVar = contextvars.ContextVar("mombo_jax_rewrites", default=None)


def in_effect() -> Rewrites:
  """The Rewrites of the program being traced (`tracing`), else the backend's defaults."""
  current = _TRACING.get()
  return choose() if current is None else current


@contextlib.contextmanager
def tracing(rewrites: Optional[Rewrites]):
  """Traces the code inside under `rewrites` (None: the backend's defaults). Enter it inside the
  function being traced (train.make_epoch's epoch), so that every trace of it, and no other, sees
  them; key the compiled program's cache by them."""
  token = _TRACING.set(rewrites)
  try:
    yield
  finally:
    _TRACING.reset(token)
