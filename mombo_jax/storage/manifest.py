"""A checkpoint's manifest: what each saved leaf is (its path, shape, dtype, weak type, key impl)
and the CRC32s of its bytes, whole or, for a leaf split over devices, one per distinct shard
(computed by the processes holding them, shared in one allgather). checkpoint.py writes it as the
meta item of every step and checks every restored leaf against it (module docstring there).

A manifest entry: [path, shape, dtype name, weak, crc, key impl], crc an int or a list of
[[start, stop] per dim, CRC32] per shard.
"""
from __future__ import annotations

import math
import zlib

import jax
import numpy as np
from jax.experimental import multihost_utils

SCALARS = (bool, int, float)
LEAF_TYPES = (jax.Array, np.ndarray, np.generic) + SCALARS


def leaf_map(fn, tree):
  """fn(path, leaf) over the leaves; path: names as Orbax gives them (field, key, index)."""
  name = lambda k: str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k))))  # noqa: E731
  return jax.tree_util.tree_map_with_path(lambda p, x: fn(tuple(map(name, p)), x), tree)


def leaves(tree) -> dict:
  out = {}
  leaf_map(out.__setitem__, tree)  # {path: leaf}
  return out


def fmt(path) -> str:
  return "/".join(path) or "<root>"


def fmt_block(block) -> str:
  """A shard's block as numpy would index it: "0:2, 0:100, 0:11"."""
  return ", ".join(f"{lo}:{hi}" for lo, hi in block)


def is_key(x) -> bool:
  return jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key)


def is_weak(x) -> bool:
  return isinstance(x, SCALARS) or bool(getattr(x, "weak_type", False))


def describe(x):
  """(shape, dtype name) of a leaf or template leaf; typed keys as keys ("key<fry>")."""
  x = np.asarray(x) if isinstance(x, SCALARS + (np.generic,)) else x
  return tuple(x.shape), str(x.dtype) if is_key(x) else np.dtype(x.dtype).name


def host(x) -> np.ndarray:
  return np.asarray(jax.device_get(jax.random.key_data(x) if is_key(x) else x))


def crc_of(arr: np.ndarray) -> int:
  return zlib.crc32(np.ascontiguousarray(arr).tobytes())


def whole(x) -> bool:
  """Whether every process holds all of leaf x: its CRC is then of the whole leaf, from a host
  copy (numpy, Python scalars, one device or copies on every device of a single process, copies
  on devices of every process). Else (split over devices, or on another process's device) it is
  recorded per shard. Decided from the sharding alone, so every process decides alike."""
  if not isinstance(x, jax.Array):
    return True
  if not x.sharding.is_fully_replicated:
    return False
  return jax.process_count() == 1 or len({d.process_index for d in x.sharding.device_set}) == \
      jax.process_count()


def _index(index, shape) -> tuple:
  """((start, stop) per dim) of a shard's index (a tuple of slices)."""
  return tuple(sl.indices(n)[:2] for sl, n in zip(index, shape))


def shard_crcs(x) -> list:
  """[[[start, stop] per dim], CRC32 of that block's bytes] for each distinct block of the shards
  of jax.Array x (by start), the CRC -1 where none of its copies is on this process's devices."""
  blocks = sorted({_index(i, x.shape) for i in x.sharding.devices_indices_map(x.shape).values()})
  local = {}
  for shard in x.addressable_shards:          # one device-to-host copy per block, block by block
    block = _index(shard.index, x.shape)
    if block not in local:
      local[block] = crc_of(host(shard.data))
  return [[[list(dim) for dim in block], local.get(block, -1)] for block in blocks]


def combine(manifest: list, where: str):
  """Fills in, on every process, the shard CRCs other processes computed (the -1s): one allgather
  of the CRC table, a fixed-size integer array (the blocks follow from the shardings, which every
  process knows alike)."""
  owed = [shard for leaf in manifest if isinstance(leaf[4], list) for shard in leaf[4]]
  if not owed:
    return
  # [2, n] uint32 (JAX's 32-bit default would wrap int64 CRCs): the CRCs, and 1 where computed.
  table = np.asarray([[max(crc, 0) for _, crc in owed], [crc >= 0 for _, crc in owed]], np.uint32)
  if jax.process_count() > 1:
    tables = np.asarray(multihost_utils.process_allgather(table))          # [P, 2, n]
    table = tables[np.argmax(tables[:, 1], axis=0), :, np.arange(table.shape[1])].T
  if not table[1].all():
    raise ValueError(f"Cannot checkpoint {where}: a shard of a leaf is on no process's devices "
                     "(an array of another launch?).")
  for shard, crc in zip(owed, table[0].tolist()):
    shard[1] = crc


def nbytes(leaf: list) -> int:
  """Bytes a manifest entry's leaf holds in memory: shape x itemsize (typed keys: of their key
  data; Python scalars: at their saved width)."""
  _, shape, dtype, _, _, impl = leaf
  if impl:
    data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=impl)))
    return math.prod(shape) * data.size * data.dtype.itemsize
  return math.prod(shape) * np.dtype(dtype).itemsize


def mismatches(saved: dict, template: dict, partial: bool) -> list:
  kind = lambda d: d if d.startswith("key<") else np.dtype(d).kind  # noqa: E731
  out = [f"template leaf {fmt(p)} is not in the checkpoint" for p in template if p not in saved]
  if not partial:
    out += [f"checkpoint leaf {fmt(p)} is not in the template" for p in saved if p not in template]
  for p, x in template.items():
    if p not in saved:
      continue
    if not isinstance(x, LEAF_TYPES + (jax.ShapeDtypeStruct,)):
      out.append(f"{fmt(p)}: a {type(x).__name__} in the template, not an array, ShapeDtypeStruct "
                 "or Python scalar")
      continue
    (shape, dtype), (s_shape, s_dtype, s_weak) = describe(x), saved[p][:3]
    if shape != s_shape:
      out.append(f"{fmt(p)}: shape {s_shape} in checkpoint, {shape} in template")
    elif dtype != s_dtype and not ((s_weak or is_weak(x)) and kind(dtype) == kind(s_dtype)):
      out.append(f"{fmt(p)}: dtype {s_dtype} in checkpoint, {dtype} in template")
  return out


def failed_crc(x, shape, dtype, crc, impl):
  """None when restored leaf x (host or device array, Python scalar, typed key) holds the bytes
  its manifest entry (shape, dtype, crc, impl) describes; else where it fails: "" (the whole
  leaf) or " in its shard [a:b, ...]". crc: one int, or [[start, stop] per dim, CRC] per shard as
  the writers held them."""
  data = host(x) if impl else host(x).astype(dtype, copy=False)  # Python scalars: saved width
  for block, want in ([[None, crc]] if isinstance(crc, int) else crc):
    part = data if block is None else data[tuple(slice(lo, hi) for lo, hi in block)]
    if np.shape(x)[:len(shape)] != shape or crc_of(part) != want:
      return "" if block is None else f" in its shard [{fmt_block(block)}]"
  return None
