"""Datasets: a tiny real Minari dataset round-trips through load_transitions; names, errors, scores
and environments. Nothing here touches the network (a guard fails any connection attempt)."""
import os
import socket
import subprocess
import sys
import time

import gymnasium as gym
import minari
import numpy as np
import pytest

from mombo_jax import errors
from mombo_jax.data import minari_io, names, scores, transitions as transitions_lib
from mombo_jax.env import envs
from mombo_jax.settings import references
from tests.conftest import minari_root_at

TINY_ID = "test/hopper/tiny-v0"
TINY_STEPS = 150
TINY_LIMIT = 25            # max_episode_steps: forces truncations between terminations
TINY_REF = (-1.0, 10.0)


@pytest.fixture(autouse=True)
def no_network(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError(f"network access attempted: {args}")
  monkeypatch.setattr(socket, "create_connection", refuse)
  monkeypatch.setattr(socket.socket, "connect", refuse)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  """A fresh MINARI_DATASETS_PATH for this module."""
  with minari_root_at(tmp_path_factory.mktemp("minari_data")) as path:
    yield path


@pytest.fixture(scope="module")
def tiny(root):
  """A DataCollector dataset on Hopper-v5 plus the raw steps it recorded."""
  env = minari.DataCollector(gym.make("Hopper-v5", max_episode_steps=TINY_LIMIT))
  env.action_space.seed(0)
  obs, _ = env.reset(seed=0)
  steps = []
  for _ in range(TINY_STEPS):
    action = env.action_space.sample()
    next_obs, reward, terminated, truncated, _ = env.step(action)
    steps.append((obs, action, reward, next_obs, terminated, truncated))
    obs = next_obs
    if terminated or truncated:
      obs, _ = env.reset()
  env.create_dataset(TINY_ID, algorithm_name="uniform-random", author="tests",
                     author_email="tests@example.com", code_permalink="tests/test_data.py",
                     description="tiny", eval_env="Hopper-v5", ref_min_score=TINY_REF[0],
                     ref_max_score=TINY_REF[1])
  env.close()
  return steps


def test_round_trip(tiny):
  t = transitions_lib.load_transitions(TINY_ID)
  assert isinstance(t, transitions_lib.Transitions)
  for field in t:
    assert field.dtype == np.float32
    assert field.shape[0] == TINY_STEPS
  assert t.observations.shape == t.next_observations.shape == (TINY_STEPS, 11)
  assert t.actions.shape == (TINY_STEPS, 3)
  obs, action, reward, next_obs, terminated, truncated = map(np.asarray, zip(*tiny))
  np.testing.assert_array_equal(t.observations, obs.astype(np.float32))
  np.testing.assert_array_equal(t.next_observations, next_obs.astype(np.float32))
  np.testing.assert_array_equal(t.actions, action.astype(np.float32))
  np.testing.assert_array_equal(t.rewards, reward.astype(np.float32))
  np.testing.assert_array_equal(t.terminals, terminated.astype(np.float32))
  # The data covers both ways an episode ends; truncations keep terminal 0 (they bootstrap).
  # (A step can be both when the time limit hits a termination: terminated wins.)
  truncated_only = truncated & ~terminated
  assert terminated.any() and truncated_only.any()
  assert not t.terminals[truncated_only].any()
  # s' chains into the next row's s inside an episode, and not across episode ends.
  ends = terminated | truncated
  chained = np.all(t.next_observations[:-1] == t.observations[1:], axis=1)
  np.testing.assert_array_equal(chained[~ends[:-1]], True)
  assert not chained[ends[:-1]].any()


def test_episode_returns_split_at_terminations_and_truncations(tiny):
  """The returns the run's final line compares with (the dataset's own episodes): one per recorded
  episode, ended by a termination or a time-limit truncation, as the card counts them."""
  from mombo_jax.collection import cards
  t = transitions_lib.load_transitions(TINY_ID)
  _, _, reward, _, terminated, truncated = map(np.asarray, zip(*tiny))
  ends = np.flatnonzero(terminated | truncated)
  expected = [r.sum() for r in np.split(reward, ends[ends < len(reward) - 1] + 1)]
  got = transitions_lib.episode_returns(t)
  assert got.dtype == np.float64 and len(got) == len(expected) > 5
  np.testing.assert_allclose(got, expected, rtol=1e-5)        # rewards are stored as float32
  np.testing.assert_allclose(got, cards.episode_stats(TINY_ID)["returns"], rtol=1e-5)


def test_transitions_cache(tiny, root):
  fresh = transitions_lib.load_transitions(TINY_ID, cache=False)
  first = transitions_lib.load_transitions(TINY_ID)
  cached = list((root / ".mombo_cache" / TINY_ID).glob("transitions-*.npz"))
  assert len(cached) == 1
  second = transitions_lib.load_transitions(TINY_ID)  # from the cache file
  for a, b, c in zip(fresh, first, second):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    assert c.dtype == np.float32
  assert TINY_ID in minari.list_local_datasets()  # the hidden cache folder is not a dataset
  assert len(minari.list_local_datasets()) == 1


def test_flatten_episodes_by_hand():
  ep1 = dict(observations=np.arange(8, dtype=np.float64).reshape(4, 2), actions=np.zeros((3, 1)),
             rewards=np.array([1.0, 2.0, 3.0]), terminations=np.array([False, False, True]),
             truncations=np.array([False, False, False]))
  ep2 = dict(observations=np.full((3, 2), 9.0), actions=np.ones((2, 1)), rewards=np.ones(2),
             terminations=np.array([False, False]), truncations=np.array([False, True]))
  t = transitions_lib.flatten_episodes([ep1, ep2])
  np.testing.assert_array_equal(t.observations[:3], ep1["observations"][:-1])
  np.testing.assert_array_equal(t.next_observations[:3], ep1["observations"][1:])
  np.testing.assert_array_equal(t.terminals, [0, 0, 1, 0, 0])
  np.testing.assert_array_equal(t.rewards, [1, 2, 3, 1, 1])
  with pytest.raises(ValueError, match="no episodes"):
    transitions_lib.flatten_episodes([])
  with pytest.raises(ValueError, match=r"T\+1"):
    transitions_lib.flatten_episodes([dict(ep1, observations=ep1["observations"][:3])])


def test_names():
  for name in names.valid_names():
    dataset_id = names.minari_id(name)
    assert dataset_id.startswith("mombo/") and dataset_id.endswith("-v0")
    assert names.short_name(dataset_id) == name
  assert names.minari_id("hopper-random") == "mombo/hopper/random-v0"
  assert names.minari_id("walker2d-random-expert-50pct") == "mombo/walker2d/random-expert-50pct-v0"
  assert names.short_name("mujoco/hopper/medium-v0") is None
  assert minari_io.env_name("mujoco/halfcheetah/expert-v0") == "halfcheetah"
  assert minari_io.env_name("walker2d-medium") == "walker2d"


def test_the_valid_names_in_words_spell_exactly_the_valid_names():
  """valid_names_text's two patterns, expanded, give valid_names() (nothing missing or extra)."""
  import itertools
  import re
  text = names.valid_names_text()
  choices = dict(re.findall(r"<(\w+)> one of ([\w|-]+)", text))
  pattern = re.search(r"the mixed (\S+)", text).group(1)
  spelled = {f"{e}-{q}" for e, q in itertools.product(choices["env"].split("|"),
                                                      choices["quality"].split("|"))}
  parts = re.findall(r"<([^>]+)>", pattern)       # env, partners, percents
  for env, partner, p in itertools.product(choices["env"].split("|"), *(x.split("|")
                                                                        for x in parts[1:])):
    spelled.add(f"{env}-random-{partner}-{p}pct")
  assert spelled == set(names.valid_names()) and len(text) < 400
  assert names.valid_names_text("walker2d-medium-replai").startswith(
      "Did you mean walker2d-medium-replay? Valid names:")


def test_the_dataset_names_are_datas_and_the_settings_read_them():
  """One way from a dataset's name: data/names.py owns the names and loads no settings module
  (.importlinter puts data below settings); the reference tables have one row per D4RL task."""
  assert set(references.MOMBO_AUTHORS) == set(names.D4RL_TASKS)
  assert names.valid_names()[:len(names.D4RL_TASKS)] == sorted(names.D4RL_TASKS)
  mixed = len(names.ENVS) * len(names.MIXED_PARTNERS) * len(names.MIXED_PERCENTS)
  assert len(set(names.valid_names())) == len(names.D4RL_TASKS) + mixed
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  code = ("import sys, mombo_jax.data.names\n"
          "print(sorted(m for m in sys.modules if m.startswith('mombo_jax.settings')))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=root, env=dict(os.environ, PYTHONPATH=root))
  assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


@pytest.mark.parametrize("name", ["hopper-foo", "ant-random", "hopper", ""])
def test_unknown_name_is_a_value_error(root, name, monkeypatch):
  loads = []                   # refused before Minari is asked (counted, not timed: load varies)
  monkeypatch.setattr(minari, "load_dataset", lambda *a, **k: loads.append(a))
  with pytest.raises(ValueError, match="hopper-medium-replay"):  # lists the valid names
    transitions_lib.load_transitions(name, download=True)
  assert loads == []


def test_malformed_id(root):
  with pytest.raises(ValueError, match="Malformed"):
    transitions_lib.load_transitions("a/b/c/", download=False)


def test_missing_dataset_names_the_collect_command(root, monkeypatch):
  # "Fails fast": no download is ever attempted (counted, not timed: a loaded machine is slow).
  downloads, load = [], minari.load_dataset
  monkeypatch.setattr(minari, "load_dataset", lambda name, download=False, **kw: (
      downloads.append(name) if download else None) or load(name, download=False, **kw))
  with pytest.raises(errors.DatasetNotFoundError) as info:
    transitions_lib.load_transitions("walker2d-medium-replay")
  message = str(info.value)
  assert "python -m experiments.collect --env=walker2d-medium-replay" in message
  assert "mombo/walker2d/medium-replay-v0" in message and str(root) in message
  assert info.value.command == "python -m experiments.collect --env=walker2d-medium-replay"
  assert isinstance(info.value, FileNotFoundError)
  # Our own namespace is never downloaded; a public id offline fails fast too.
  with pytest.raises(errors.DatasetNotFoundError, match="only where they were built"):
    transitions_lib.load_transitions("hopper-random", download=True)
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(errors.DatasetNotFoundError, match="HF_HUB_OFFLINE") as info:
    transitions_lib.load_transitions("mujoco/hopper/medium-v0", download=True)
  assert "python -m experiments.collect --env=hopper-medium" in str(info.value)
  monkeypatch.setenv("HF_HUB_OFFLINE", "0")
  monkeypatch.setattr(minari_io, "_reachable", lambda *a, **k: False)
  with pytest.raises(errors.DatasetNotFoundError, match="cannot be reached"):
    transitions_lib.load_transitions("mujoco/hopper/medium-v0", download=True)
  assert downloads == []


def test_a_missing_minari_root_is_refused_and_not_created(tmp_path, monkeypatch):
  """MINARI_DATASETS_PATH=/no/such/path: refused, naming the folder, which stays absent (Minari's
  listing of the local datasets would create it)."""
  root = tmp_path / "no" / "such" / "path"
  monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
  with pytest.raises(errors.DatasetNotFoundError, match=f"none \\({root} does not exist\\)"):
    transitions_lib.load_transitions("hopper-random")
  assert not (tmp_path / "no").exists()


def test_reachability_check_is_bounded(monkeypatch):
  """The probe gives up after its timeout even when the connection attempt hangs (here for 600 s:
  the bound of 60 s below tells a bounded probe from a hanging one on any machine's load)."""
  import threading
  release = threading.Event()

  def hang(*args, **kwargs):
    release.wait(600)
    raise OSError("timed out")
  monkeypatch.setattr(socket, "create_connection", hang)
  start = time.time()
  try:
    assert minari_io._reachable(timeout=0.2) is False
    assert time.time() - start < 60
  finally:
    release.set()


def test_scores_from_metadata_and_fallback(tiny):
  low, high, source = scores.ref_scores(TINY_ID)
  assert (low, high) == TINY_REF and "metadata" in source
  np.testing.assert_allclose(scores.normalized_score(TINY_ID, [[-1.0, 10.0], [4.5, 21.0]]),
                             [[0.0, 100.0], [50.0, 200.0]])
  low, high, source = scores.ref_scores("hopper-random")  # not built here: D4RL fallback
  assert (low, high) == scores.D4RL_REF_SCORES["hopper"] and "D4RL" in source
  normalised = scores.normalized_score("hopper-random", np.array([low, high]))
  np.testing.assert_allclose(normalised, [0.0, 100.0])
  assert scores.normalized_score("walker2d", 4592.3) == pytest.approx(100.0)
  assert scores.ref_scores("halfcheetah")[:2] == (-280.178953, 12135.0)


def test_make_env(tiny):
  env = envs.make_env("hopper-medium")
  assert env.spec.id == "Hopper-v5" and env.spec.max_episode_steps == 1000
  env.close()
  env = envs.make_env(TINY_ID)  # the dataset's own (evaluation) spec
  assert env.spec.id == "Hopper-v5" and env.spec.max_episode_steps == 1000
  env.close()
  for name, gym_id in [("halfcheetah-random", "HalfCheetah-v5"),
                       ("walker2d-expert", "Walker2d-v5")]:
    env = envs.make_env(name)
    assert env.spec.id == gym_id
    env.close()
  with pytest.raises(ValueError):
    envs.make_env("hopper-bad")
