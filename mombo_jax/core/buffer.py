"""Batches of transitions and the fixed-capacity synthetic ring buffer (a pytree, never mutated).

Batch fields, per row (B rows; S = obs dim, A = action dim):
  obs [B, S], action [B, A], reward [B] (the sampled reward; MOPO: already penalised),
  next_obs [B, S] (the sampled next state; real data: the recorded one), done [B] float32 (1 =
  terminal), obs_var [B, S] (variance of the state itself: 0 for real rows and at a rollout's first
  step), next_obs_mean [B, S], next_obs_var [B, S], reward_mean [B], reward_var [B]
  (the Gaussian of the elite that produced the row; real rows: mean = recorded value, var = 0).
"""
import chex
import flax.struct as struct
import jax
import jax.numpy as jnp
import numpy as np


class Batch(struct.PyTreeNode):
  obs: jax.Array
  action: jax.Array
  reward: jax.Array
  next_obs: jax.Array
  done: jax.Array
  obs_var: jax.Array
  next_obs_mean: jax.Array
  next_obs_var: jax.Array
  reward_mean: jax.Array
  reward_var: jax.Array


def from_transitions(transitions) -> Batch:
  """Real data (data.Transitions, numpy) -> Batch with zero variances, float32."""
  obs = np.asarray(transitions.observations, np.float32)
  next_obs = np.asarray(transitions.next_observations, np.float32)
  reward = np.asarray(transitions.rewards, np.float32)
  return Batch(
      obs=jnp.asarray(obs), action=jnp.asarray(transitions.actions, jnp.float32),
      reward=jnp.asarray(reward), next_obs=jnp.asarray(next_obs),
      done=jnp.asarray(transitions.terminals, jnp.float32),
      obs_var=jnp.zeros_like(obs), next_obs_mean=jnp.asarray(next_obs),
      next_obs_var=jnp.zeros_like(next_obs), reward_mean=jnp.asarray(reward),
      reward_var=jnp.zeros_like(reward))


# ----------------------------------------------------------------------------------------------
# Synthetic ring buffer (docs/spec.md section 6): fixed capacity, a write pointer and a valid count.
# Slots are filled contiguously from 0, so the filled slots are always [0, count): sampling draws
# from there only and never returns an unwritten (all-zero) row.


class RingBuffer(struct.PyTreeNode):
  """Fixed-capacity FIFO of Batch rows.

  data: Batch with leading axis [capacity, ...]; ptr: int32 [] next slot to write;
  count: int32 [] number of filled slots (<= capacity). Stack a leading seed axis by vmapping.
  """
  data: Batch
  ptr: jax.Array
  count: jax.Array

  @property
  def capacity(self) -> int:
    return self.data.reward.shape[-1]


def init_ring(capacity: int, obs_dim: int, action_dim: int) -> RingBuffer:
  """An empty ring of `capacity` rows (zeros, float32; ptr = count = 0)."""
  if capacity < 1:
    raise ValueError(f"Ring buffer capacity must be >= 1, got {capacity}.")
  z = lambda *shape: jnp.zeros((capacity,) + shape, jnp.float32)  # noqa: E731
  data = Batch(obs=z(obs_dim), action=z(action_dim), reward=z(), next_obs=z(obs_dim), done=z(),
               obs_var=z(obs_dim), next_obs_mean=z(obs_dim), next_obs_var=z(obs_dim),
               reward_mean=z(), reward_var=z())
  return RingBuffer(data=data, ptr=jnp.zeros((), jnp.int32), count=jnp.zeros((), jnp.int32))


def add(buf: RingBuffer, rows: Batch, mask: jax.Array, capacity=None) -> RingBuffer:
  """Writes the rows with mask True, in order, contiguously from buf.ptr, wrapping at `capacity`.

  rows: Batch [N, ...]; mask: bool [N]; capacity: int32 scalar <= buf.capacity (may be traced;
  default buf.capacity): the ring uses slots [0, capacity) only, so a cell of a program whose
  ring is larger (train.Cell: a shorter rollout) behaves as a ring of its own size. Masked-out
  rows are not written and take no slot. If more than `capacity` rows are masked in, only the
  last `capacity` of them survive (FIFO).
  """
  size = buf.capacity
  capacity = size if capacity is None else jnp.asarray(capacity, jnp.int32)
  chex.assert_rank(mask, 1)
  chex.assert_equal_shape_prefix([rows.reward, mask], 1)
  mask = mask.astype(bool)
  n_new = jnp.sum(mask, dtype=jnp.int32)
  pos = jnp.cumsum(mask, dtype=jnp.int32) - 1          # rank of each kept row among kept rows
  # Rows that would be overwritten within this same call are dropped, so no slot gets two writes
  # (duplicate scatter indices have no defined winner).
  keep = mask & (pos >= n_new - capacity)
  # Index `size` is out of range, so mode="drop" skips those rows.
  idx = jnp.where(keep, (buf.ptr + pos) % capacity, size)
  data = jax.tree.map(lambda d, r: d.at[idx].set(r.astype(d.dtype), mode="drop"), buf.data, rows)
  return RingBuffer(data=data, ptr=((buf.ptr + n_new) % capacity).astype(jnp.int32),
                    count=jnp.minimum(buf.count + n_new, capacity).astype(jnp.int32))


def sample(buf: RingBuffer, key: jax.Array, n: int) -> Batch:
  """n rows drawn uniformly (with replacement) from the filled slots [0, count) -> Batch [n, ...].

  An empty buffer returns copies of slot 0 (zeros); `sample_mixed` never uses those.
  """
  idx = jax.random.randint(key, (n,), 0, jnp.maximum(buf.count, 1))
  return jax.tree.map(lambda d: d[idx], buf.data)


def take(real: Batch, idx, dataset_index=None) -> Batch:
  """Rows idx [K] of `real` ([N, ...]), or of real[dataset_index] when `real` is stacked
  [D, N, ...]."""
  if dataset_index is None:
    return jax.tree.map(lambda d: d[idx], real)
  return jax.tree.map(lambda d: jnp.asarray(d)[dataset_index, idx], real)


def stack(datasets) -> tuple:
  """Datasets (Batch [N_d, ...] each) -> (Batch [D, N_max, ...], sizes int32 [D]).

  The rows past a dataset's own size are NaN: sampling draws from [0, size) only (sample_mixed,
  take), and a NaN that reached training anyway would show as a divergence, not go unnoticed.
  """
  sizes = np.asarray([d.reward.shape[0] for d in datasets], np.int32)
  n_max = int(sizes.max())

  def pad(x):
    x = np.asarray(x, np.float32)
    return np.concatenate([x, np.full((n_max - x.shape[0],) + x.shape[1:], np.nan, np.float32)])
  return jax.tree.map(lambda *xs: np.stack([pad(x) for x in xs]), *datasets), sizes


def real_rows(batch_size: int, real_ratio: float) -> int:
  """The real rows of a mixed batch, int(batch_size * real_ratio) (the references' rounding):
  what sample_mixed takes. Raises ValueError for a ratio outside [0, 1]."""
  if not 0.0 <= real_ratio <= 1.0:
    raise ValueError(f"real_ratio must lie in [0, 1], got {real_ratio}.")
  return int(batch_size * real_ratio)


def sample_mixed(real: Batch, buf: RingBuffer, key: jax.Array, batch_size: int, n_real,
                 dataset_index=None, size=None) -> Batch:
  """n_real real rows, then batch_size - n_real synthetic ones -> Batch [batch_size].

  real: Batch [N_real, ...] (e.g. from_transitions), or datasets stacked [D, N_max, ...] (stack)
  with `dataset_index` (int scalar, may be traced) picking one of them. size: int scalar (may be
  traced), the real rows drawn from are [0, size); default all N. n_real: int scalar in
  [0, batch_size] (may be traced: cells of one program may mix differently; real_rows gives it
  from a ratio). batch_size is static. If the ring is still empty, every row is real.

  Draws: batch_size real indices from one half of the key and batch_size ring indices from the
  other; row i < n_real is real draw i, row i >= n_real ring draw i - n_real. Under JAX's
  partitionable threefry, randint(k, (B,))[:m] == randint(k, (m,)), so the rows are those of
  drawing exactly n_real real and batch_size - n_real ring indices.
  """
  chex.assert_rank(jnp.asarray(n_real), 0)
  k_real, k_syn = jax.random.split(key)
  n_data = real.reward.shape[-1] if size is None else size
  idx = jax.random.randint(k_real, (batch_size,), 0, n_data)
  reals = take(real, idx, dataset_index)
  if isinstance(n_real, (int, np.integer)):
    # A Python count (every cell of the program mixes alike): the ring draws are [batch - n_real].
    n_real = int(n_real)
    if n_real == batch_size:
      return reals
    syn = sample(buf, k_syn, batch_size - n_real)
    # A select, not a cond: this runs vmapped over seeds, where cond would execute both sides.
    return jax.tree.map(lambda r, s: jnp.concatenate(
        [r[:n_real], jnp.where(buf.count > 0, s, r[n_real:])], axis=0), reals, syn)
  syn_idx = jax.random.randint(k_syn, (batch_size,), 0, jnp.maximum(buf.count, 1))
  row = jnp.arange(batch_size)
  syn_rows = jax.tree.map(lambda d: d[syn_idx[jnp.maximum(row - n_real, 0)]], buf.data)
  use_real = (row < n_real) | (buf.count <= 0)
  return jax.tree.map(
      lambda r, s: jnp.where(use_real.reshape((-1,) + (1,) * (r.ndim - 1)), r, s),
      reals, syn_rows)
