"""Per-seed divergence inside the compiled epoch: a seed that goes non-finite or explodes is frozen
at its last healthy agent and flagged; the other seeds are untouched (bitwise: the same compiled
program, the same vmap width). Several epochs in one device call (make_cells_chunk) train as
one call per epoch, and freeze a diverged seed the same way. In the looped cell layout (the CPU
default) a cell trains as its own one-cell program, bit for bit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.core import buffer, cells_program, dynamics, placement, train as train_lib
from mombo_jax.core.epoch_settings import epoch_settings
from mombo_jax.settings import config as config_lib

S_DIM, A_DIM, N = 11, 3, 256
SEEDS = 2
CHUNK = 3          # max_epochs of the chunk function


@pytest.fixture(scope="module")
def cfg():
  # One hidden layer a network (the preset's two double XLA's work, not what the claims test): the
  # optimised compiles of these programs are most of tests/test_optimised.py's time.
  return config_lib.make_config("hopper-random", "mombo", preset="tiny", steps_per_epoch=4,
                                rollout_batch_size=16, rollout_length=2, batch_size=16,
                                actor_hidden=(8,), critic_hidden=(8,), dyn_hidden=(8,),
                                dyn_weight_decay=(2.5e-5, 1e-4))


@pytest.fixture(scope="module")
def real():
  rng = np.random.default_rng(0)
  f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  obs = f(N, S_DIM).at[:, 0].set(1.25).at[:, 1].set(0.0)   # healthy hopper heights / angles
  zeros = jnp.zeros((N, S_DIM), jnp.float32)
  return buffer.Batch(obs=obs, action=jnp.tanh(f(N, A_DIM)), reward=f(N), next_obs=obs,
                      done=jnp.zeros(N, jnp.float32), obs_var=zeros, next_obs_mean=obs,
                      next_obs_var=zeros, reward_mean=jnp.zeros(N), reward_var=jnp.zeros(N))


def _fresh(cfg, real):
  keys = jax.random.split(jax.random.PRNGKey(0), SEEDS)
  one = dynamics.init_state(jax.random.PRNGKey(1), S_DIM, A_DIM, cfg)
  dyn = jax.tree.map(lambda x: jnp.stack([x] * SEEDS), one)
  # Placed as the runner places it (and as the epoch returns it): a state of another placement
  # would compile the epoch a second time.
  return placement.shard_cells(train_lib.init_cells(keys, cfg, real, dyn))


def _poison(state, seed):
  """NaN into one seed's critic parameters (as a diverged update would leave them)."""
  critic = jax.tree.map(lambda x: x.at[seed].set(jnp.nan), state.agent.critic.params)
  return state.replace(agent=state.agent.replace(
      critic=state.agent.critic.replace(params=critic)))


def _host(tree):
  # Copies: a view of a device buffer could change when a later call takes (donates) the buffer.
  return jax.tree.map(np.array, jax.device_get(tree))


def _assert_tree_equal(a, b):
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(x, y), a, b)


def _args(cfg, real, epoch):
  """(datasets, keys, cells): the epoch's arguments after the state, for SEEDS seeds."""
  stacked, cells = train_lib.single_dataset(real, cfg, SEEDS)
  return stacked, _keys(epoch), cells


def _base_keys():
  """keys [SEEDS] of the chunk function; epoch e of a cell uses fold_in(its key, e)."""
  return jax.random.split(jax.random.PRNGKey(7), SEEDS)


def _keys(epoch):
  return jax.vmap(jax.random.fold_in, (0, None))(_base_keys(), epoch)


def test_nonfinite_seed_is_frozen_and_others_untouched(cfg, real):
  epoch_fn = cells_program.make_cells_epoch(cfg, SEEDS)
  clean, clean_metrics = epoch_fn(_fresh(cfg, real), *_args(cfg, real, 0))
  assert not np.any(np.asarray(clean_metrics["diverged"]))
  clean = _host(clean)

  poisoned = _poison(_fresh(cfg, real), 0)
  poisoned_agent = _host(poisoned.agent)
  state, metrics = epoch_fn(poisoned, *_args(cfg, real, 0))
  np.testing.assert_array_equal(np.asarray(metrics["diverged"]), [True, False])
  flagged = [k for k in train_lib.DIVERGENCE_CHECKS if bool(metrics[f"diverged/{k}"][0])]
  assert "params" in flagged and "critic_loss" in flagged, flagged
  assert not any(bool(metrics[f"diverged/{k}"][1]) for k in train_lib.DIVERGENCE_CHECKS)
  agent = _host(state.agent)
  # Seed 0 kept the agent it came in with; seed 1 is bit for bit the clean run's seed 1.
  _assert_tree_equal(jax.tree.map(lambda x: x[0], agent),
                     jax.tree.map(lambda x: x[0], poisoned_agent))
  _assert_tree_equal(jax.tree.map(lambda x: x[1], agent),
                     jax.tree.map(lambda x: x[1], clean.agent))
  np.testing.assert_array_equal(np.asarray(state.epoch), [1, 1])

  # Frozen for good: a second epoch leaves seed 0 as it was and reports no new failure.
  state2, metrics2 = epoch_fn(state, *_args(cfg, real, 1))
  np.testing.assert_array_equal(np.asarray(metrics2["diverged"]), [True, False])
  assert not any(bool(metrics2[f"diverged/{k}"][0]) for k in train_lib.DIVERGENCE_CHECKS)
  _assert_tree_equal(jax.tree.map(lambda x: x[0], _host(state2.agent)),
                     jax.tree.map(lambda x: x[0], poisoned_agent))
  assert np.all(np.isfinite(np.asarray(metrics2["critic_loss"][1])))


def _inflate(state, value=1e8):
  """Every seed's critic outputs shifted by `value` (its output biases): finite, but critic losses
  of ~value**2 (1e16), beyond the default config.agent.max_abs_loss (1e12)."""
  shifted = []

  def one(path, x):
    if getattr(path[-1], "key", None) == "bias" and x.shape[-1] == 1:
      shifted.append(path)
      return x + value
    return x
  critic = jax.tree_util.tree_map_with_path(one, state.agent.critic.params)
  assert shifted
  return state.replace(agent=state.agent.replace(
      critic=state.agent.critic.replace(params=critic)))


def test_a_finite_explosion_counts_as_divergence(cfg, real):
  """A loss beyond config.agent.max_abs_loss freezes the seed too (the state is an argument: the
  compiled epoch is the other tests')."""
  state = _inflate(_fresh(cfg, real))
  before = _host(state.agent)
  state, metrics = cells_program.make_cells_epoch(cfg, SEEDS)(state, *_args(cfg, real, 0))
  assert np.all(np.asarray(metrics["diverged"]))
  assert np.all(np.asarray(metrics["diverged/critic_loss"]))
  assert not np.any(np.asarray(metrics["diverged/params"]))   # finite, just too large
  losses = np.asarray(metrics["critic_loss"])
  assert np.all(np.isfinite(losses)) and np.all(np.abs(losses[:, 0]) > cfg.agent.max_abs_loss)
  _assert_tree_equal(_host(state.agent), before)


@pytest.fixture(scope="module")
def chunk_fn(cfg):
  return cells_program.make_cells_chunk(cfg, SEEDS, CHUNK)


def _per_cell(metrics):
  """One epoch's metrics {name: [C, ...]} reduced as the chunk does: [C] each."""
  return {k: np.any(v, axis=tuple(range(1, v.ndim))) if v.dtype == bool
          else np.mean(v, axis=tuple(range(1, v.ndim))) for k, v in _host(metrics).items()}


@pytest.fixture(scope="module")
def chunked(cfg, real, chunk_fn):
  """Epochs 0, 1, 2 from one fresh state three ways, on the host: one epoch per call (states
  after 2 and 3 epochs, metrics rows [CHUNK, C]), a chunk of 2 then one of 1, one chunk of 3."""
  stacked, _, cells = _args(cfg, real, 0)
  epoch_fn = cells_program.make_cells_epoch(cfg, SEEDS)
  state, rows, by_epoch = _fresh(cfg, real), [], {}
  for e in range(CHUNK):
    state, metrics = epoch_fn(state, stacked, _keys(e), cells)
    rows.append(_per_cell(metrics))
    by_epoch[e + 1] = _host(state)
  by_epoch["metrics"] = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
  state, first = chunk_fn(_fresh(cfg, real), stacked, _base_keys(), cells, 0, 2)
  two = _host((state, first))
  state, second = chunk_fn(state, stacked, _base_keys(), cells, 2, 1)
  three = _host(chunk_fn(_fresh(cfg, real), stacked, _base_keys(), cells, 0, CHUNK))
  return dict(epochs=by_epoch, two=two, two_then_one=_host((state, second)), three=three)


def _assert_tree_close(a, b):
  # rtol, not equality: XLA may fuse the while loop's body otherwise than the single epoch. A
  # float32 tolerance on every backend: the programs compute at cfg's matmul_precision, float32,
  # pinned where the epoch is traced (tests/test_matmul_precision.py checks every dot), not at a
  # GPU's TF32 default.
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7), a, b)


@pytest.mark.bit_identity
def test_a_chunk_trains_as_one_call_per_epoch(chunked):
  epochs = chunked["epochs"]
  state2, metrics2 = chunked["two"]
  _assert_tree_close(state2, epochs[2])
  _assert_tree_close({k: v[:2] for k, v in metrics2.items()},
                     {k: v[:2] for k, v in epochs["metrics"].items()})
  state3, metrics3 = chunked["three"]
  _assert_tree_close(state3, epochs[3])
  _assert_tree_close(metrics3, epochs["metrics"])
  np.testing.assert_array_equal(state3.epoch, [CHUNK] * SEEDS)
  assert set(metrics3) == set(epochs["metrics"]) and metrics3["diverged"].dtype == bool
  assert all(v.shape == (CHUNK, SEEDS) for v in metrics3.values())


@pytest.mark.bit_identity
def test_a_chunk_continued_where_another_stopped_is_one_chunk_bit_for_bit(chunked):
  """A resume, in the compiled program: epochs 0-1, then epoch 2 from that state (start=2), end
  where one chunk of 3 epochs ends, bit for bit (one compiled program; start and n are
  arguments)."""
  state3, metrics3 = chunked["three"]
  state21, metrics21 = chunked["two_then_one"]
  _assert_tree_equal(state21, state3)
  _assert_tree_equal({k: v[0] for k, v in metrics21.items()},
                     {k: v[2] for k, v in metrics3.items()})


def test_chunk_rows_past_n_are_zero(chunked):
  for (_, metrics), n in ((chunked["two"], 2), (chunked["two_then_one"], 1)):
    for k, v in metrics.items():
      assert not np.any(v[n:]), k


@pytest.mark.bit_identity
def test_a_diverged_seed_stays_frozen_through_a_chunk(cfg, real, chunk_fn, chunked):
  poisoned = _poison(_fresh(cfg, real), 0)
  poisoned_agent = _host(poisoned.agent)
  stacked, _, cells = _args(cfg, real, 0)
  state, metrics = _host(chunk_fn(poisoned, stacked, _base_keys(), cells, 0, 2))
  np.testing.assert_array_equal(metrics["diverged"], [[True, False], [True, False],
                                                      [False, False]])
  np.testing.assert_array_equal(metrics["diverged/params"][:, 0], [True, False, False])
  assert not any(np.any(metrics[f"diverged/{k}"][:, 1]) for k in train_lib.DIVERGENCE_CHECKS)
  # Seed 0 kept the agent it came in with; seed 1 is bit for bit the clean chunk's seed 1.
  _assert_tree_equal(jax.tree.map(lambda x: x[0], state.agent),
                     jax.tree.map(lambda x: x[0], poisoned_agent))
  _assert_tree_equal(jax.tree.map(lambda x: x[1], state.agent),
                     jax.tree.map(lambda x: x[1], chunked["two"][0].agent))
  np.testing.assert_array_equal(state.epoch, [2, 2])
  assert np.all(np.isfinite(metrics["critic_loss"][:2, 1]))


@pytest.mark.bit_identity
def test_cells_differing_in_their_datasets_settings_train_as_their_single_programs(cfg, real,
                                                                                 chunk_fn):
  """One program over cells whose configs differ in rollout length (2 vs 1), real ratio and
  auto_alpha (train.CELL_SETTINGS, read per cell; one cell differs in all three): each cell ends
  where a plain program of its own config ends (cfg's: chunk_fn, cells 0 and 1 both of cfg), its
  ring in the first capacity(config, k) slots of the program's."""
  configs = [cfg, cfg.replace(rollout_length=1, real_ratio=0.5, auto_alpha=False)]
  per_cell = train_lib.per_cell_settings(configs)
  assert per_cell == tuple(train_lib.CELL_SETTINGS)
  assert epoch_settings(configs[1], per_cell) == epoch_settings(
      cfg.replace(rollout_length=1), per_cell)
  n = len(configs)
  keys = jax.random.split(jax.random.PRNGKey(3), n)
  one = dynamics.init_state(jax.random.PRNGKey(1), S_DIM, A_DIM, cfg)
  dyn = lambda c: jax.tree.map(lambda x: jnp.stack([x] * c), one)  # noqa: E731
  stacked = jax.tree.map(lambda x: x[None], real)
  program = cells_program.make_cells_chunk(cfg, n, 2, per_cell)       # cfg: the longest rollout
  grid, metrics = program(train_lib.init_cells(keys, cfg, real, dyn(n)), stacked, keys,
                          train_lib.make_cells(np.zeros(n), N, configs), 0, 2)
  grid, metrics = _host((grid, metrics))
  plain = {0: (chunk_fn, keys, SEEDS),
           1: (cells_program.make_cells_chunk(configs[1], 1, 2), keys[1:], 1)}
  for i, c in enumerate(configs):
    fn, k, width = plain[i]
    alone, alone_metrics = _host(fn(placement.shard_cells(train_lib.init_cells(
        k, c, real, dyn(width))), stacked, k, train_lib.make_cells(np.zeros(width), N, c), 0, 2))
    alone = jax.tree.map(lambda x: x[:1], alone)
    alone_metrics = {name: v[:2, :1] for name, v in alone_metrics.items()}
    cell = placement.resize_rings(jax.tree.map(lambda x, i=i: x[i:i + 1], grid),
                                  train_lib.capacity(c))
    assert cell.buffer.count.tolist() == alone.buffer.count.tolist()
    assert cell.buffer.ptr.tolist() == alone.buffer.ptr.tolist()
    np.testing.assert_array_equal(grid.buffer.data.reward[i, train_lib.capacity(c):], 0.0)
    # Same keys and data; the programs differ (settings traced or static, vmap widths), so XLA
    # may fuse differently. (Leaves: the configs' optimiser objects differ, static fields.)
    for a, b in zip(jax.tree.leaves(cell), jax.tree.leaves(alone), strict=True):
      np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)
    for name in ("rollout/num_added", "rollout/length", "rollout/reward", "alpha", "alpha_loss",
                 "critic_loss"):
      np.testing.assert_allclose(metrics[name][:, i], alone_metrics[name][:, 0], rtol=2e-4,
                                 atol=2e-5, err_msg=f"{name} of cell {i}")
  assert np.all(metrics["alpha"][:, 1] == np.float32(cfg.agent.alpha))
  assert np.all(metrics["alpha_loss"][:, 1] == 0.0) and np.all(metrics["alpha_loss"][:, 0] != 0.0)
  assert metrics["rollout/length"][0, 1] <= 1.0 < metrics["rollout/length"][0, 0]


@pytest.fixture(scope="module")
def looped(cfg, real):
  """The epoch from one fresh state (host copies): the 2-cell program of layout 'loop' and, per
  cell c, the one-cell program on that cell's state, key and Cell (alone[c]); `run(layout)` runs
  the 2-cell program of another layout from the same state."""
  stacked, keys, cells = _args(cfg, real, 0)
  state = _host(_fresh(cfg, real))
  run = lambda how: _host(cells_program.make_cells_epoch(cfg, SEEDS, layout=how)(  # noqa: E731
      jax.tree.map(jnp.asarray, state), stacked, keys, cells))
  ran = {"alone": [], "loop": run("loop"), "run": run}
  for c in range(SEEDS):
    ran["alone"].append(_host(cells_program.make_cells_epoch(cfg, 1)(
        jax.tree.map(jnp.asarray, _cell(state, c)), stacked, _cell(keys, c), _cell(cells, c))))
  return ran


def _cell(tree, c):
  return jax.tree.map(lambda x: x[c:c + 1], tree)


@pytest.mark.bit_identity
def test_a_looped_cell_trains_as_its_own_one_cell_program(looped):
  """cell_layout 'loop' (the CPU default): each cell of a 2-cell program ends the epoch where a
  one-cell program of that cell (its state, key and Cell) ends, state and metrics bit for bit, so a
  seed's numbers do not depend on how many seeds share its program."""
  for c in range(SEEDS):
    _assert_tree_equal(_cell(looped["loop"], c), looped["alone"][c])
  # The cells trained different things (a loop that ran cell 0 twice would not).
  assert not np.array_equal(looped["loop"][1]["critic_loss"][0],
                            looped["loop"][1]["critic_loss"][1])


def test_a_vmapped_cell_trains_as_its_own_one_cell_program_up_to_the_last_bits(looped):
  """'vmap' ends where the one-cell program ends up to the last bits (its batched ops sum in
  another order). Not marked bit_identity (a tolerance claim): tests/test_optimised.py would
  compile the vmapped program optimised for it, the largest single cost of that file."""
  vmapped = looped["run"]("vmap")
  for c in range(SEEDS):
    _assert_tree_close(_cell(vmapped, c), looped["alone"][c])
