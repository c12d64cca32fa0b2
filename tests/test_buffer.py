"""Ring buffer: contiguous masked writes, wrapping, sampling only filled slots, mixed sampling."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.core import buffer

S, A = 3, 2


def _rows(values):
  """Batch [N] whose every field encodes the row's id `values[i]` (so rows are recognisable)."""
  v = jnp.asarray(values, jnp.float32)
  vec = lambda d: jnp.repeat(v[:, None], d, axis=1)  # noqa: E731
  return buffer.Batch(obs=vec(S), action=vec(A), reward=v, next_obs=vec(S) + 0.5, done=v * 0,
                      obs_var=vec(S), next_obs_mean=vec(S), next_obs_var=vec(S), reward_mean=v,
                      reward_var=v)


@pytest.fixture(scope="module")
def jitted():
  return dict(add=jax.jit(buffer.add), sample=jax.jit(buffer.sample, static_argnums=2))


def test_init_is_empty():
  buf = buffer.init_ring(7, S, A)
  assert buf.capacity == 7 and int(buf.ptr) == 0 and int(buf.count) == 0
  assert buf.data.obs.shape == (7, S) and buf.data.action.shape == (7, A)
  with pytest.raises(ValueError, match="capacity"):
    buffer.init_ring(0, S, A)


def test_masked_add_writes_only_masked_rows_contiguously(jitted):
  buf = buffer.init_ring(8, S, A)
  ids = np.arange(1, 7)
  mask = np.array([True, False, True, True, False, True])
  buf = jitted["add"](buf, _rows(ids), jnp.asarray(mask))
  assert int(buf.count) == 4 and int(buf.ptr) == 4
  np.testing.assert_array_equal(buf.data.reward[:4], ids[mask])
  np.testing.assert_array_equal(buf.data.reward[4:], 0)
  np.testing.assert_array_equal(buf.data.obs[:4], np.repeat(ids[mask][:, None], S, 1))
  np.testing.assert_array_equal(buf.data.next_obs[:4, 0], ids[mask] + 0.5)


def test_wraps_fifo(jitted):
  cap = 5
  buf = buffer.init_ring(cap, S, A)
  written = []
  rng = np.random.default_rng(0)
  for start in range(0, 40, 4):
    ids = np.arange(start, start + 4) + 1
    mask = rng.random(4) < 0.7
    buf = jitted["add"](buf, _rows(ids), jnp.asarray(mask))
    written += list(ids[mask])
    n = len(written)
    assert int(buf.count) == min(n, cap) and int(buf.ptr) == n % cap
    # Slot i holds the latest row written to it: position j of the stream goes to slot j % cap.
    expect = np.zeros(cap)
    for j, v in enumerate(written):
      expect[j % cap] = v
    np.testing.assert_array_equal(buf.data.reward, expect)


def test_more_rows_than_capacity_keeps_last(jitted):
  cap = 4
  buf = buffer.init_ring(cap, S, A)
  buf = jitted["add"](buf, _rows([1.0]), jnp.asarray([True]))
  ids = np.arange(10, 20)
  mask = np.ones(10, bool)
  mask[[3, 8]] = False
  buf = jitted["add"](buf, _rows(ids), jnp.asarray(mask))
  stream = [1] + list(ids[mask])
  expect = np.zeros(cap)
  for j, v in enumerate(stream):
    expect[j % cap] = v
  np.testing.assert_array_equal(buf.data.reward, expect)
  assert int(buf.count) == cap and int(buf.ptr) == len(stream) % cap


def test_sample_only_filled_slots(jitted):
  buf = buffer.init_ring(100, S, A)
  buf = jitted["add"](buf, _rows(np.arange(1, 8)), jnp.ones(7, bool))
  out = jitted["sample"](buf, jax.random.PRNGKey(0), 2000)
  r = np.asarray(out.reward)
  assert r.min() >= 1 and r.max() <= 7      # never an unwritten (zero) row
  assert set(np.unique(r)) == set(range(1, 8))   # every filled slot reachable, roughly uniform
  counts = np.bincount(r.astype(int), minlength=8)[1:]
  assert counts.min() > 2000 / 7 * 0.7
  np.testing.assert_array_equal(out.obs[:, 0], r)   # rows stay intact


def test_sample_mixed_ratio_and_empty_buffer():
  real = _rows(-np.arange(1, 51))       # real rows have negative ids
  buf = buffer.init_ring(64, S, A)
  mixed = jax.jit(buffer.sample_mixed, static_argnums=3)
  out = mixed(real, buf, jax.random.PRNGKey(1), 40, buffer.real_rows(40, 0.25))
  assert out.reward.shape == (40,)
  assert np.all(np.asarray(out.reward) < 0)       # empty ring -> all real
  buf = buffer.add(buf, _rows(np.arange(1, 11)), jnp.ones(10, bool))
  out = mixed(real, buf, jax.random.PRNGKey(2), 40, 10)
  r = np.asarray(out.reward)
  assert np.sum(r < 0) == 10 and np.all(r[:10] < 0) and np.all((r[10:] >= 1) & (r[10:] <= 10))
  out = mixed(real, buf, jax.random.PRNGKey(3), 40, 40)
  assert np.all(np.asarray(out.reward) < 0)
  out = mixed(real, buf, jax.random.PRNGKey(3), 40, 0)
  assert np.all(np.asarray(out.reward) > 0)
  with pytest.raises(ValueError, match="real_ratio"):
    buffer.real_rows(8, 1.5)
  assert buffer.real_rows(256, 0.05) == 12 and buffer.real_rows(256, 0.5) == 128


def test_sample_mixed_with_a_traced_real_count_is_the_split_draw():
  """n_real traced (cells of one program mix differently): the batch is exactly n_real real draws
  and batch - n_real ring draws, as drawing those counts alone (partitionable threefry)."""
  real = _rows(-np.arange(1, 51))
  buf = buffer.add(buffer.init_ring(64, S, A), _rows(np.arange(1, 31)), jnp.ones(30, bool))
  key = jax.random.PRNGKey(7)
  per_cell = jax.jit(jax.vmap(buffer.sample_mixed, in_axes=(None, None, None, None, 0)),
                     static_argnums=3)
  counts = [0, 2, 20, 40]
  outs = per_cell(real, buf, key, 40, jnp.asarray(counts, jnp.int32))
  k_real, k_syn = jax.random.split(key)
  for out, n in zip(outs.reward, counts):
    want_real = real.reward[jax.random.randint(k_real, (n,), 0, 50)]
    want_syn = buffer.sample(buf, k_syn, 40 - n).reward
    np.testing.assert_array_equal(out, np.concatenate([want_real, want_syn]))


def test_a_capacity_below_the_rings_wraps_there():
  """buffer.add with a (traced) capacity: a smaller ring inside a larger one, the rest untouched."""
  big = buffer.init_ring(10, S, A)
  add = jax.jit(buffer.add)
  small = buffer.init_ring(4, S, A)
  for ids in (np.arange(1, 4), np.arange(4, 7), np.arange(7, 13)):
    rows, mask = _rows(ids), jnp.asarray(ids % 5 != 0)
    big = add(big, rows, mask, jnp.int32(4))
    small = add(small, rows, mask)
    np.testing.assert_array_equal(big.data.reward[:4], small.data.reward)
    np.testing.assert_array_equal(big.data.reward[4:], 0)
    assert int(big.ptr) == int(small.ptr) and int(big.count) == int(small.count) <= 4


def test_vmaps_over_seeds():
  bufs = jax.vmap(lambda _: buffer.init_ring(6, S, A))(jnp.arange(3))
  rows = jax.vmap(lambda s: _rows(jnp.arange(1, 5) + 10 * s))(jnp.arange(3))
  masks = jnp.asarray([[True] * 4, [True, False, True, False], [False] * 4])
  bufs = jax.vmap(buffer.add)(bufs, rows, masks)
  np.testing.assert_array_equal(bufs.count, [4, 2, 0])
  np.testing.assert_array_equal(bufs.data.reward[1, :2], [11, 13])
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  out = jax.vmap(buffer.sample, in_axes=(0, 0, None))(bufs, keys, 50)
  assert np.all((out.reward[0] >= 1) & (out.reward[0] <= 4))
  assert set(np.unique(out.reward[1])) <= {11, 13}
