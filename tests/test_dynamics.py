"""Dynamics ensemble: fitting, early stopping / snapshots / elites, seed vmapping, resumable
training (dynamics_training, validation); predict / step (dynamics); termination functions against
gymnasium (termination); save / load (saved_dynamics) and the reuse key (reuse)."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax.core import dynamics, termination
from mombo_jax.data.transitions import Transitions
from mombo_jax.dynamics import dynamics_training, reuse, saved_dynamics, training_data
from mombo_jax.settings import config as config_lib

# Tiny ensemble: 3 members, 2 elites, 2 x 32 hidden.
TINY = dict(dyn_hidden=(32, 32), dyn_weight_decay=(2.5e-5, 5e-5, 1e-4), dyn_members=3,
            dyn_elites=2, dyn_batch_size=128)


def _config(**kw):
  return config_lib.make_config("hopper-medium", **{**TINY, **kw})


def _hetero_data(n, seed=0):
  """1-D state, 1-D action: delta = 0.5 sin(2 s) + 0.3 a + noise with std 0.02 + 0.1 (a + 1);
  reward = s + noise with std 0.02 + 0.04 (1 + s)."""
  rng = np.random.default_rng(seed)
  s = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
  a = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
  s_std, r_std = _true_std(s, a)
  nxt = s + 0.5 * np.sin(2 * s) + 0.3 * a + s_std * rng.normal(size=(n, 1))
  r = s[:, 0] + r_std[:, 0] * rng.normal(size=n)
  return Transitions(s, a, r.astype(np.float32), nxt.astype(np.float32), np.zeros(n, np.float32))


def _true_std(s, a):
  return 0.02 + 0.1 * (a + 1), 0.02 + 0.04 * (1 + s)


@pytest.fixture(scope="module")
def fitted():
  cfg = _config(dyn_max_epochs=300, dyn_patience=10)
  data = _hetero_data(4000)
  hist = []
  dyn = dynamics_training.train_ensemble(jax.random.PRNGKey(0), data, cfg, log_fn=lambda _: None,
                                         history=hist)
  return cfg, data, dyn, hist


def test_fits_heteroscedastic_function(fitted):
  cfg, _, dyn, _ = fitted
  g = np.linspace(-0.6, 0.6, 7, dtype=np.float32)
  s, a = [x.reshape(-1, 1) for x in np.meshgrid(g, g)]
  s_mean, s_var, r_mean, r_var = dynamics.predict(dyn, jnp.asarray(s), jnp.asarray(a), cfg)
  assert s_mean.shape == (3, len(s), 1) and r_var.shape == (3, len(s))
  el = np.asarray(dyn.elites)
  s_mean, s_std = np.asarray(s_mean)[el].mean(0), np.sqrt(np.asarray(s_var)[el]).mean(0)
  r_mean, r_std = np.asarray(r_mean)[el].mean(0), np.sqrt(np.asarray(r_var)[el]).mean(0)
  true_s_std, true_r_std = _true_std(s, a)
  np.testing.assert_allclose(s_mean, s + 0.5 * np.sin(2 * s) + 0.3 * a, atol=0.06)
  np.testing.assert_allclose(r_mean, s[:, 0], atol=0.06)
  # The noise std grows ~6x (state) and ~3x (reward) across the inputs; the model must recover
  # it, not average it.
  np.testing.assert_allclose(s_std, true_s_std, rtol=0.3, atol=0.005)
  np.testing.assert_allclose(r_std, true_r_std[:, 0], rtol=0.3, atol=0.005)


def test_early_stopping_snapshots_and_elites_follow_the_rule(fitted):
  """Replays the documented rule over the recorded holdout losses: a member's snapshot is kept on
  > 1% improvement, training stops after `patience` epochs without any, elites = best losses.
  Then the returned parameters must reproduce the kept losses on the holdout split."""
  cfg, data, dyn, hist = fitted
  best = np.full(cfg.dynamics.dyn_members, 1e10)
  since, stop_epoch = 0, None
  for h in hist:
    mse = h["holdout_mse"][0]
    improved = (best - mse) / best > cfg.dynamics_training.dyn_improvement
    best = np.where(improved, mse, best)
    since = 0 if improved.any() else since + 1
    np.testing.assert_allclose(h["best"][0], best, rtol=1e-6)
    training = cfg.dynamics_training
    if since >= training.dyn_patience or h["epoch"][0] >= training.dyn_max_epochs:
      stop_epoch = h["epoch"][0]
      break
  assert stop_epoch is not None and stop_epoch == hist[-1]["epoch"][0] == len(hist)
  assert stop_epoch < cfg.dynamics_training.dyn_max_epochs    # it stopped on patience in this case
  np.testing.assert_array_equal(dyn.elites, np.argsort(best)[:cfg.dynamics.dyn_elites])
  inputs, targets = training_data.make_arrays(data)
  _, hold = training_data.split_indices(jax.random.PRNGKey(0), len(data.rewards), cfg)
  assert len(hold) == min(int(0.2 * len(data.rewards)), cfg.dynamics_training.dyn_max_holdout)
  s_mean, _, r_mean, _ = dynamics.predict(dyn, inputs[hold, :1], inputs[hold, 1:], cfg)
  pred = np.concatenate([np.asarray(s_mean) - np.asarray(inputs[hold, :1]),
                         np.asarray(r_mean)[..., None]], axis=-1)
  final = np.mean((pred - np.asarray(targets[hold])) ** 2, axis=(1, 2))
  np.testing.assert_allclose(final, best, rtol=1e-3)


def test_max_epochs(fitted):
  _, data, _, _ = fitted
  hist, lines = [], []
  # Same dyn_* fields as the fixture except dyn_max_epochs (a runtime argument): no recompilation.
  dynamics_training.train_ensemble(jax.random.PRNGKey(1), data,
                                   _config(dyn_patience=10, dyn_max_epochs=3),
                                   log_fn=lines.append, history=hist)
  assert len(hist) == 3 and len(lines) == 3 and "holdout mse" in lines[0]
  assert not hist[-1]["active"][0] and hist[-2]["active"][0]


def test_vmapped_seeds_equal_single_seed_training(fitted):
  cfg, data, _, _ = fitted
  keys = jax.random.split(jax.random.PRNGKey(3), 2)
  hist = []
  batched = dynamics_training.train_seeds(keys, data, cfg, log_fn=lambda _: None, history=hist)
  assert batched.elites.shape == (2, cfg.dynamics.dyn_elites)
  stops = [sum(h["active"][s] for h in hist) for s in range(2)]
  assert stops[0] != stops[1], "seeds should stop at different epochs to exercise the freezing"
  for i in range(2):
    single = dynamics_training.train_ensemble(keys[i], data, cfg, log_fn=lambda _: None)
    np.testing.assert_array_equal(single.elites, batched.elites[i])
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b[i], rtol=1e-4, atol=1e-5),
                 single, batched)


def test_predict_and_step_contract(fitted):
  cfg, _, dyn, _ = fitted
  dyn = dyn.replace(elites=jnp.asarray([2, 0], jnp.int32))
  b = 4000
  obs = jnp.full((b, 1), 0.3)
  act = jnp.full((b, 1), 0.5)

  @jax.jit
  def both(key):
    return (dynamics.predict(dyn, obs, act, cfg),
            dynamics.step(dyn, obs, act, key, cfg, every_member=True))

  (s_mean, s_var, r_mean, r_var), out = both(jax.random.PRNGKey(1))
  assert s_mean.shape == (3, b, 1) and s_var.shape == (3, b, 1) and r_mean.shape == (3, b)
  assert out.next_obs.shape == (b, 1) and out["reward"].shape == (b,)
  e = np.asarray(out.elite)
  assert set(np.unique(e)) == {0, 2}                    # only elites, both used
  assert abs(np.mean(e == 2) - 0.5) < 0.05
  np.testing.assert_allclose(out.next_obs_mean, np.asarray(s_mean)[e, 0], rtol=1e-6)
  np.testing.assert_allclose(out.reward_var, np.asarray(r_var)[e, 0], rtol=1e-6)
  for m in (0, 2):   # samples follow the chosen elite's Gaussian
    rows = e == m
    np.testing.assert_allclose(np.std(np.asarray(out.next_obs)[rows], 0),
                               np.sqrt(np.asarray(s_var)[m, 0]), rtol=0.1)
    np.testing.assert_allclose(np.mean(np.asarray(out.reward)[rows]), r_mean[m, 0],
                               atol=0.15 * np.sqrt(r_var[m, 0]))
  # every_member: every member's Gaussians come back as predict gives them.
  for got, want in zip(out.ensemble, (s_mean, s_var, r_mean, r_var)):
    np.testing.assert_allclose(got, want, rtol=1e-6)
  with pytest.raises(ValueError, match="state dims"):
    dynamics.predict(dyn, jnp.zeros((2, 3)), jnp.zeros((2, 1)), cfg)


def test_init_state_shapes():
  cfg = _config()
  dyn = jax.eval_shape(lambda k: dynamics.init_state(k, 11, 3, cfg), jax.random.PRNGKey(0))
  assert dyn.params["members"]["layer_0"]["kernel"].shape == (3, 14, 32)
  assert dyn.params["members"]["out"]["kernel"].shape == (3, 32, 24)
  assert dyn.params["max_logvar"].shape == (12,) and dyn.elites.shape == (2,)


def test_save_load_round_trip(fitted, tmp_path):
  cfg, data, dyn, _ = fitted
  seeds = jax.tree.map(lambda x: jnp.stack([x, x]), dyn)
  for name, d in (("two", seeds), ("one", dyn)):
    saved_dynamics.save(str(tmp_path / name), d, cfg)
    loaded, meta = saved_dynamics.load(str(tmp_path / name))
    assert isinstance(loaded, dynamics.DynamicsState) and loaded.elites.dtype == jnp.int32
    jax.tree.map(np.testing.assert_array_equal, d, loaded)
    assert meta["obs_dim"] == 1 and meta["action_dim"] == 1
    assert meta["num_seeds"] == (None if name == "one" else 2)
    assert saved_dynamics.config_overrides(meta)["dyn_hidden"] == cfg.dynamics.dyn_hidden
  obs, act = jnp.asarray(data.observations[:5]), jnp.asarray(data.actions[:5])
  cfg2 = config_lib.make_config("hopper-medium", **saved_dynamics.config_overrides(meta))
  np.testing.assert_array_equal(dynamics.predict(loaded, obs, act, cfg2)[0][0],
                                dynamics.predict(dyn, obs, act, cfg)[0][0])
  with pytest.raises(Exception, match="exists"):
    saved_dynamics.save(str(tmp_path / "one"), dyn, cfg)


def _legacy_save(path, dyn, cfg, **meta_changes):
  """Writes dyn as dynamics.save did before saved_dynamics: a plain dict tree, metadata with the
  reuse key under "identity"; meta_changes: None drops a field, anything else sets it."""
  from mombo_jax.storage import checkpoint
  meta = dict(dyn_members=cfg.dynamics.dyn_members, dyn_elites=cfg.dynamics.dyn_elites,
              dyn_hidden=list(cfg.dynamics.dyn_hidden),
              dyn_weight_decay=list(cfg.dynamics_training.dyn_weight_decay),
              dyn_max_logvar_init=cfg.dynamics.dyn_max_logvar_init,
              dyn_min_logvar_init=cfg.dynamics.dyn_min_logvar_init, obs_dim=3, action_dim=2,
              num_seeds=2, env=cfg.env, kind="mombo_jax.dynamics", identity={"seed": 0})
  meta = {k: v for k, v in {**meta, **meta_changes}.items() if v is not None}
  tree = {"params": dyn.params, "input_mean": dyn.input_mean, "input_std": dyn.input_std,
          "elites": dyn.elites}
  checkpoint.save_pytree(str(path), jax.device_get(tree), meta, kind="dynamics")


def test_load_restores_earlier_saves_against_a_typed_template(tmp_path):
  """Saves written before the split load as a DynamicsState (seed axis from num_seeds); metadata
  that cannot build the template, or that disagrees with the arrays, is refused in one error."""
  from mombo_jax.storage import checkpoint
  cfg = _config()
  dyn = jax.vmap(lambda k: dynamics.init_state(k, 3, 2, cfg))(jax.random.split(
      jax.random.PRNGKey(0), 2))
  dyn = dyn.replace(input_mean=dyn.input_mean + 0.5, elites=jnp.asarray([[2, 0], [1, 2]]))
  _legacy_save(tmp_path / "old", dyn, cfg)
  loaded, meta = saved_dynamics.load(str(tmp_path / "old"))
  assert isinstance(loaded, dynamics.DynamicsState) and isinstance(loaded.elites, jax.Array)
  assert loaded.elites.dtype == jnp.int32
  jax.tree.map(np.testing.assert_array_equal, dyn, loaded)
  assert reuse.reuse_mismatch(meta, {"seed": 0}) == {}

  _legacy_save(tmp_path / "no_dims", dyn, cfg, obs_dim=None, dyn_hidden=None)
  with pytest.raises(checkpoint.CheckpointError, match="lacks dyn_hidden, obs_dim"):
    saved_dynamics.load(str(tmp_path / "no_dims"))
  _legacy_save(tmp_path / "wrong_dims", dyn, cfg, obs_dim=4, action_dim=1)
  with pytest.raises(checkpoint.TemplateMismatchError):
    saved_dynamics.load(str(tmp_path / "wrong_dims"))
  _legacy_save(tmp_path / "other", dyn, cfg, kind=None)
  with pytest.raises(checkpoint.CheckpointError, match="does not hold a dynamics ensemble"):
    saved_dynamics.load(str(tmp_path / "other"))
  with pytest.raises(checkpoint.CheckpointError, match="No dynamics ensemble saved"):
    saved_dynamics.load(str(tmp_path / "missing"))
  assert not (tmp_path / "missing").exists()


def test_bad_input_errors():
  cfg = _config()
  data = _hetero_data(3)
  with pytest.raises(ValueError, match="too few"):
    dynamics_training.train_ensemble(jax.random.PRNGKey(0), data, cfg, log_fn=lambda _: None)
  with pytest.raises(ValueError, match="termination"):
    termination.termination_fn("ant")
  for name in ("hopper", "hopper-medium-replay", "Hopper-v5", "mujoco/hopper/medium-v0"):
    assert termination.termination_fn(name) is termination.termination_fn("hopper")


# ----------------------------------------------------------------------------------------------
# Termination functions against gymnasium's own `terminated`.

def _gym_env(env_id):
  import gymnasium as gym
  return gym.make(env_id).unwrapped          # no TimeLimit / order checks: we step past the end


def _random_rollouts(env, episodes, steps, extra, seed):
  """Random-action rollouts that continue `extra` steps past termination (so unhealthy states are
  included). Returns obs, act, next_obs, terminated, qvel_ok (|qvel| < 100: see below)."""
  rng = np.random.default_rng(seed)
  rows = []
  for ep in range(episodes):
    obs, _ = env.reset(seed=seed + ep)
    after = 0
    for _ in range(steps):
      act = rng.uniform(-1, 1, env.action_space.shape).astype(np.float32)
      nxt, _, term, _, _ = env.step(act)
      rows.append((obs, act, nxt, term, np.all(np.abs(env.data.qvel) < 100)))
      obs = nxt
      after += bool(term) or after > 0
      if after > extra:
        break
  return [np.asarray(x) for x in zip(*rows)]


def _probe_states(env, n, seed, z_range, angle_range):
  """States set directly around the healthy bounds: obs from _get_obs and gymnasium's is_healthy."""
  rng = np.random.default_rng(seed)
  obs, healthy = [], []
  for _ in range(n):
    qpos = env.init_qpos + rng.normal(0, 0.1, env.model.nq)
    qpos[1] = rng.uniform(*z_range)
    qpos[2] = rng.uniform(*angle_range)
    qvel = rng.normal(0, 3, env.model.nv)
    env.set_state(qpos, qvel)
    obs.append(env._get_obs())
    healthy.append(env.is_healthy)
  return np.asarray(obs), np.asarray(healthy)


def _check(env_name, obs, act, nxt, gym_done):
  fn = jax.jit(termination.termination_fn(env_name))
  ours = np.asarray(fn(jnp.asarray(obs, jnp.float32), jnp.asarray(act, jnp.float32),
                       jnp.asarray(nxt, jnp.float32)))
  assert ours.dtype == bool and ours.shape == gym_done.shape
  bad = np.flatnonzero(ours != gym_done)
  assert bad.size == 0, f"{env_name}: {bad.size} disagreements, e.g. next_obs {nxt[bad[:3]]}"


@pytest.mark.parametrize("env_name,env_id,z_range,angle_range", [
    ("hopper", "Hopper-v5", (0.6, 0.8), (-0.3, 0.3)),
    ("walker2d", "Walker2d-v5", (0.7, 2.1), (-1.2, 1.2)),
    ("halfcheetah", "HalfCheetah-v5", None, None),
])
def test_termination_matches_gymnasium(env_name, env_id, z_range, angle_range):
  env = _gym_env(env_id)
  obs, act, nxt, term, qvel_ok = _random_rollouts(env, episodes=8, steps=150, extra=15, seed=0)
  # Hopper's gymnasium check reads the unclipped qvel, but the observation clips velocities at
  # +-10, so |qvel| >= 100 is invisible in obs; such (rare) steps are excluded, and counted.
  assert qvel_ok.mean() > 0.95
  obs, act, nxt, term = obs[qvel_ok], act[qvel_ok], nxt[qvel_ok], term[qvel_ok]
  if env_name != "halfcheetah":
    assert 0 < term.sum() < len(term)     # both outcomes occur, so the comparison means something
  _check(env_name, obs, act, nxt, term)
  if z_range is not None:
    p_obs, healthy = _probe_states(env, 400, 1, z_range, angle_range)
    assert 0.2 < healthy.mean() < 0.8
    zeros = np.zeros((len(p_obs), env.action_space.shape[0]))
    _check(env_name, p_obs, zeros, p_obs, ~healthy)
  env.close()


def test_termination_of_non_finite_and_far_states():
  hop = termination.termination_fn("hopper-medium")
  ok = np.array([1.2, 0.0] + [0.0] * 9, np.float32)
  rows = np.stack([ok, ok, ok, ok, ok])
  rows[1, 5] = np.nan
  rows[2, 7] = -100.0        # hopper's lower state bound (the reference code misses it)
  rows[3, 0] = np.inf
  rows[4, 3] = 99.0
  done = np.asarray(hop(None, None, jnp.asarray(rows)))
  np.testing.assert_array_equal(done, [False, True, True, True, False])
  cheetah = termination.termination_fn("halfcheetah")
  done = cheetah(None, None, jnp.asarray([[1e3] * 17, [np.nan] * 17], jnp.float32))
  np.testing.assert_array_equal(done, [False, True])


@pytest.mark.slow
def test_train_dynamics_cli(tmp_path, monkeypatch):
  """experiments.train_dynamics' work (pretrain.train_dynamics) end to end on a tiny
  in-memory dataset (no Minari, no network)."""
  from mombo_jax.data import provenance, transitions as transitions_lib
  from mombo_jax.dynamics import pretrain
  from mombo_jax.errors import UserError
  rng = np.random.default_rng(0)
  n, s, a = 300, 11, 3
  obs = rng.normal(size=(n, s)).astype(np.float32)
  fake = Transitions(obs, rng.uniform(-1, 1, (n, a)).astype(np.float32),
                     rng.normal(size=n).astype(np.float32), obs + 0.1, np.zeros(n, np.float32))
  asked = []
  monkeypatch.setattr(transitions_lib, "load_transitions",
                      lambda name, **_: asked.append(name) or fake)
  lines = []
  job = pretrain.DynamicsJob(env="hopper-medium", seeds=2, seed=3, max_epochs=2, preset="tiny")
  path = pretrain.train_dynamics(job, workdir=str(tmp_path), log_fn=lines.append)
  run_config = config_lib.make_config("hopper-medium", "mombo", "tiny", seed=3, num_seeds=2)
  assert asked == ["hopper-medium"]
  assert path == reuse.dynamics_path(str(tmp_path), run_config)    # where the run looks
  assert sum("dynamics epoch" in line for line in lines) == 2
  dyn, meta = saved_dynamics.load(path)
  assert meta["num_seeds"] == 2 and meta["obs_dim"] == s and meta["action_dim"] == a
  assert dyn.elites.shape == (2, 2) and dyn.input_mean.shape == (2, s + a)
  # Saved with the reuse key experiments.run checks before reusing them (same preset and seeds).
  expected = reuse.reuse_key(run_config, fake,
                             provenance.dataset_identity("hopper-medium", fake))
  assert reuse.reuse_mismatch(meta, expected) == {}
  assert not os.path.exists(path + ".partial")
  with pytest.raises(UserError, match="already exists"):
    pretrain.train_dynamics(pretrain.DynamicsJob(env="hopper-medium", seeds=2, seed=3,
                                                 preset="tiny"),
                            workdir=str(tmp_path), log_fn=lines.append)
  with pytest.raises(UserError, match="Valid names"):
    pretrain.train_dynamics(pretrain.DynamicsJob(env="hopper-mediocre"), workdir=str(tmp_path))


def test_interrupted_training_resumes_to_the_same_ensemble(fitted, tmp_path):
  """should_stop -> checkpoint + Interrupted; the same call resumes and ends bit for bit where an
  uninterrupted call ends (same compiled functions, same machine). Another reuse key is refused."""
  from mombo_jax.storage import checkpoint
  _, data, _, _ = fitted
  cfg = _config(dyn_patience=10, dyn_max_epochs=6, dyn_checkpoint_every_s=0.0)
  keys = jax.random.split(jax.random.PRNGKey(4), 2)
  quiet = lambda _: None  # noqa: E731
  whole = dynamics_training.train_seeds(keys, data, cfg, log_fn=quiet)
  ident = {"dataset": "test/hetero-v0", "fingerprint": "abc"}
  epochs = []                       # one log line per finished epoch: stop after the second

  ckpt_dir = str(tmp_path / "partial")
  with pytest.raises(dynamics_training.DynamicsTrainingStopped) as info:
    dynamics_training.train_seeds(keys, data, cfg, log_fn=epochs.append, checkpoint_dir=ckpt_dir,
                                  should_stop=lambda: len(epochs) == 2, reuse_key=ident)
  assert info.value.epoch == 2 and not info.value.mid_epoch
  with pytest.raises(checkpoint.CheckpointError, match="fingerprint"):
    dynamics_training.train_seeds(keys, data, cfg, log_fn=quiet, checkpoint_dir=ckpt_dir,
                                  reuse_key=dict(ident, fingerprint="other"))
  lines = []
  resumed = dynamics_training.train_seeds(keys, data, cfg, log_fn=lines.append,
                                          checkpoint_dir=ckpt_dir, reuse_key=ident)
  assert "resumed" in lines[0] and "epoch 2" in lines[0]
  assert len(lines) == 1 + 4        # the resume line, then epochs 3..6 only
  jax.tree.map(np.testing.assert_array_equal, whole, resumed)


def test_saved_identity_is_checked(fitted, tmp_path):
  cfg, data, dyn, _ = fitted
  ident = reuse.reuse_key(cfg, data, {"dataset": "test/hetero-v0", "fingerprint": "abc"})
  assert ident["dyn_members"] == 3 and ident["obs_dim"] == 1
  saved_dynamics.save(str(tmp_path / "d"), dyn, cfg, reuse_key=ident)
  _, meta = saved_dynamics.load(str(tmp_path / "d"))
  assert reuse.reuse_mismatch(meta, ident) == {}
  seven = reuse.reuse_key(cfg.replace(dyn_members=7, dyn_elites=5), data,
                                   {"dataset": "test/hetero-v0", "fingerprint": "abc"})
  assert reuse.reuse_mismatch(meta, seven) == {"dyn_members": (3, 7), "dyn_elites": (2, 5)}
  assert "fingerprint" in reuse.reuse_mismatch(meta, dict(ident, fingerprint="zzz"))
  # A save from before reuse keys were recorded matches nothing.
  assert set(reuse.reuse_mismatch({}, ident)) == set(ident)


def test_training_config_keeps_the_algorithm():
  """The training cache key keeps algo and target: MOPO with one elite is a valid run (only
  MOMBO's elite_spread needs two), so its dynamics training must not be refused."""
  cfg = config_lib.make_config("hopper-medium", "mopo", "tiny", dyn_elites=1)
  assert dynamics_training._dyn_config(cfg).dynamics.dyn_elites == 1
  assert dynamics_training._dyn_config(cfg) == dynamics_training._dyn_config(
      cfg.replace(dyn_max_epochs=7, beta=3.0))


def test_flat_clamp_predictions_equal_the_plain_clamp():
  """predict's soft clamp on the flat log-variance (flat_clamp, #29: vectorised on XLA:CPU) gives
  the plain module's values bit for bit, vmapped over seeds as the training epoch runs it."""
  config = config_lib.Config().replace(dyn_hidden=(16, 16), dyn_members=3, dyn_elites=2,
                                       dyn_weight_decay=(1e-5, 1e-5, 1e-5))
  rng = np.random.default_rng(0)
  obs = jnp.asarray(rng.normal(size=(64, 11)), jnp.float32)
  act = jnp.asarray(rng.uniform(-1, 1, (64, 3)), jnp.float32)
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  dyn = jax.vmap(lambda k: dynamics.init_state(k, 11, 3, config))(keys)
  # Spread the log-variances over both bounds of the clamp.
  dyn = dyn.replace(params=jax.tree.map(lambda p: 4.0 * p, dyn.params))

  def plain(d):
    x = (jnp.concatenate([obs, act], -1) - d.input_mean) / d.input_std
    mean, logvar = dynamics.apply(config, d.params, jnp.broadcast_to(x, (3,) + x.shape))
    return mean, jnp.exp(logvar)

  def flat(d):
    x = (jnp.concatenate([obs, act], -1) - d.input_mean) / d.input_std
    mean, logvar = dynamics.apply(config, d.params, jnp.broadcast_to(x, (3,) + x.shape),
                                  flat_clamp=True)
    return mean, jnp.exp(logvar)

  want, got = jax.jit(jax.vmap(plain))(dyn), jax.jit(jax.vmap(flat))(dyn)
  for w, g in zip(want, got):
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
  assert np.ptp(np.log(np.asarray(got[1]))) > 5.0      # the clamp's both sides are exercised
