"""The env a dataset's policies meet (envs.eval_env_spec): an import of D4RL's walker file records
D4RL's v2 walker model (right-foot friction 0.9) in its metadata, and evaluation (in this process
and in env_pool's workers, and for each run of a launch), Table 2's real transitions and
rendering build it; the datasets this project builds keep v5's model (1.9); an import that
records none is inferred from its provenance, with one warning naming the re-import."""
import dataclasses
import json
import os
import shutil
import warnings

import mujoco
import numpy as np
import pytest

from mombo_jax.collection import cards, dataset_writer, recording
from mombo_jax.data import minari_io
from mombo_jax.env import envs, evaluate
from mombo_jax.settings.config import make_config
from tests.test_import_d4rl import _simulate, _write_d4rl

IMPORTED = "test-eval/walker2d/medium-v2"
SELF_BUILT = "test-eval/walker2d/self-v0"


def _friction(env) -> float:
  """model.geom_friction of the walker's right foot (geom `foot_geom`), read directly."""
  model = env.unwrapped.model
  return float(model.geom_friction[mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM,
                                                     "foot_geom"), 0])


@pytest.fixture(scope="module")
def datasets(minari_root, tmp_path_factory):
  """A tiny D4RL-style walker2d file imported as IMPORTED, and SELF_BUILT, episodes written the
  way the collector writes them (no eval env given: v5)."""
  from mombo_jax.collection import d4rl
  path = _write_d4rl(tmp_path_factory.mktemp("d4rl") / "walker2d_medium-v2.hdf5",
                     _simulate("walker2d", rows=120))
  d4rl.import_file(path, "walker2d-medium", IMPORTED, d4rl.ImportOptions(overwrite=True),
                   log_fn=lambda *_: None)
  episodes = recording.rollout(lambda: envs.make_env("walker2d", max_episode_steps=20),
                               lambda obs: np.zeros((len(obs), 6), np.float32), 20, seed=0)
  dataset_writer.write_dataset(SELF_BUILT, episodes, dataset_writer.DatasetMetadata(
      "tiny", "zeros", env_name="walker2d"), overwrite=True)
  return IMPORTED, SELF_BUILT


def test_an_import_records_d4rls_walker_and_evaluation_builds_it(datasets):
  recorded = json.loads(minari_io.local_metadata(IMPORTED)[envs.EVAL_ENV_KEY])
  assert recorded == envs.d4rl_env_spec("walker2d")
  assert recorded["kwargs"] == {"xml_file": "walker2d.xml"} and recorded["model"] == "walker2d.xml"
  assert recorded["right_foot_friction"] == 0.9
  assert envs.eval_env_spec(IMPORTED) == recorded
  for name, want in ((IMPORTED, 0.9), (SELF_BUILT, 1.9), ("walker2d-medium", 1.9),
                     ("walker2d", 1.9)):
    env = envs.make_env(name)
    try:
      assert _friction(env) == pytest.approx(want), name
    finally:
      env.close()
  assert envs.EVAL_ENV_KEY not in minari_io.local_metadata(SELF_BUILT)
  # Minari's own recovery of the eval env agrees (the import stored the spec with its model).
  env = minari_io.load_dataset(IMPORTED).recover_environment(eval_env=True)
  assert _friction(env) == pytest.approx(0.9)
  env.close()
  assert "(evaluated in Walker2d-v5 in D4RL's v2 model (walker2d.xml): right-foot friction 0.9)" \
      in cards.card_text(IMPORTED)
  assert "walker2d_v5.xml): right-foot friction 1.9)" in cards.card_text(SELF_BUILT)


def _actor(num_seeds, seed=0, hidden=8):
  """Random actor variables [S, ...] (numpy) for walker2d: kernels ~ N(0, 1 / fan_in)."""
  rng = np.random.default_rng(seed)
  ins, outs = [17, hidden, hidden], [hidden, 6, 6]
  return {"params": {f"Dense_{i}": dict(
      kernel=rng.normal(0.0, a ** -0.5, (num_seeds, a, b)).astype(np.float32),
      bias=rng.normal(0.0, 0.1, (num_seeds, b)).astype(np.float32))
      for i, (a, b) in enumerate(zip(ins, outs))}}


def test_evaluation_and_its_worker_processes_step_the_datasets_physics(datasets):
  """Returns of the imported dataset's Evaluator, in this process and over 2 worker processes
  (env_pool), are those of D4RL's walker model and not of v5's; the self-built dataset's are
  v5's."""
  config = make_config("walker2d-medium", preset="tiny", actor_hidden=(8,))
  params, horizon = _actor(2), 60

  def returns(name, workers):
    with evaluate.Evaluator(config, name, 2, 2, max_episode_steps=horizon,
                            workers=workers) as e:
      assert e.workers == workers
      return e.run(params, seed=3)

  v2 = returns(envs.d4rl_env_spec("walker2d"), 1)
  v5 = returns("walker2d", 1)
  assert not np.allclose(v2, v5)                  # the friction shows in 60 steps
  np.testing.assert_array_equal(returns(IMPORTED, 1), v2)
  np.testing.assert_array_equal(returns(IMPORTED, 2), v2)
  np.testing.assert_array_equal(returns(SELF_BUILT, 2), v5)


def test_each_run_of_a_launch_is_evaluated_in_its_datasets_env(datasets):
  """evaluation.build_evaluators gives runs of datasets with other physics their own Evaluator
  (and shares one between runs of the same)."""
  from types import SimpleNamespace

  from mombo_jax.run import evaluation
  config = make_config("walker2d-medium", preset="tiny", actor_hidden=(8,), num_seeds=1,
                       eval_episodes=1)
  runs = [SimpleNamespace(spec=SimpleNamespace(dataset=d), config=config, evaluator=None)
          for d in (IMPORTED, SELF_BUILT, "walker2d-medium", IMPORTED)]
  evaluation.build_evaluators(runs, workers=1)
  try:
    assert runs[0].evaluator is runs[3].evaluator and runs[1].evaluator is runs[2].evaluator
    assert runs[0].evaluator is not runs[1].evaluator
    for r, want in ((runs[0], 0.9), (runs[1], 1.9)):
      assert r.evaluator.pool.num_envs == 2
      assert {_friction(env) for env in r.evaluator.pool._local.envs} == {want}
  finally:
    for r in runs:
      r.evaluator.close()


def test_table2_and_rendering_meet_the_datasets_env(datasets, monkeypatch, tmp_path):
  """quantifier_quality.real_transitions and render.render build the env of the dataset (a policy
  loaded from a run records it; an older policy file is resolved from its dataset)."""
  from mombo_jax.analysis import quantifier_quality, render
  seen = []

  def fake_run_episodes(make_env, policy, episodes, seed):
    env = make_env()
    seen.append(_friction(env))
    env.close()
    return []

  monkeypatch.setattr(envs, "run_episodes", fake_run_episodes)
  for name in (IMPORTED, SELF_BUILT):
    quantifier_quality.real_transitions(None, name, episodes=1, seed=0)
  assert seen == [0.9, 1.9]

  class Stop(Exception):
    pass

  def fake_render_env(name, width, height):
    env = envs.make_env(name)
    seen.append(_friction(env))
    env.close()
    raise Stop

  monkeypatch.setattr(render, "make_render_env", fake_render_env)
  policy = _PolicyFields(dataset=IMPORTED, eval_env=None)
  for p, want in ((policy, 0.9), (dataclasses.replace(policy, dataset=SELF_BUILT), 1.9),
                  (dataclasses.replace(policy, dataset="walker2d-medium",
                                       eval_env=envs.d4rl_env_spec("walker2d")), 0.9)):
    del seen[:]
    with pytest.raises(Stop):
      render.render(p, str(tmp_path / "out.gif"), log=lambda *_: None)
    assert seen == [want]


@dataclasses.dataclass
class _PolicyFields:
  """What render.render reads of a policy before it renders (policy.Policy's fields)."""
  dataset: str
  eval_env: dict = None


def test_an_import_without_the_record_is_inferred_with_one_warning(datasets, monkeypatch):
  """A D4RL import written before the eval env was recorded (no EVAL_ENV_KEY) is evaluated in
  D4RL's walker model, inferred from its provenance, with one warning naming the re-import; a
  `d4rl/` id that is not local is inferred from the id."""
  monkeypatch.setattr(envs, "_warned", set())
  old = "test-eval/walker2d/old-v2"
  src = os.path.join(minari_io.datasets_root(), IMPORTED)
  dst = os.path.join(minari_io.datasets_root(), old)
  shutil.copytree(src, dst, dirs_exist_ok=True)
  meta_path = os.path.join(dst, "data", "metadata.json")
  with open(meta_path) as f:
    meta = json.load(f)
  meta.pop(envs.EVAL_ENV_KEY)
  meta["dataset_id"] = old
  with open(meta_path, "w") as f:
    json.dump(meta, f)
  with pytest.warns(UserWarning, match=rf"Dataset {old} records no evaluation env .* Walker2d-v5 "
                    r"in D4RL's v2 model \(walker2d.xml\): right-foot friction 0.9; re-import it "
                    r"to record it: python -m experiments.import_d4rl --file="):
    spec = envs.eval_env_spec(old)
  assert spec == envs.d4rl_env_spec("walker2d")
  with warnings.catch_warnings():
    warnings.simplefilter("error")                # once per dataset
    env = envs.make_env(old)
  assert _friction(env) == pytest.approx(0.9)
  env.close()
  with pytest.warns(UserWarning, match="d4rl/walker2d/medium-replay-v2 records no evaluation"):
    assert envs.eval_env_spec("d4rl/walker2d/medium-replay-v2")["right_foot_friction"] == 0.9
  # Another env's import has v5's model: nothing to infer, nothing to warn about.
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert envs.eval_env_spec("d4rl/hopper/medium-v2") == envs.d4rl_env_spec("hopper")
    assert envs.d4rl_env_spec("hopper")["kwargs"] == {}


def test_a_spec_whose_model_does_not_match_is_refused():
  from mombo_jax.errors import UserError
  spec = dict(envs.d4rl_env_spec("walker2d"), right_foot_friction=1.3)
  with pytest.raises(UserError, match="right-foot friction is 0.9, not 1.3"):
    envs.make_env(spec)
