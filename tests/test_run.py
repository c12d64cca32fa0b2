"""End-to-end runs of experiments.run.train on a tiny locally built dataset (CI-sized), plus the
properties the training loop promises: seeds vmapped = seeds run alone, kill-and-resume = one run,
and the moment-matching critic at zero variance = the plain critic inside the update."""
import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mombo_jax import buffer, checkpoint, config as config_lib, data, dynamics, sac, targets
from mombo_jax import train as train_lib

DATASET = "hopper-random"
TINY = dict(epochs=2, steps_per_epoch=5, rollout_batch_size=32, eval_every=1, eval_episodes=1)


@pytest.fixture(scope="module")
def dataset(minari_root):
  from experiments import collect
  collect.build_random(DATASET, steps=2000, seed=0, log_fn=lambda *a: None)
  return DATASET


@pytest.fixture(scope="module")
def dyn_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("dynamics"))


def _config(algo="mombo", **kw):
  return config_lib.make_config(DATASET, algo, preset="tiny", **{**TINY, **kw})


def _final_params(workdir):
  ckpt = checkpoint.RunCheckpointer(os.path.join(workdir, "checkpoints"))
  tree, _ = checkpoint.load_pytree(ckpt.path(ckpt.latest_step()))
  return tree


@pytest.fixture(scope="module")
def mombo_run(dataset, dyn_dir, tmp_path_factory):
  """One uninterrupted 2-seed MOMBO run, shared by the end-to-end and resume tests."""
  from experiments import run
  workdir = tmp_path_factory.mktemp("mombo_run")
  return workdir, run.train(_config("mombo", num_seeds=2), dataset, str(workdir),
                            dynamics_dir=dyn_dir)


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["mombo", "mobile", "mopo"])
def test_end_to_end(dataset, dyn_dir, tmp_path, algo, request):
  from experiments import run
  config = _config(algo, num_seeds=2)
  if algo == "mombo":
    tmp_path, summary = request.getfixturevalue("mombo_run")
  else:
    summary = run.train(config, dataset, str(tmp_path), dynamics_dir=dyn_dir)
  assert summary["seeds"] == [0, 1]
  assert len(summary["final_normalized_score"]) == 2
  assert np.all(np.isfinite(summary["aulc"]))
  with open(tmp_path / "metrics.csv") as f:
    rows = f.read().strip().splitlines()
  assert len(rows) == 1 + config.epochs * 2        # header + one row per seed per evaluation
  assert "critic_loss" in rows[0] and "normalized_score" in rows[0]
  assert (tmp_path / "learning_curve.png").stat().st_size > 0
  assert json.loads((tmp_path / "summary.json").read_text())["seeds"] == [0, 1]


@pytest.mark.slow
def test_kill_and_resume_equals_uninterrupted(dataset, dyn_dir, tmp_path, mombo_run):
  from experiments import run
  straight, _ = mombo_run
  config = _config("mombo", num_seeds=2)
  assert run.train(config, dataset, str(tmp_path), dynamics_dir=dyn_dir, stop_after=1) is None
  with open(tmp_path / "metrics.csv") as f:
    assert len(f.read().strip().splitlines()) == 1 + 1 * 2
  # Resumed at epoch 1, one more epoch finishes the run: a run that restarted from scratch would
  # stop again after its first epoch and return None.
  summary = run.train(config, dataset, str(tmp_path), dynamics_dir=dyn_dir, stop_after=1)
  assert summary is not None
  jax.tree.map(np.testing.assert_array_equal, _final_params(str(straight)),
               _final_params(str(tmp_path)))
  with open(tmp_path / "metrics.csv") as f:
    assert len(f.read().strip().splitlines()) == 1 + 2 * 2
  assert summary["epochs"] == [1, 2]


def test_changed_config_refuses_workdir(dataset, dyn_dir, tmp_path):
  from experiments import run
  (tmp_path / "config.json").write_text(json.dumps({"beta": 123.0}))
  with pytest.raises(run.UserError, match="another config"):
    run.train(_config("mombo"), dataset, str(tmp_path), dynamics_dir=dyn_dir)


def test_missing_dataset_names_the_command(minari_root, tmp_path):
  from experiments import run
  with pytest.raises(run.UserError, match="experiments.collect"):
    run.train(_config("mombo"), "walker2d-medium-replay", str(tmp_path))


@pytest.fixture(scope="module")
def tiny_setup(dataset):
  real = buffer.from_transitions(data.load_transitions(dataset))
  config = _config("mombo")
  keys = jax.random.split(jax.random.PRNGKey(0), 2)
  dyn = jax.vmap(lambda k: dynamics.init_state(k, real.obs.shape[1], real.action.shape[1],
                                               config))(keys)
  return config, real, keys, dyn


@pytest.mark.slow
def test_vmapped_seeds_equal_single_seed_runs(tiny_setup):
  config, real, keys, dyn = tiny_setup
  epoch = train_lib.make_seeds_epoch(config)
  fresh = lambda tree: jax.tree.map(jnp.copy, tree)  # noqa: E731  (the state is donated)
  both = train_lib.init_seeds(keys, config, real, fresh(dyn))
  one = train_lib.init_seeds(keys[1:], config, real, fresh(jax.tree.map(lambda x: x[1:], dyn)))
  epoch_keys = jax.random.split(jax.random.PRNGKey(1), 2)
  for _ in range(2):
    both, _ = epoch(both, real, epoch_keys)
    one, _ = epoch(one, real, epoch_keys[1:])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a[1], b[0], rtol=1e-5, atol=1e-6),
               both.agent, one.agent)
  # The two seeds did not train the same thing.
  assert not np.allclose(both.agent.actor.params["params"]["Dense_0"]["kernel"][0],
                         both.agent.actor.params["params"]["Dense_0"]["kernel"][1])


def test_mm_critic_at_zero_variance_matches_plain_update(tiny_setup):
  """With zero state variance the MOMBO actor update (MM mean) equals the plain-Q actor update."""
  config, real, keys, dyn = tiny_setup
  plain_cfg = dataclasses.replace(config, algo="mobile")
  agent = sac.init_agent(keys[0], real.obs.shape[1], real.action.shape[1], config, total_steps=10)
  batch = jax.tree.map(lambda x: x[:32], real)
  assert float(jnp.abs(batch.obs_var).max()) == 0.0
  target_fn = lambda ag, b, k: (b.reward, {})  # noqa: E731
  update = jax.jit(sac.update, static_argnums=(3, 4))
  mm_agent, mm_m = update(agent, batch, keys[1], target_fn, config)
  pl_agent, pl_m = update(agent, batch, keys[1], target_fn, plain_cfg)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               mm_agent.actor.params, pl_agent.actor.params)
  np.testing.assert_allclose(mm_m["actor_loss"], pl_m["actor_loss"], rtol=1e-6)
  # And with state variance the MM actor loss differs (the switch is live).
  noisy = batch.replace(obs_var=jnp.full_like(batch.obs_var, 0.5))
  _, noisy_m = update(agent, noisy, keys[1], target_fn, config)
  assert abs(float(noisy_m["actor_loss"]) - float(mm_m["actor_loss"])) > 1e-4
