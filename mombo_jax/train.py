"""The offline training epoch: one model rollout into the ring buffer, then `lax.scan` over the
epoch's gradient steps on mixed real/synthetic batches. Pure; jit-compiled once, vmapped over seeds.

Never imports gymnasium, Minari, Orbax or absl: data comes in as arrays.

Divergence is handled per seed inside the compiled epoch: after the gradient steps, a seed whose
step losses (critic, actor, alpha) went non-finite or beyond +-config.max_abs_loss, or whose agent
(parameters, target parameters, optimiser states) holds a non-finite value, keeps the agent it
entered the epoch with (its last healthy one) and is marked `diverged` for good. The selection is a
per-seed `jnp.where`, so the other seeds' computations are untouched (no lax.cond under vmap). A
diverged seed's step metrics may be NaN: consumers mask them with metrics["diverged"].
"""
import dataclasses
import functools

import chex
import flax.struct as struct
import jax
import jax.numpy as jnp
import numpy as np

from mombo_jax import buffer, dynamics, rollout, sac, targets


class TrainState(struct.PyTreeNode):
  """Everything of one seed that changes during training (vmapped: a leading seed axis)."""
  agent: sac.AgentState
  buffer: buffer.RingBuffer
  dynamics: dynamics.DynamicsState
  epoch: jax.Array          # int32 scalar: epochs completed
  diverged: jax.Array       # bool scalar: frozen at its last healthy agent (see module docstring)


def init(key, config, real: buffer.Batch, dyn) -> TrainState:
  """Fresh state of one seed. real: the real dataset as a Batch [N, ...]; dyn: this seed's model."""
  obs_dim, action_dim = real.obs.shape[-1], real.action.shape[-1]
  agent = sac.init_agent(key, obs_dim, action_dim, config, total_steps=config.schedule_steps)
  ring = buffer.init_ring(config.synthetic_capacity, obs_dim, action_dim)
  return TrainState(agent=agent, buffer=ring, dynamics=dyn, epoch=jnp.zeros((), jnp.int32),
                    diverged=jnp.zeros((), bool))


def init_seeds(keys, config, real, dyn):
  """init vmapped over seeds: keys [S, 2], dyn with a leading seed axis S."""
  return jax.vmap(init, in_axes=(0, None, None, 0))(keys, config, real, dyn)


class Cell(struct.PyTreeNode):
  """What may differ between the cells (seeds x datasets x betas) of one compiled program; vmapped
  with the state (leading cell axis). Every other setting is the config's, shared by all cells."""
  dataset: jax.Array        # int32 scalar: which of the stacked datasets (buffer.stack) it trains on
  size: jax.Array           # int32 scalar: that dataset's real transitions (rows past it: padding)
  beta: jax.Array           # f32 scalar: MOMBO / MOBILE beta, MOPO lambda


def make_cells(dataset, size, beta) -> Cell:
  """Cell with arrays [C] from per-cell sequences (or numbers, broadcast to the others' length)."""
  n = max(np.size(dataset), np.size(size), np.size(beta))
  as_ = lambda x, t: np.broadcast_to(np.asarray(x, t), (n,)).copy()  # noqa: E731
  return Cell(dataset=as_(dataset, np.int32), size=as_(size, np.int32),
              beta=as_(beta, np.float32))


def single_dataset(real: buffer.Batch, config, cells: int = None):
  """(real stacked [1, N, ...], Cell [cells]) for seeds of one dataset at config.beta: the
  datasets and cells arguments of make_seeds_epoch's function for a plain run. cells: default
  config.num_seeds."""
  n = real.reward.shape[0]
  cells = config.num_seeds if cells is None else cells
  return jax.tree.map(lambda x: x[None], real), make_cells(np.zeros(cells), n, config.beta)


def make_epoch(config):
  """Returns a pure epoch(state, real, key, cell=None) -> (state, metrics) of one cell (one seed).

  real: the real dataset, Batch [N, ...], with cell None (then beta = config.beta); or datasets
  stacked [D, N_max, ...] (buffer.stack) with a Cell saying which one, its size and beta. Shared by
  all cells: vmap it with in_axes None.
  metrics: {name: [steps_per_epoch]} per gradient step (sac.update's, e.g. `q_mean`: the critics'
  mean Q on the step's batch, which the runner watches against the return bound), plus rollout
  statistics (scalars),
  `diverged` (bool scalar: the seed is frozen, this epoch or before) and `diverged/<quantity>` (bool
  scalars, quantity in DIVERGENCE_CHECKS: which check failed THIS epoch on a healthy seed).
  """
  target = targets.get_target(config)
  term_fn = dynamics.termination_fn(config.env_name)

  def epoch(state: TrainState, real: buffer.Batch, key, cell: Cell = None):
    if cell is None:
      chex.assert_rank(real.obs, 2)
      dataset, size, beta = None, real.obs.shape[0], None
    else:
      chex.assert_rank(real.obs, 3)
      dataset, size, beta = cell.dataset, cell.size, cell.beta
    k_start, k_roll, k_steps = jax.random.split(key, 3)
    agent, dyn = state.agent, state.dynamics
    start = jax.random.randint(k_start, (config.rollout_batch_size,), 0, size)
    policy_fn = functools.partial(_policy, agent, config)
    ring, roll_metrics = rollout.run(k_roll, policy_fn, dyn,
                                     buffer.take(real, start, dataset).obs, state.buffer, config,
                                     term_fn, beta=beta)
    target_fn = functools.partial(target, dyn=dyn, config=config, term_fn=term_fn, beta=beta)

    def step(agent, k):
      k_batch, k_update = jax.random.split(k)
      batch = buffer.sample_mixed(real, ring, k_batch, config.batch_size, config.real_ratio,
                                  dataset, size)
      return sac.update(agent, batch, k_update, target_fn, config)

    agent, step_metrics = jax.lax.scan(step, agent,
                                       jax.random.split(k_steps, config.steps_per_epoch))
    failed = health_checks(agent, step_metrics, config)
    newly = functools.reduce(jnp.logical_or, failed.values())
    diverged = state.diverged | newly
    # Selection per seed: the frozen seed keeps its input agent; its ring buffer may take the new
    # rows (it is never trained on again) so no second copy of the large buffer is kept.
    agent = jax.tree.map(lambda new, old: jnp.where(diverged, old, new), agent, state.agent)
    metrics = dict(step_metrics)
    metrics.update({f"rollout/{k}": v for k, v in roll_metrics.items()})
    metrics["diverged"] = diverged
    metrics.update({f"diverged/{k}": v & ~state.diverged for k, v in failed.items()})
    return state.replace(agent=agent, buffer=ring, epoch=state.epoch + 1,
                         diverged=diverged), metrics

  return epoch


DIVERGENCE_CHECKS = ("critic_loss", "actor_loss", "alpha_loss", "params")


def health_checks(agent: sac.AgentState, step_metrics: dict, config) -> dict:
  """{quantity: bool scalar, True = failed} for one seed after an epoch's gradient steps.

  step_metrics[name]: [steps] losses of the epoch; a loss fails when any step is non-finite or
  beyond +-config.max_abs_loss (a finite explosion, e.g. beta=1e18, is a divergence too).
  `params`: any non-finite floating leaf of the agent (parameters, targets, optimiser states).
  """
  failed = {}
  for name in DIVERGENCE_CHECKS[:-1]:
    x = step_metrics[name]
    failed[name] = ~jnp.all(jnp.isfinite(x) & (jnp.abs(x) <= config.max_abs_loss))
  leaves = [x for x in jax.tree.leaves(agent) if jnp.issubdtype(x.dtype, jnp.inexact)]
  failed["params"] = ~functools.reduce(jnp.logical_and,
                                       [jnp.all(jnp.isfinite(x)) for x in leaves])
  return failed


def _policy(agent, config, obs, key):
  return sac.policy_sample(agent, obs, key, config)


SEED_AXIS = "seeds"


def seed_mesh():
  """1-D Mesh over all devices (of every process, in a multi-process run), axis SEED_AXIS: the
  seed axis is split over it."""
  return jax.sharding.Mesh(np.asarray(jax.devices()), (SEED_AXIS,))


def seed_shardings():
  """(sharding of a leading seed axis split over all devices, replicated sharding)."""
  mesh = seed_mesh()
  return (jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(SEED_AXIS)),
          jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def check_seed_count(num_seeds: int, fix: str = ""):
  """Raises ValueError unless num_seeds splits evenly over the devices (of all processes).

  fix: the advice that ends the message (default: use a multiple of the device count, or make
  fewer devices visible).
  """
  devices = jax.devices()
  n = len(devices)
  if num_seeds % n:
    where = "" if jax.process_count() == 1 else f" of {jax.process_count()} processes"
    fix = fix or (f"use a multiple of {n} seeds, or make fewer devices visible "
                  "(CUDA_VISIBLE_DEVICES, or XLA_FLAGS=--xla_force_host_platform_device_count "
                  "on CPU)")
    raise ValueError(f"{num_seeds} seed(s) do not split evenly over the {n} "
                     f"{devices[0].platform} device(s){where} the seed axis is sharded over: {fix}.")


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


def shard_seeds(tree):
  """`tree` (every leaf with a leading seed axis) placed as make_seeds_epoch expects it."""
  return _place(tree, seed_shardings()[0])


def replicate(tree):
  """`tree` (e.g. the real dataset) copied onto every device."""
  return _place(tree, seed_shardings()[1])


def make_seeds_epoch(config):
  """jit(shard_map(vmap(epoch))) over a leading cell axis of state, key and cells; the datasets
  are shared: fn(state [C], real [D, N_max, ...], keys [C], cells: Cell [C]) -> (state, metrics).

  A cell is one seed of one (dataset, beta); a plain run has C = config.num_seeds cells of one
  dataset (single_dataset builds its arguments). The cell axis of state, key, cells, new state and
  metrics is sharded over all devices (seed_shardings), each device training C / devices
  cells; the datasets are replicated. Pass arrays placed with shard_seeds / replicate (or
  uncommitted ones): a committed array on another placement is refused by jit. config.num_seeds
  is the number of cells C and must split evenly over the devices (check_seed_count). The state
  argument is donated: its buffers (the ring buffer above all) are reused in place. Cached per
  config (ignoring fields the epoch never reads), so runs in one process share the compiled function.
  """
  check_seed_count(config.num_seeds)
  return _seeds_epoch(epoch_config(config))


# Fields the compiled epoch never reads (training the dynamics, evaluation, seeding, naming) and
# beta (a per-cell array): epoch_config resets them to the defaults.
_NOT_IN_EPOCH = ("seed", "num_seeds", "eval_every", "eval_episodes", "beta", "dyn_lr",
                 "dyn_batch_size", "dyn_holdout_ratio", "dyn_max_holdout", "dyn_improvement",
                 "dyn_patience", "dyn_max_epochs", "dyn_checkpoint_every_s")


def epoch_config(config):
  """config with the fields the compiled epoch never reads set to fixed values: cells whose
  configs give the same epoch_config can share one compiled program."""
  defaults = type(config)()
  return dataclasses.replace(config, env=config.env_name + "-random",  # only the env is read
                             **{k: getattr(defaults, k) for k in _NOT_IN_EPOCH})


@functools.lru_cache(maxsize=16)
def _seeds_epoch(config):
  seeds, shared = seed_shardings()
  spec = jax.sharding.PartitionSpec
  # shard_map, not sharding propagation alone: each device runs the vmapped epoch on its own
  # cells, and nothing is left to the partitioner that could add cross-device traffic (cells never
  # meet). One device: the same program as a plain jit(vmap(epoch)), bit for bit.
  per_device = jax.shard_map(jax.vmap(make_epoch(config), in_axes=(0, None, 0, 0)),
                             mesh=seeds.mesh,
                             in_specs=(spec(SEED_AXIS), spec(), spec(SEED_AXIS), spec(SEED_AXIS)),
                             out_specs=spec(SEED_AXIS), check_vma=False)
  return jax.jit(per_device, donate_argnums=0, in_shardings=(seeds, shared, seeds, seeds),
                 out_shardings=(seeds, seeds))
