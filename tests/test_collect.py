"""Dataset building (mombo_jax.collection.recipes, behind experiments.collect): recipes on tiny
budgets, written as real Minari datasets, read back; the robust medium point; saved actors and
datasets rebuilt from them (--from_actors)."""
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from xml.etree import ElementTree

import numpy as np
import pytest

from mombo_jax import errors
from mombo_jax.collection import online_sac, options, recipes, recording, sac_run, saved_actors
from mombo_jax.core import actor_policy
from mombo_jax.data import minari_io, provenance, scores, transitions as transitions_lib
from mombo_jax.env import envs
from tests.conftest import HANG_S, minari_root_at

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  """A fresh MINARI_DATASETS_PATH for this module (other tests may build the same names)."""
  with minari_root_at(tmp_path_factory.mktemp("minari_collect")) as path:
    yield path


def _check_chaining(t, episodes):
  ends = np.concatenate([ep["terminations"] | ep["truncations"] for ep in episodes])
  chained = np.all(t.next_observations[:-1] == t.observations[1:], axis=1)
  np.testing.assert_array_equal(chained[~ends[:-1]], True)


def test_rollout_counts_and_cuts():
  episodes = recording.rollout(lambda: envs.make_env("hopper-random", max_episode_steps=7),
                               recording.random_policy(3, 0), 40, seed=0, num_envs=3)
  assert sum(len(ep["rewards"]) for ep in episodes) == 40
  for ep in episodes:
    n = len(ep["rewards"])
    assert ep["observations"].shape == (n + 1, 11) and ep["actions"].shape == (n, 3)
    assert n <= 7
    assert ep["terminations"][-1] or ep["truncations"][-1]  # every episode is closed
    assert not (ep["terminations"][:-1] | ep["truncations"][:-1]).any()


def test_replay_episodes():
  n = 6
  replay = dict(obs=np.arange(n, dtype=np.float32)[:, None], action=np.zeros((n, 1), np.float32),
                reward=np.ones(n, np.float32),
                next_obs=np.arange(1, n + 1, dtype=np.float32)[:, None],
                terminated=np.array([0, 1, 0, 0, 0, 0], np.float32),
                end=np.array([0, 1, 0, 1, 0, 0], np.float32))
  eps = recording.replay_episodes(replay)
  assert [len(e["rewards"]) for e in eps] == [2, 2, 2]
  assert eps[0]["terminations"].tolist() == [False, True]
  assert eps[1]["truncations"].tolist() == [False, True]   # a time limit
  assert eps[2]["truncations"].tolist() == [False, True]   # cut at the medium point
  np.testing.assert_array_equal(eps[1]["observations"][:, 0], [2, 3, 4])


def test_mix_episodes_shares():
  def eps(count, length, tag):
    return [dict(rewards=np.full(length, tag, float)) for _ in range(count)]
  base, better = eps(100, 10, 0.0), eps(50, 20, 1.0)
  mixed = recording.mix_episodes(base, better, 0.1, seed=0)
  n_better = sum(len(e["rewards"]) for e in mixed if e["rewards"][0] == 1.0)
  total = sum(len(e["rewards"]) for e in mixed)
  assert n_better == 100 and total == 1000


def test_build_random(root):
  dataset_id = recipes.build_random("hopper-random", steps=300, seed=0, log_fn=lambda *_: None,
                                    max_episode_steps=30)
  assert dataset_id == "mombo/hopper/random-v0"
  t = transitions_lib.load_transitions("hopper-random")
  assert len(t.rewards) == 300 and t.observations.dtype == np.float32
  assert np.all(np.abs(t.actions) <= 1.0) and t.actions.std() > 0.3  # uniform in [-1, 1]
  _check_chaining(t, minari_io.read_episodes("hopper-random"))
  low, high, source = scores.ref_scores("hopper-random")
  assert (low, high) == scores.D4RL_REF_SCORES["hopper"] and "metadata" in source
  assert envs.make_env(dataset_id).spec.max_episode_steps == 1000  # evaluation env: standard
  # Never silently overwritten; --overwrite rebuilds.
  with pytest.raises(errors.UserError, match="overwrite=True"):
    recipes.build_random("hopper-random", steps=10, log_fn=lambda *_: None)
  recipes.build_random("hopper-random", steps=50, seed=1, log_fn=lambda *_: None, overwrite=True)
  # not the cached 300 rows
  assert len(transitions_lib.load_transitions("hopper-random").rewards) == 50
  # Provenance: the recipe, what was written, the recipe's full size and how to rebuild it.
  assert provenance.provenance("hopper-random") == {
      "recipe": "random", "steps": 50, "recipe_steps": 1_000_000,
      "command": "python -m experiments.collect --env=hopper-random --overwrite"}
  assert "reduced build" in provenance.smaller_than_recipe("hopper-random")
  with pytest.raises(ValueError):
    recipes.build_random("hopper-medium", steps=10)


def _program_flags(module: str) -> dict:
  """{flag name: (absl type, default as --helpxml prints it)} of the flags `python -m module`
  defines itself."""
  out = subprocess.run([sys.executable, "-m", module, "--helpxml"], cwd=REPO, capture_output=True,
                       text=True, timeout=HANG_S)
  assert out.returncode in (0, 1), out.stderr      # absl exits 1 after printing the help
  path = os.path.join(*module.split(".")) + ".py"
  return {f.findtext("name"): (f.findtext("type"), f.findtext("default") or "")
          for f in ElementTree.fromstring(out.stdout).iter("flag")
          if f.findtext("file").endswith(path)}


# --helpxml's <type> -> the Options value of its <default> (--hidden: a list of layer widths).
_PARSE = {"bool": lambda d: d == "true", "int": int, "float": float,
          "comma separated list of strings": lambda d: tuple(int(h) for h in d.split(","))}


def test_every_option_is_a_flag_with_the_options_default():
  """experiments.collect turns its flags into options.Options by name: each field is a flag whose
  default is the field's (checked on the program's own --helpxml)."""
  program = _program_flags("experiments.collect")
  for field in dataclasses.fields(options.Options):
    kind, default = program[field.name]
    value = _PARSE.get(kind, str)(default) if default else None     # "": the default is None
    assert value == field.default, (field.name, kind, default)


@pytest.mark.slow
def test_cli(root, tmp_path):
  env = dict(os.environ, MINARI_DATASETS_PATH=str(tmp_path), HF_HUB_OFFLINE="1")

  def run(*args):
    return subprocess.run([sys.executable, "-m", "experiments.collect", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=HANG_S)
  bad = run("--env=hopper-foo")
  assert bad.returncode == 2 and "Valid names" in bad.stderr and "Traceback" not in bad.stderr
  good = run("--env=walker2d-random", "--steps=60", "--max_episode_steps=20")
  assert good.returncode == 0, good.stderr
  assert "steps/s" in good.stdout and "mombo/walker2d/random-v0" in good.stdout
  again = run("--env=walker2d-random", "--steps=60")
  assert again.returncode == 0 and "already exists" in again.stdout


# medium_fraction=-1 with medium_consecutive=1: the first evaluation is the medium point.
TINY = options.Options(steps=120, sac_steps=300, start_steps=100, eval_every=100, eval_episodes=1,
                       medium_fraction=-1.0, medium_consecutive=1, checkpoint_every=1000,
                       log_every=100, hidden=(16, 16), batch_size=32, num_envs=4,
                       max_episode_steps=40, seed=0)


@pytest.mark.slow
def test_sac_qualities_end_to_end(root, tmp_path):
  """One tiny SAC run writes medium-replay, medium, expert, medium-expert and a mixture; a longer
  --sac_steps resumes it from its Orbax checkpoint."""
  logs = []
  opts = options.Options(**{**TINY.__dict__, "workdir": str(tmp_path)})
  builder = recipes.Builder(opts, log_fn=logs.append)
  for name in ("hopper-medium-replay", "hopper-medium-expert", "hopper-random-medium-10pct"):
    builder.build(name)
  # medium_fraction=-1: the first evaluation (step 100) is the medium point.
  result = builder.sac_run("hopper")
  assert result.medium_step == 100 and [s for s, _ in result.evals] == [100, 200, 300]
  replay = transitions_lib.load_transitions("hopper-medium-replay")
  assert len(replay.rewards) == 100
  _check_chaining(replay, minari_io.read_episodes("hopper-medium-replay"))
  medium = transitions_lib.load_transitions("hopper-medium")
  expert = transitions_lib.load_transitions("hopper-expert")
  both = transitions_lib.load_transitions("hopper-medium-expert")
  assert len(medium.rewards) == len(expert.rewards) == opts.steps
  np.testing.assert_array_equal(both.observations,
                                np.concatenate([medium.observations, expert.observations]))
  # The SAC policies act in [-1, 1] and are not the random policy's uniform actions.
  assert np.all(np.abs(expert.actions) <= 1.0)
  random = transitions_lib.load_transitions("hopper-random")  # built as the mixture's ingredient
  mixed = minari_io.read_episodes("hopper-random-medium-10pct")
  total = sum(len(e["rewards"]) for e in mixed)
  assert abs(total - len(random.rewards)) <= opts.max_episode_steps
  assert scores.ref_scores("hopper-medium-expert")[2].startswith("metadata")
  assert provenance.provenance("hopper-medium-replay")["recipe_steps"] is None   # no fixed size
  assert provenance.smaller_than_recipe("hopper-medium-replay") is None
  assert provenance.provenance("hopper-medium-expert") == {
      "recipe": "medium-expert", "steps": 2 * opts.steps, "recipe_steps": 2_000_000,
      "command": "python -m experiments.collect --env=hopper-medium-expert --overwrite"}
  assert provenance.provenance("hopper-random-medium-10pct")["recipe"] == "mixed"
  assert any("steps/s" in line and "ETA" in line for line in logs)
  assert provenance.provenance("hopper-medium-replay")["medium_point"]["medium_step"] == 100

  # The run's actors were saved as soon as it had them (medium at step 100, expert at the end),
  # and the files alone rebuild the same datasets (compared exactly: one process, one machine).
  actors = os.path.join(opts.workdir, "hopper", "actors")
  assert sorted(os.listdir(actors)) == ["expert.json", "expert.msgpack", "medium.json",
                                        "medium.msgpack"]
  with open(os.path.join(actors, "medium.json")) as f:
    medium_info = json.load(f)
  assert medium_info["sac_step"] == 100 and medium_info["medium_consecutive"] == 1
  assert medium_info["qualifying_evals"] == [[100, result.evals[0][1]]]
  with open(os.path.join(actors, "expert.json")) as f:
    assert json.load(f)["sac_step"] == 300
  assert provenance.provenance("hopper-medium")["actors"]["medium"] == {
      "path": os.path.join(actors, "medium.msgpack"), "sha256": medium_info["sha256"],
      "sac_step": 100}
  with minari_root_at(tmp_path / "from_actors"):
    recipes.Builder(dataclasses.replace(opts, from_actors=actors),
                    log_fn=logs.append).build("hopper-medium-expert")
    again = transitions_lib.load_transitions("hopper-medium-expert")
    assert not minari_io.exists_locally("hopper-medium")   # recorded, not written as ingredients
  for field in again._fields:
    np.testing.assert_array_equal(getattr(again, field), getattr(both, field))

  # Resume: same workdir, longer run.
  logs.clear()
  longer = options.Options(**{**opts.__dict__, "sac_steps": 400})
  result2 = recipes.Builder(longer, log_fn=logs.append).sac_run("hopper")
  assert any("resumed the SAC run at step 300" in line for line in logs)
  assert result2.medium_step == 100 and [s for s, _ in result2.evals] == [100, 200, 300, 400]
  np.testing.assert_array_equal(result2.replay["obs"], result.replay["obs"])
  # Other network settings do not silently reuse the checkpoint.
  other = options.Options(**{**opts.__dict__, "hidden": (8, 8)})
  with pytest.raises(errors.UserError, match="another `workdir`"):
    recipes.Builder(other, log_fn=logs.append).sac_run("hopper")


@pytest.mark.slow
def test_medium_builds_stop_the_sac_run_at_the_medium_point(tmp_path):
  """medium-replay needs the SAC run only up to its medium point: it stops there (checkpointed),
  and a later expert build resumes it to --sac_steps."""
  with minari_root_at(tmp_path / "minari"):
    opts = options.Options(**{**TINY.__dict__, "workdir": str(tmp_path / "work")})
    logs = []
    builder = recipes.Builder(opts, log_fn=logs.append)
    builder.build("hopper-medium-replay")
    result = builder.sac_run("hopper", until_medium=True)
    assert (result.steps_done == result.medium_step == 100
            and result.evals == [(100, result.evals[0][1])])
    assert any("stopped at its medium point" in line for line in logs)
    assert len(transitions_lib.load_transitions("hopper-medium-replay").rewards) == 100
    # The medium actor is saved at the medium point; there is no expert yet.
    actors = tmp_path / "work" / "hopper" / "actors"
    assert sorted(os.listdir(actors)) == ["medium.json", "medium.msgpack"]
    medium_bytes = (actors / "medium.msgpack").read_bytes()
    # --actors_only exports it again from the checkpoint alone: same bytes, no training, no data.
    shutil.rmtree(actors)
    logs.clear()
    only = options.Options(**{**opts.__dict__, "actors_only": True})
    assert recipes.Builder(only, log_fn=logs.append).build("hopper-medium") is None
    assert (actors / "medium.msgpack").read_bytes() == medium_bytes
    assert not any(line.startswith("SAC step") for line in logs), logs
    assert not minari_io.exists_locally("hopper-medium")
    with pytest.raises(errors.UserError, match="is at step 100, not sac_steps=300"):
      recipes.Builder(only, log_fn=logs.append).build("hopper-expert")
    logs.clear()
    recipes.Builder(opts, log_fn=logs.append).build("hopper-expert")
    assert any("resumed the SAC run at step 100" in line for line in logs)
    assert len(transitions_lib.load_transitions("hopper-expert").rewards) == opts.steps
    assert (actors / "medium.msgpack").read_bytes() == medium_bytes
    with open(actors / "expert.json") as f:
      assert json.load(f)["sac_step"] == 300
    full = recipes.Builder(opts, log_fn=logs.append).sac_run("hopper")
    assert full.steps_done == 300 and [s for s, _ in full.evals] == [100, 200, 300]


def test_unreached_medium_point_is_explained(root, tmp_path, monkeypatch):
  monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
  # Expert-level returns are out of reach for 120 steps of SAC (same shapes as above: no compiling).
  opts = options.Options(**{**TINY.__dict__, "sac_steps": 120, "medium_fraction": 1.0,
                            "workdir": str(tmp_path / "work")})
  with pytest.raises(errors.UserError, match="never reached the medium point"):
    recipes.Builder(opts, log_fn=lambda *_: None).build("hopper-medium")


@pytest.mark.slow
def test_kill_9_mid_sac_resumes_from_the_last_checkpoint(tmp_path):
  """`kill -9` of the collector mid-SAC loses only the steps since the last checkpoint: the same
  command resumes there (the env mid-episode and the RNGs included, tests/test_stops.py) and
  finishes with exactly an uninterrupted build's rows."""
  # medium_fraction=-1: the first evaluation (step 400) is the medium point, where a medium-replay
  # build stops the SAC run. One dispatch per env step (--train_every=1) keeps the run slow enough
  # to be killed at step 300, after the checkpoints of steps 100 and 200.
  args = dict(steps=60, sac_steps=3000, start_steps=100, eval_every=400, eval_episodes=1,
              medium_fraction=-1.0, medium_consecutive=1, checkpoint_every=100, log_every=100,
              hidden=(16, 16),
              batch_size=32, num_envs=2, max_episode_steps=40, seed=0, train_every=1)
  cli = [sys.executable, "-u", "-m", "experiments.collect", "--env=hopper-medium-replay"]
  cli += [f"--{k}={','.join(map(str, v)) if isinstance(v, tuple) else v}" for k, v in args.items()]
  cli += [f"--workdir={tmp_path / 'work'}"]
  env = dict(os.environ, MINARI_DATASETS_PATH=str(tmp_path / "killed"), HF_HUB_OFFLINE="1")

  proc = subprocess.Popen(cli, cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  seen = []
  try:
    for line in proc.stdout:
      seen.append(line)
      if line.startswith("SAC step 300/"):
        proc.kill()
        break
  finally:
    proc.kill()
    rest, _ = proc.communicate(timeout=HANG_S)
  seen.append(rest or "")
  assert proc.returncode == -9, "".join(seen)   # killed, not finished
  assert not os.path.exists(tmp_path / "killed" / "mombo")   # nothing written yet

  out = subprocess.run(cli, cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)
  assert out.returncode == 0, out.stdout + out.stderr
  # The checkpoint of step 300 may or may not have committed before the kill.
  assert any(f"resumed the SAC run at step {s}" in out.stdout for s in (200, 300)), out.stdout

  # Uninterrupted, in this process, with the same settings.
  with minari_root_at(tmp_path / "straight"):
    opts = options.Options(**{**args, "workdir": str(tmp_path / "w2")})
    recipes.Builder(opts, log_fn=lambda *_: None).build("hopper-medium-replay")
    straight = transitions_lib.load_transitions("hopper-medium-replay")
  with minari_root_at(tmp_path / "killed"):
    resumed = transitions_lib.load_transitions("hopper-medium-replay")
  assert len(resumed.rewards) == len(straight.rewards) == 400
  for field in ("observations", "actions", "rewards", "next_observations", "terminals"):
    np.testing.assert_array_equal(getattr(resumed, field), getattr(straight, field))


# ------------------------------------------------------------------ the robust medium point

class _Killed(Exception):
  pass


def _scripted_evaluations(monkeypatch, returns):
  """online_sac.evaluate replaced: the i-th evaluation returns returns[i] (no episodes run; None:
  the process "dies" there); the actions each evaluated policy takes on a probe state are kept."""
  probe = np.linspace(-0.5, 0.5, 11).astype(np.float32)
  seen = []

  def fake(make_env, mode_fn, episodes, seed, should_stop=None):
    seen.append(np.asarray(mode_fn(probe)))
    if returns[len(seen) - 1] is None:
      raise _Killed()
    return np.full(episodes, float(returns[len(seen) - 1]))
  monkeypatch.setattr(online_sac, "evaluate", fake)
  return probe, seen


def _tiny_sac(**kwargs):
  """TINY's SAC run (300 steps, warm-up 100, one chunk of 201 gradient steps at step 300: the
  shapes the tests above compiled already) with an evaluation every 50 steps, medium return 0.5."""
  config = online_sac.online_config("hopper", TINY.hidden, TINY.batch_size)
  schedule = sac_run.SacSchedule(TINY.sac_steps, TINY.start_steps, eval_every=50,
                                    eval_episodes=2, seed=1, train_every=TINY.train_every,
                                    checkpoint_every=kwargs.pop("checkpoint_every", 50_000))
  medium = sac_run.MediumPoint(0.5, kwargs.pop("medium_consecutive", 2))
  return sac_run.train_sac(lambda: envs.make_env("hopper-random", max_episode_steps=40),
                              config, schedule, medium, **kwargs)


def test_medium_point_needs_consecutive_evaluations(monkeypatch):
  """Over the threshold once, then under: no medium point; twice in a row: the medium point, with
  the actor and the replay size of the second of them."""
  _scripted_evaluations(monkeypatch, [1.0, 0.0, 1.0, 1.0, 0.0, 0.0])
  logs = []
  result = _tiny_sac(log_fn=logs.append)   # medium_consecutive=2, the default
  assert [s for s, _ in result.evals] == [50, 100, 150, 200, 250, 300]
  assert result.medium_step == 200 and result.medium_size == 200
  assert len(result.replay["obs"]) == 200 and result.steps_done == 300
  assert any("eval @ 50" in line and "1 of 2" in line for line in logs)
  assert any("eval @ 200" in line and "medium point" in line for line in logs)
  # The snapshot is the actor evaluated at the second evaluation (300, just trained), not the
  # one at the first (250).
  probe, seen = _scripted_evaluations(monkeypatch, [0.0, 0.0, 0.0, 0.0, 1.0, 1.0])
  result = _tiny_sac(log_fn=logs.append)
  assert result.medium_step == result.medium_size == 300
  medium = actor_policy.numpy_actor(result.medium_actor, result.config.agent.log_std_min,
                                   result.config.agent.log_std_max)(probe)
  np.testing.assert_array_equal(medium, seen[5])
  assert not np.array_equal(seen[4], seen[5])
  # One evaluation is enough with medium_consecutive=1.
  _scripted_evaluations(monkeypatch, [0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
  assert _tiny_sac(log_fn=logs.append, medium_consecutive=1).medium_step == 100


def test_medium_streak_survives_a_resume(monkeypatch, tmp_path):
  """The streak is checkpointed: over the threshold at step 200 (checkpointed), the process dies
  at the next evaluation, the resumed run is over it at 250: the medium point is at 250."""
  _scripted_evaluations(monkeypatch, [0.0, 0.0, 0.0, 1.0, None])
  with pytest.raises(_Killed):
    _tiny_sac(log_fn=lambda *_: None, workdir=str(tmp_path), checkpoint_every=200)
  _scripted_evaluations(monkeypatch, [1.0, 0.0])
  logs = []
  result = _tiny_sac(log_fn=logs.append, workdir=str(tmp_path), checkpoint_every=200)
  assert any("resumed the SAC run at step 200" in line for line in logs)
  assert result.medium_step == 250 and result.medium_size == 250


# ----------------------------------------------------------------------------- saved actors

def _actor(key: int, hidden=(8, 8)):
  """Random weights of a tiny hopper actor (the shapes Flax gives it) and the sidecar fields
  save_actor needs."""
  config = online_sac.online_config("hopper", hidden, 32)
  rng = np.random.default_rng(key)
  sizes = [11, *hidden]
  shapes = [(a, b) for a, b in zip(sizes[:-1], sizes[1:])] + [(hidden[-1], 3)] * 2
  params = {"params": {f"Dense_{i}": {"kernel": rng.standard_normal(s).astype(np.float32) * 0.5,
                                      "bias": rng.standard_normal(s[1]).astype(np.float32) * 0.1}
                       for i, s in enumerate(shapes)}}
  info = dict(env="hopper", obs_dim=11, action_dim=3, actor_hidden=list(hidden),
              log_std_min=config.agent.log_std_min, log_std_max=config.agent.log_std_max,
              batch_size=32,
              sac_step=key)
  return params, config, info


def test_saved_actor_round_trip(tmp_path):
  params, config, info = _actor(3)
  sidecar = saved_actors.save_actor(str(tmp_path), "medium", params, info)
  weights = tmp_path / "medium.msgpack"
  assert sidecar["sha256"] == hashlib.sha256(weights.read_bytes()).hexdigest()
  with open(tmp_path / "medium.json") as f:
    assert json.load(f) == sidecar
  loaded = saved_actors.load_actor(str(tmp_path), "medium")
  assert loaded.config == config and loaded.sha256 == sidecar["sha256"]
  obs = np.random.default_rng(0).standard_normal((3, 11)).astype(np.float32)  # as num_envs=3
  for deterministic in (True, False):   # the same actions, sampled ones with the same key too
    want = recording.sac_policy(params, config, 7, deterministic)(obs)
    got = recording.sac_policy(loaded.params, loaded.config, 7, deterministic)(obs)
    np.testing.assert_array_equal(got, want)
  # Small: the float32 weights and little else (a 256x256 hopper actor: ~280 KB).
  shapes = {"Dense_0": (11, 256), "Dense_1": (256, 256), "Dense_2": (256, 3), "Dense_3": (256, 3)}
  big = {"params": {k: {"kernel": np.zeros(s, np.float32), "bias": np.zeros(s[1], np.float32)}
                    for k, s in shapes.items()}}
  assert 4 * 70406 < len(saved_actors.actor_bytes(big)) < 4 * 70406 + 2000
  # A replaced weights file, a missing one, another network: refused, naming the file.
  weights.write_bytes(weights.read_bytes()[:-1] + b"\x00")
  with pytest.raises(errors.UserError, match="medium.msgpack .*not the file its sidecar"):
    saved_actors.load_actor(str(tmp_path), "medium")
  with pytest.raises(errors.UserError, match="no saved actor file .*expert.msgpack"):
    saved_actors.load_actor(str(tmp_path), "expert")
  saved_actors.save_actor(str(tmp_path), "medium", params, dict(info, actor_hidden=[8, 8, 8]))
  with pytest.raises(errors.UserError, match="does not hold the actor"):
    saved_actors.load_actor(str(tmp_path), "medium")


FROM_ACTORS = options.Options(steps=60, num_envs=3, max_episode_steps=20, seed=5)


def _save_two_actors(directory):
  for quality, key in (("medium", 1), ("expert", 2)):
    params, _, info = _actor(key)
    saved_actors.save_actor(str(directory), quality, params, info)


def test_from_actors_builds_the_same_datasets_twice(tmp_path):
  actors = tmp_path / "actors"
  _save_two_actors(actors)
  opts = dataclasses.replace(FROM_ACTORS, from_actors=str(actors), workdir=str(tmp_path / "work"))
  names = ("hopper-medium", "hopper-expert", "hopper-medium-expert")

  def build(root, opts):
    with minari_root_at(tmp_path / root):
      builder = recipes.Builder(opts, log_fn=lambda *_: None)
      for name in names:
        builder.build(name)
      return {name: transitions_lib.load_transitions(name) for name in names}, \
          {name: provenance.provenance(name) for name in names}
  first, prov = build("a", opts)
  second, _ = build("b", opts)
  for name in names:
    for field in first[name]._fields:   # one process: the same actions bit for bit
      np.testing.assert_array_equal(getattr(first[name], field), getattr(second[name], field))
  assert len(first["hopper-medium"].rewards) == len(first["hopper-expert"].rewards) == 60
  np.testing.assert_array_equal(first["hopper-medium-expert"].actions, np.concatenate(
      [first["hopper-medium"].actions, first["hopper-expert"].actions]))
  assert not np.allclose(first["hopper-medium"].actions[:10], first["hopper-expert"].actions[:10])
  with minari_root_at(tmp_path / "c"):   # another seed, other episodes
    recipes.Builder(dataclasses.replace(opts, seed=6), log_fn=lambda *_: None).build(
        "hopper-medium")
    assert not np.array_equal(transitions_lib.load_transitions("hopper-medium").observations,
                              first["hopper-medium"].observations)
  assert not os.path.exists(tmp_path / "work")   # no SAC run
  # Provenance: the actor files (path + sha256) and the command that rebuilds the dataset.
  sha = {q: hashlib.sha256((actors / f"{q}.msgpack").read_bytes()).hexdigest()
         for q in ("medium", "expert")}
  assert prov["hopper-medium"]["actors"] == {
      "medium": {"path": str(actors / "medium.msgpack"), "sha256": sha["medium"], "sac_step": 1}}
  assert set(prov["hopper-medium-expert"]["actors"]) == {"medium", "expert"}
  assert prov["hopper-expert"]["command"] == (
      f"python -m experiments.collect --env=hopper-expert --seed=5 --num_envs=3 "
      f"--max_episode_steps=20 --from_actors={actors} --overwrite")
  with minari_root_at(tmp_path / "a"):
    assert sha["expert"] in minari_io.load_dataset("hopper-expert").storage.metadata["description"]
    from mombo_jax.collection import cards
    card = cards.card_text("hopper-expert")
  assert f"`{actors / 'expert.msgpack'}` (sha256 `{sha['expert']}`, SAC step 2)" in card
  assert "--from_actors=" in card
  # An expert actor from a SAC run shorter than D4RL's 1M steps: a reduced expert dataset, and a
  # reduced mix of which it is the partner, whatever their sizes; their cards say so.
  short = "expert actor from a SAC run of 2 steps (D4RL's recipe: 1,000,000)"
  assert prov["hopper-expert"]["reduced"] == [short] and "reduced" not in prov["hopper-medium"]
  assert f"- REDUCED recipe: {short}" in card
  with minari_root_at(tmp_path / "a"):
    recipes.Builder(dataclasses.replace(opts, from_actors=None), log_fn=lambda *_: None).build(
        "hopper-random-expert-50pct")
    assert provenance.reduced_notes("hopper-random-expert-50pct") == [f"hopper-expert: {short}"]
    mix = provenance.provenance("hopper-random-expert-50pct")
    assert mix["ingredients"]["expert"]["actors"]["expert"]["sac_step"] == 2
    assert f"- REDUCED recipe: hopper-expert: {short}" in cards.card_text(
        "hopper-random-expert-50pct")
    assert provenance.reduced_notes("hopper-random") == []


def test_from_actors_and_actors_only_refusals(tmp_path):
  actors = tmp_path / "actors"
  params, _, info = _actor(1)
  saved_actors.save_actor(str(actors), "medium", params, info)   # no expert
  builder = recipes.Builder(dataclasses.replace(FROM_ACTORS, from_actors=str(actors)))
  builder.check("hopper-medium")
  for name, message in [("hopper-expert", "no saved actor file .*expert.msgpack"),
                        ("hopper-medium-expert", "no saved actor file .*expert.msgpack"),
                        ("hopper-medium-replay", "replay buffer .*needs the SAC run"),
                        ("hopper-random", "needs no saved actor"),
                        ("hopper-random-medium-5pct", "with `from_actors` first"),
                        ("walker2d-medium", "actor for hopper, not walker2d")]:
    with pytest.raises(errors.UserError, match=message):
      builder.check(name)
  with pytest.raises(errors.UserError, match="pass one of them"):
    recipes.Builder(dataclasses.replace(FROM_ACTORS, from_actors=str(actors), actors_only=True))
  only = recipes.Builder(dataclasses.replace(FROM_ACTORS, actors_only=True,
                                             workdir=str(tmp_path / "none")))
  with pytest.raises(errors.UserError, match="recorded from no SAC actor"):
    only.check("hopper-random")
  with pytest.raises(errors.UserError, match="No SAC checkpoint in"):
    only.build("hopper-medium")


@pytest.mark.slow
def test_from_actors_cli(tmp_path):
  """One `error:` line (no traceback, nothing written) for a missing actor; a tiny build."""
  actors = tmp_path / "actors"
  params, _, info = _actor(1)
  saved_actors.save_actor(str(actors), "medium", params, info)
  env = dict(os.environ, MINARI_DATASETS_PATH=str(tmp_path / "minari"), HF_HUB_OFFLINE="1")

  def run(*args):
    return subprocess.run([sys.executable, "-m", "experiments.collect", *args,
                           f"--from_actors={actors}", "--steps=30", "--num_envs=2",
                           "--max_episode_steps=10", f"--workdir={tmp_path / 'work'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)
  bad = run("--env=hopper-medium,hopper-expert")
  assert bad.returncode == 1 and "Traceback" not in bad.stderr
  lines = bad.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: no saved actor file ")
  assert str(actors / "expert.msgpack") in lines[0]
  assert not os.path.exists(tmp_path / "minari" / "mombo")   # refused before anything ran
  good = run("--env=hopper-medium")
  assert good.returncode == 0, good.stderr
  assert "wrote mombo/hopper/medium-v0" in good.stdout
  with minari_root_at(tmp_path / "minari"):
    assert len(transitions_lib.load_transitions("hopper-medium").rewards) == 30
    assert "--from_actors=" in provenance.provenance("hopper-medium")["command"]
