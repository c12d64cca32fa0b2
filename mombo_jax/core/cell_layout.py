"""How one compiled program runs over its cells (seeds, or cells of a grid): side by side or one
after another. Used by the training epoch (`over_cells`) and the dynamics ensemble's training over
seeds (`map_cells`, dynamics/dynamics_training).

A program of C cells takes state [C, ...] and returns it. Two layouts compute the same per-cell
arithmetic:
  - "vmap": jax.vmap over the cell axis. Every array gains a leading C and every op does all cells
    at once: one [C, critics, batch, width] dot instead of C of them. The right choice where the
    hardware wants larger ops (a GPU).
  - "loop": a lax.fori_loop over the cells, each iteration the one-cell program (vmap over a cell
    axis of 1) on that cell's slice of the state. On a CPU the vmapped cells' working set (C times
    the parameters, optimiser moments and activations of one cell) no longer fits the caches and
    the memory-bound ops (Adam, transposes, ReLU) slow down: measured on a 2-core Xeon at 4 seeds,
    a vmapped MOPO epoch took 1.12x the time of four one-seed programs, the loop 0.99x; the
    dynamics training 1.16x vmapped against 0.97x looped (benchmarks/bench_cell_layout.txt). The
    loop also compiles one cell's program, whatever C is.
A "loop" cell runs the one-cell program's arithmetic, so its numbers do not depend on how many
cells share its program (tests/test_train.py); "vmap" changes the summation order of batched ops
with C, hence last bits.

`layout(choice)` picks: the choice passed down from above the core (settings/environment.py reads
MOMBO_JAX_CELLS, 'vmap' or 'loop'), else 'loop' on CPU and 'vmap' on any other backend. The core
reads no environment variable.
"""
from typing import Optional

import jax
import jax.numpy as jnp

LAYOUTS = ("vmap", "loop")


def layout(choice: Optional[str] = None) -> str:
  """'vmap' or 'loop' (see the module docstring): `choice` (settings.environment.cells(), from
  MOMBO_JAX_CELLS), or for None the default backend's."""
  if choice is None:
    return "loop" if jax.default_backend() == "cpu" else "vmap"
  if choice not in LAYOUTS:
    raise ValueError(f"cell layout {choice!r}: one of {LAYOUTS}.")
  return choice


def over_cells(epoch, how: str):
  """epoch(state, real, key, cell) of one cell -> fn(state [C], real, keys [C, ...],
  cells [C]) -> (state [C], metrics {name: [C, ...]}), `real` shared by all cells.

  how: 'vmap' or 'loop' (layout()). A program of one cell is the same in both layouts. Looped, the
  state argument is the loop's carry, each cell's row overwritten in place (no second copy of the
  ring buffers)."""
  return map_cells(epoch, (0, None, 0, 0), how,
                   start=lambda args, shapes, n: (args[0], _zeros(shapes[1], n)))


def map_cells(fn, in_axes: tuple, how: str, start=None):
  """jax.vmap(fn, in_axes) over a leading cell axis, or its loop: each positional argument is
  mapped over its axis 0 (in_axes entry 0) or shared (None); every output has a leading cell axis.

  how 'loop': a fori_loop over the C cells, iteration c running vmap(fn, in_axes) on the cells
  c:c+1 of the mapped arguments (the one-cell program) and writing its outputs into row c of the
  carry. start(args, one cell's output shapes (leading axis 1), C) -> the carry's initial value:
  default zeros; return an argument of the outputs' shapes to have it updated in place. C == 1 runs
  vmap(fn, in_axes)."""
  if any(a not in (0, None) for a in in_axes):
    raise ValueError(f"in_axes {in_axes}: each entry 0 (mapped over the cells) or None (shared).")
  vfn = jax.vmap(fn, in_axes=in_axes)
  if how == "vmap":
    return vfn
  if how != "loop":
    raise ValueError(f"cell layout {how!r}: one of {LAYOUTS}.")
  mapped = [i for i, a in enumerate(in_axes) if a == 0]

  def looped(*args):
    n = jax.tree.leaves(args[mapped[0]])[0].shape[0]
    if n == 1:
      return vfn(*args)

    def cell(c):
      return [jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, c, 1), a) if i in mapped
              else a for i, a in enumerate(args)]

    shapes = jax.eval_shape(vfn, *cell(0))
    carry = (start or (lambda _, one, n: _zeros(one, n)))(args, shapes, n)

    def body(c, carry):
      put = lambda whole, one: jax.lax.dynamic_update_slice_in_dim(whole, one, c, 0)  # noqa: E731
      return jax.tree.map(put, carry, vfn(*cell(c)))

    return jax.lax.fori_loop(0, n, body, carry)

  return looped


def _zeros(shapes, n):
  """Zeros of n cells, from one cell's shapes (leading axis 1)."""
  return jax.tree.map(lambda s: jnp.zeros((n,) + s.shape[1:], s.dtype), shapes)
