"""Where a program's cells live: the cell axis split over all devices (of every process), the
placement of a launch's arguments (`shard_cells`, `replicate`), and a run's cells taken out of a
launch's state for its checkpoint without gathering (`take_cells`; `resize_rings` pads a run's
ring back on restore). Kept apart from the epoch (core/train.py), as brax keeps its pmap helpers
apart from its training step; train's compiled programs build on `cell_mesh` and `CELL_AXIS`.
"""
import functools
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np

CELL_AXIS = "cells"


def cell_mesh():
  """1-D Mesh over all devices (of every process, in a multi-process run), axis CELL_AXIS: the
  cell axis is split over it."""
  return jax.sharding.Mesh(np.asarray(jax.devices()), (CELL_AXIS,))


def cell_shardings():
  """(sharding of a leading cell axis split over all devices, replicated sharding)."""
  mesh = cell_mesh()
  return (jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(CELL_AXIS)),
          jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def check_cell_count(num_cells: int, fix: str = ""):
  """Raises ValueError unless num_cells splits evenly over the devices (of all processes).

  The message speaks of seeds, the cells a user asks for (--seeds) in a plain run. fix: the advice
  that ends the message (default: use a multiple of the device count, or make fewer devices
  visible).
  """
  devices = jax.devices()
  n = len(devices)
  if num_cells % n:
    where = "" if jax.process_count() == 1 else f" of {jax.process_count()} processes"
    fix = fix or (f"use a multiple of {n} seeds, or make fewer devices visible "
                  "(CUDA_VISIBLE_DEVICES, or XLA_FLAGS=--xla_force_host_platform_device_count "
                  "on CPU)")
    raise ValueError(f"{num_cells} seed(s) do not split evenly over the {n} "
                     f"{devices[0].platform} device(s){where} the seed axis is sharded over: "
                     f"{fix}.")


def _place(tree, sharding):
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)

  # Several processes: every process holds the whole value on the host and contributes the part
  # that lives on its own devices (device_put cannot address other processes' devices).
  def one(x):
    if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
      impl = jax.random.key_impl(x)
      return jax.random.wrap_key_data(one(jax.random.key_data(x)), impl=impl)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
  return jax.tree.map(one, tree)


def shard_cells(tree):
  """`tree` (every leaf with a leading cell axis) placed as make_cells_epoch / make_cells_chunk
  expect it."""
  return _place(tree, cell_shardings()[0])


def replicate(tree):
  """`tree` (e.g. the real dataset) copied onto every device."""
  return _place(tree, cell_shardings()[1])


def resize_rings(state, rows: int):
  """state [C] (train.CellState) with its ring buffers cut or zero-padded to `rows` slots (ptr,
  count untouched).

  A program's ring has its longest rollout's capacity; a cell with a shorter one uses only its
  first capacity(config, k) slots (ptr, count < that), so its checkpoint holds what a plain run
  of its run saves (cut before saving), and restores onto the program's ring (padded with the
  zeros init_ring writes)."""
  def one(x):
    chex.assert_rank(x, {2, 3})                  # [C, capacity] or [C, capacity, dim]
    return _cut(x, rows)
  return state.replace(buffer=state.buffer.replace(data=jax.tree.map(one, state.buffer.data)))


def take_cells(state, cell_slice: slice, rows: int):
  """state [C] (train.CellState) -> state [cell_slice] (a run's cells) with its ring buffers cut or
  zero-padded to `rows` slots: what a plain run of those cells checkpoints (resize_rings of the
  slice).

  Moves no data it need not: a leaf sharded over its cell axis (a launch's state, on the devices
  of every process) becomes an array over the devices that hold the cells asked for, each keeping
  its own part (a device-local slice; nothing crosses devices or processes), so that every process
  then writes its own shards of the checkpoint. Only where those parts differ in size (a run
  straddling shard boundaries unevenly, e.g. cells 1..3 of 2 a device), or, in a multi-process
  run, where the cells asked for are on some processes only (Orbax writes no array that a process
  holds no part of), is the slice one jitted call over all the leaf's devices: the cells spread
  over them (copies where they do not divide). Every process calls this together. Numpy and
  single-device leaves: plain slicing."""
  a, b, step = cell_slice.indices(len(jax.tree.leaves(state)[0]))
  if step != 1 or b <= a:
    raise ValueError(f"take_cells needs a non-empty slice of consecutive cells, got {cell_slice}.")
  take = lambda rows: lambda x: _take_cells(x, a, b, rows)  # noqa: E731
  rest = jax.tree.map(take(None), state.replace(buffer=state.buffer.replace(data=())))
  return rest.replace(buffer=rest.buffer.replace(data=jax.tree.map(take(rows),
                                                                    state.buffer.data)))


def _cut(x, rows):
  """x [n, capacity, ...] with axis 1 cut or zero-padded to `rows` (None: x as it is)."""
  if rows is None or x.shape[1] == rows:
    return x
  if x.shape[1] > rows:
    return x[:, :rows]
  pad = [(0, 0)] * x.ndim
  pad[1] = (0, rows - x.shape[1])
  return np.pad(x, pad) if isinstance(x, np.ndarray) else jnp.pad(x, pad)


def _cell_spans(x):
  """[(device, start, stop)] of a jax.Array whose devices each hold a distinct block of the
  leading axis (and all of the other axes), by start; None for any other placement (one device,
  copies, other axes split)."""
  if not isinstance(x, jax.Array) or x.ndim == 0 or len(x.sharding.device_set) < 2:
    return None
  spans = []
  for device, index in x.sharding.devices_indices_map(x.shape).items():
    if any(i.indices(n)[:2] != (0, n) for i, n in zip(index[1:], x.shape[1:])):
      return None
    spans.append((device, *index[0].indices(x.shape[0])[:2]))
  spans.sort(key=lambda s: s[1])
  if [s[1] for s in spans[1:]] != [s[2] for s in spans[:-1]]:      # overlapping: copies
    return None
  return spans


@functools.lru_cache(maxsize=32)
def _jitted_take(a: int, b: int, rows, out):
  """jit of x -> _cut(x[a:b], rows) placed on `out`: one function per run and placement, so a
  launch's checkpoints compile it once per leaf shape."""
  return jax.jit(lambda x: _cut(x[a:b], rows), out_shardings=out)


def _take_cells(x, a: int, b: int, rows):
  """x[a:b] (its axis 1 as _cut makes it), placed as take_cells says."""
  spans = _cell_spans(x)
  if spans is None:
    return _cut(x[a:b], rows)
  pieces = [(d, max(s, a), min(e, b), s, e) for d, s, e in spans if max(s, a) < min(e, b)]
  shape = (b - a,) + x.shape[1:]
  if rows is not None:
    shape = shape[:1] + (rows,) + shape[2:]
  if (len({hi - lo for _, lo, hi, _, _ in pieces}) > 1
      or len({d.process_index for d, *_ in pieces}) < jax.process_count()):
    # Parts of unequal size (no sharding describes them), or not on every process (Orbax writes
    # an array of a multi-process run only when every process holds a part of it): one jitted
    # slice over the leaf's own devices (in their order, as jit requires), the cells split over
    # as many as divide them, copies on the others.
    devices = np.asarray([d for d, *_ in spans])
    split = math.gcd(b - a, len(devices))
    mesh = jax.sharding.Mesh(devices.reshape(split, -1), (CELL_AXIS, "copies"))
    return _jitted_take(a, b, rows, jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(CELL_AXIS)))(x)
  mesh = jax.sharding.Mesh(np.asarray([d for d, *_ in pieces]), (CELL_AXIS,))
  sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(CELL_AXIS))
  local = {shard.device: shard.data for shard in x.addressable_shards}
  parts = [_cut(local[d] if (lo, hi) == (s, e) else local[d][lo - s:hi - s], rows)
           for d, lo, hi, s, e in pieces if d in local]
  return jax.make_array_from_single_device_arrays(shape, sharding, parts, dtype=x.dtype)
