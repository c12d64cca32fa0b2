"""How one compiled program runs an epoch over its cells: side by side or one after another.

A program of C cells (seeds, or cells of a grid) takes state [C, ...] and returns it. Two layouts
compute the same per-cell arithmetic:
  - "vmap": jax.vmap over the cell axis. Every array gains a leading C and every op does all cells
    at once: one [C, critics, batch, width] dot instead of C of them. The right choice where the
    hardware wants larger ops (a GPU).
  - "loop": a lax.fori_loop over the cells, each iteration the one-cell program (vmap over a cell
    axis of 1) on that cell's slice of the state. On a CPU the vmapped cells' working set (C times
    the parameters, optimiser moments and activations of one cell) no longer fits the caches and
    the memory-bound ops (Adam, transposes, ReLU) slow down: measured on a 2-core Xeon at 4 MOPO
    seeds, one vmapped program took 1.24x the time of four one-seed programs, the loop 1.05x
    (benchmarks/bench_cell_layout.py and its record). The loop also compiles one cell's program,
    whatever C is.
A "loop" cell runs the one-cell program's arithmetic, so its numbers do not depend on how many
cells share its program (tests/test_cell_layout.py); "vmap" changes the summation order of
batched ops with C, hence last bits.

`layout()` picks: MOMBO_JAX_CELLS in the environment ('vmap' or 'loop'), else 'loop' on CPU and
'vmap' on any other backend. Read when a program is built, so set it before the first run in a
process.
"""
import os

import jax
import jax.numpy as jnp

from mombo_jax.errors import InvalidArgument

ENV = "MOMBO_JAX_CELLS"
LAYOUTS = ("vmap", "loop")


def layout() -> str:
  """'vmap' or 'loop' (see the module docstring), from $ENV or the default backend."""
  value = os.environ.get(ENV, "").strip().lower()
  if not value:
    return "loop" if jax.default_backend() == "cpu" else "vmap"
  if value not in LAYOUTS:
    raise InvalidArgument(f"{ENV}={value!r}: use 'vmap' (cells side by side) or 'loop' (one "
                          "after another), or unset it (loop on CPU, vmap elsewhere).")
  return value


def over_cells(epoch, how: str):
  """epoch(state, real, key, cell) of one cell -> fn(state [C], real, keys [C, ...],
  cells [C]) -> (state [C], metrics {name: [C, ...]}), `real` shared by all cells.

  how: 'vmap' or 'loop' (layout()). A program of one cell is the same in both layouts."""
  vepoch = jax.vmap(epoch, in_axes=(0, None, 0, 0))
  if how == "vmap":
    return vepoch
  if how != "loop":
    raise ValueError(f"cell layout {how!r}: one of {LAYOUTS}.")

  def looped(state, real, keys, cells):
    n = jax.tree.leaves(keys)[0].shape[0]
    if n == 1:
      return vepoch(state, real, keys, cells)

    def cell(tree, c):
      return jax.tree.map(lambda x: jax.lax.dynamic_slice_in_dim(x, c, 1), tree)

    shapes = jax.eval_shape(vepoch, cell(state, 0), real, cell(keys, 0), cell(cells, 0))[1]
    metrics = jax.tree.map(lambda s: jnp.zeros((n,) + s.shape[1:], s.dtype), shapes)

    def body(c, carry):
      state, metrics = carry
      new, m = vepoch(cell(state, c), real, cell(keys, c), cell(cells, c))
      put = lambda whole, one: jax.lax.dynamic_update_slice_in_dim(whole, one, c, 0)  # noqa: E731
      return jax.tree.map(put, state, new), jax.tree.map(put, metrics, m)

    return jax.lax.fori_loop(0, n, body, (state, metrics))

  return looped
