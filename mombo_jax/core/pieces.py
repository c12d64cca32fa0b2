"""Row-wise functions over many rows, run as a loop over pieces of rows (for the caches).

Why (on CPU; the pieces are chosen per backend, rewrites.py): at a rollout's 50,000 rows every
layer's activations (e.g. [7, 50,000, 200] f32 in the dynamics ensemble, 280 MB) go to memory
and back between layers; a piece's stay in the caches. Each row's arithmetic is the one of the
one-piece program; XLA may still round the two programs differently in the last bits.
"""
from typing import Optional

import jax
import jax.numpy as jnp


def map_rows(fn, piece_rows: Optional[int], *arrays, out_row_axis=0):
  """fn(*arrays) for a row-wise fn, computed on pieces of `piece_rows` rows (the last padded with
  zeros, its padding dropped) when the arrays have more rows than that; else (or for piece_rows
  None: rewrites.Rewrites.predict_rows off the CPU) fn(*arrays).

  arrays: [B, ...] each (B rows, the same B); fn(*pieces [R, ...]) -> a tuple (or one array) of
  outputs with their row axis at `out_row_axis` (e.g. 1 for [K, R, ...]).
  Returns fn's outputs for all B rows, row axis where fn put it.
  """
  rows = arrays[0].shape[0]
  if piece_rows is None or rows <= piece_rows:
    return fn(*arrays)
  count = -(-rows // piece_rows)

  def split(x):
    x = jnp.pad(x, [(0, count * piece_rows - rows)] + [(0, 0)] * (x.ndim - 1))
    return x.reshape((count, piece_rows) + x.shape[1:])

  out = jax.lax.map(lambda xs: fn(*xs), tuple(split(x) for x in arrays))

  def join(x):  # [count, ..., R (at out_row_axis + 1), ...] -> [..., B, ...]
    x = jnp.moveaxis(x, 0, out_row_axis)
    shape = x.shape[:out_row_axis] + (-1,) + x.shape[out_row_axis + 2:]
    return jax.lax.slice_in_dim(x.reshape(shape), 0, rows, axis=out_row_axis)

  return jax.tree.map(join, out)
