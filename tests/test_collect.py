"""experiments/collect.py: recipes on tiny budgets, written as real Minari datasets, read back."""
import os
import subprocess
import sys

import numpy as np
import pytest

from experiments import collect
from mombo_jax import data, recipes
from tests.conftest import minari_root_at

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
  episodes = recipes.rollout(lambda: data.make_env("hopper-random", max_episode_steps=7),
                             recipes.random_policy(3, 0), 40, seed=0, num_envs=3)
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
  eps = recipes._replay_episodes(replay)
  assert [len(e["rewards"]) for e in eps] == [2, 2, 2]
  assert eps[0]["terminations"].tolist() == [False, True]
  assert eps[1]["truncations"].tolist() == [False, True]   # a time limit
  assert eps[2]["truncations"].tolist() == [False, True]   # cut at the medium point
  np.testing.assert_array_equal(eps[1]["observations"][:, 0], [2, 3, 4])


def test_mix_episodes_shares():
  def eps(count, length, tag):
    return [dict(rewards=np.full(length, tag, float)) for _ in range(count)]
  base, better = eps(100, 10, 0.0), eps(50, 20, 1.0)
  mixed = recipes.mix_episodes(base, better, 0.1, seed=0)
  n_better = sum(len(e["rewards"]) for e in mixed if e["rewards"][0] == 1.0)
  total = sum(len(e["rewards"]) for e in mixed)
  assert n_better == 100 and total == 1000


def test_build_random(root):
  dataset_id = recipes.build_random("hopper-random", steps=300, seed=0, log_fn=lambda *_: None,
                                    max_episode_steps=30)
  assert dataset_id == "mombo/hopper/random-v0"
  t = data.load_transitions("hopper-random")
  assert len(t.rewards) == 300 and t.observations.dtype == np.float32
  assert np.all(np.abs(t.actions) <= 1.0) and t.actions.std() > 0.3  # uniform in [-1, 1]
  _check_chaining(t, recipes.read_episodes("hopper-random"))
  low, high, source = data.ref_scores("hopper-random")
  assert (low, high) == data.D4RL_REF_SCORES["hopper"] and "metadata" in source
  assert data.make_env(dataset_id).spec.max_episode_steps == 1000  # evaluation env: standard
  # Never silently overwritten; --overwrite rebuilds.
  with pytest.raises(recipes.UserError, match="--overwrite"):
    recipes.build_random("hopper-random", steps=10, log_fn=lambda *_: None)
  recipes.build_random("hopper-random", steps=50, seed=1, log_fn=lambda *_: None, overwrite=True)
  assert len(data.load_transitions("hopper-random").rewards) == 50  # not the cached 300 rows
  # Provenance: the recipe, what was written, the recipe's full size and how to rebuild it.
  assert data.provenance("hopper-random") == {
      "recipe": "random", "steps": 50, "recipe_steps": 1_000_000,
      "command": "python -m experiments.collect --env=hopper-random --overwrite"}
  assert "reduced build" in data.smaller_than_recipe("hopper-random")
  with pytest.raises(ValueError):
    recipes.build_random("hopper-medium", steps=10)


def test_flags_defined_only_as_program():
  """Importing collect next to run defines no flag (both have --env; absl flags are global);
  define_flags() gives defaults equal to Options' (checked in a fresh process)."""
  from absl import flags
  from experiments import run  # noqa: F401  (would raise DuplicateFlagError if flags clashed)
  assert "sac_steps" not in flags.FLAGS
  code = ("from experiments import collect; collect.define_flags(); collect.FLAGS(['collect']); "
          "assert collect.options_from_flags() == collect.Options(), collect.options_from_flags()")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
  assert out.returncode == 0, out.stderr


@pytest.mark.slow
def test_cli(root, tmp_path):
  env = dict(os.environ, MINARI_DATASETS_PATH=str(tmp_path), HF_HUB_OFFLINE="1")

  def run(*args):
    return subprocess.run([sys.executable, "-m", "experiments.collect", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
  bad = run("--env=hopper-foo")
  assert bad.returncode == 1 and "Valid names" in bad.stderr and "Traceback" not in bad.stderr
  good = run("--env=walker2d-random", "--steps=60", "--max_episode_steps=20")
  assert good.returncode == 0, good.stderr
  assert "steps/s" in good.stdout and "mombo/walker2d/random-v0" in good.stdout
  again = run("--env=walker2d-random", "--steps=60")
  assert again.returncode == 0 and "already exists" in again.stdout


TINY = recipes.Options(steps=120, sac_steps=300, start_steps=100, eval_every=100, eval_episodes=1,
                       medium_fraction=-1.0, checkpoint_every=1000, log_every=100, hidden=(16, 16),
                       batch_size=32, num_envs=4, max_episode_steps=40, seed=0)


@pytest.mark.slow
def test_sac_qualities_end_to_end(root, tmp_path):
  """One tiny SAC run writes medium-replay, medium, expert, medium-expert and a mixture; a longer
  --sac_steps resumes it from its Orbax checkpoint."""
  logs = []
  opts = recipes.Options(**{**TINY.__dict__, "workdir": str(tmp_path)})
  builder = recipes.Builder(opts, log_fn=logs.append)
  for name in ("hopper-medium-replay", "hopper-medium-expert", "hopper-random-medium-10pct"):
    builder.build(name)
  # medium_fraction=-1: the first evaluation (step 100) is the medium point.
  result = builder.sac_run("hopper")
  assert result.medium_step == 100 and [s for s, _ in result.evals] == [100, 200, 300]
  replay = data.load_transitions("hopper-medium-replay")
  assert len(replay.rewards) == 100
  _check_chaining(replay, recipes.read_episodes("hopper-medium-replay"))
  medium = data.load_transitions("hopper-medium")
  expert = data.load_transitions("hopper-expert")
  both = data.load_transitions("hopper-medium-expert")
  assert len(medium.rewards) == len(expert.rewards) == opts.steps
  np.testing.assert_array_equal(both.observations,
                                np.concatenate([medium.observations, expert.observations]))
  # The SAC policies act in [-1, 1] and are not the random policy's uniform actions.
  assert np.all(np.abs(expert.actions) <= 1.0)
  random = data.load_transitions("hopper-random")  # built as the mixture's ingredient
  mixed = recipes.read_episodes("hopper-random-medium-10pct")
  total = sum(len(e["rewards"]) for e in mixed)
  assert abs(total - len(random.rewards)) <= opts.max_episode_steps
  assert data.ref_scores("hopper-medium-expert")[2].startswith("metadata")
  assert data.provenance("hopper-medium-replay")["recipe_steps"] is None   # no fixed size
  assert data.smaller_than_recipe("hopper-medium-replay") is None
  assert data.provenance("hopper-medium-expert") == {
      "recipe": "medium-expert", "steps": 2 * opts.steps, "recipe_steps": 2_000_000,
      "command": "python -m experiments.collect --env=hopper-medium-expert --overwrite"}
  assert data.provenance("hopper-random-medium-10pct")["recipe"] == "mixed"
  assert any("steps/s" in line and "ETA" in line for line in logs)

  # Resume: same workdir, longer run.
  logs.clear()
  longer = recipes.Options(**{**opts.__dict__, "sac_steps": 400})
  result2 = recipes.Builder(longer, log_fn=logs.append).sac_run("hopper")
  assert any("resumed the SAC run at step 300" in line for line in logs)
  assert result2.medium_step == 100 and [s for s, _ in result2.evals] == [100, 200, 300, 400]
  np.testing.assert_array_equal(result2.replay["obs"], result.replay["obs"])
  # Other network settings do not silently reuse the checkpoint.
  other = recipes.Options(**{**opts.__dict__, "hidden": (8, 8)})
  with pytest.raises(recipes.UserError, match="another --workdir"):
    recipes.Builder(other, log_fn=logs.append).sac_run("hopper")


@pytest.mark.slow
def test_medium_builds_stop_the_sac_run_at_the_medium_point(tmp_path):
  """medium-replay needs the SAC run only up to its medium point: it stops there (checkpointed),
  and a later expert build resumes it to --sac_steps."""
  with minari_root_at(tmp_path / "minari"):
    opts = recipes.Options(**{**TINY.__dict__, "workdir": str(tmp_path / "work")})
    logs = []
    builder = recipes.Builder(opts, log_fn=logs.append)
    builder.build("hopper-medium-replay")
    result = builder.sac_run("hopper", until_medium=True)
    assert result.steps_done == result.medium_step == 100 and result.evals == [(100, result.evals[0][1])]
    assert any("stopped at its medium point" in line for line in logs)
    assert len(data.load_transitions("hopper-medium-replay").rewards) == 100
    logs.clear()
    recipes.Builder(opts, log_fn=logs.append).build("hopper-expert")
    assert any("resumed the SAC run at step 100" in line for line in logs)
    assert len(data.load_transitions("hopper-expert").rewards) == opts.steps
    full = recipes.Builder(opts, log_fn=logs.append).sac_run("hopper")
    assert full.steps_done == 300 and [s for s, _ in full.evals] == [100, 200, 300]


def test_unreached_medium_point_is_explained(root, tmp_path, monkeypatch):
  monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
  # Expert-level returns are out of reach for 120 steps of SAC (same shapes as above: no compiling).
  opts = recipes.Options(**{**TINY.__dict__, "sac_steps": 120, "medium_fraction": 1.0,
                            "workdir": str(tmp_path / "work")})
  with pytest.raises(recipes.UserError, match="never reached the medium point"):
    recipes.Builder(opts, log_fn=lambda *_: None).build("hopper-medium")


@pytest.mark.slow
def test_kill_9_mid_sac_resumes_from_the_last_checkpoint(tmp_path):
  """`kill -9` of the collector mid-SAC loses only the steps since the last checkpoint: the same
  command resumes there and finishes, and the rows recorded before the kill come out exactly as
  an uninterrupted build's."""
  # medium_fraction=-1: the first evaluation (step 400) is the medium point, where a medium-replay
  # build stops the SAC run. One dispatch per env step (--train_every=1) keeps the run slow enough
  # to be killed at step 300, after the checkpoints of steps 100 and 200.
  args = dict(steps=60, sac_steps=3000, start_steps=100, eval_every=400, eval_episodes=1,
              medium_fraction=-1.0, checkpoint_every=100, log_every=100, hidden=(16, 16),
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
    rest, _ = proc.communicate(timeout=60)
  seen.append(rest or "")
  assert proc.returncode == -9, "".join(seen)   # killed, not finished
  assert not os.path.exists(tmp_path / "killed" / "mombo")   # nothing written yet

  out = subprocess.run(cli, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout + out.stderr
  # The checkpoint of step 300 may or may not have committed before the kill.
  assert any(f"resumed the SAC run at step {s}" in out.stdout for s in (200, 300)), out.stdout

  # Uninterrupted, in this process, with the same settings.
  with minari_root_at(tmp_path / "straight"):
    opts = recipes.Options(**{**args, "workdir": str(tmp_path / "w2")})
    recipes.Builder(opts, log_fn=lambda *_: None).build("hopper-medium-replay")
    straight = data.load_transitions("hopper-medium-replay")
  with minari_root_at(tmp_path / "killed"):
    resumed = data.load_transitions("hopper-medium-replay")
  assert len(resumed.rewards) == len(straight.rewards) == 400
  for field in ("observations", "actions", "rewards", "next_observations", "terminals"):
    np.testing.assert_array_equal(getattr(resumed, field)[:200], getattr(straight, field)[:200])
