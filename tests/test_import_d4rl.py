"""D4RL's hdf5 layout -> a real Minari dataset whose transitions equal D4RL's qlearning_dataset."""
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from mombo_jax import d4rl, data, envs, errors, names, provenance, scores

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
S, A = 11, 3


def _arrays(next_obs=True):
  """12 rows: a 3-step episode ending in a terminal, a 4-step one ending in a timeout, a 3-step one
  whose stored next observation breaks the chain after its first row, and 2 trailing rows."""
  rng = np.random.default_rng(0)
  n = 12
  obs = rng.normal(size=(n, S)).astype(np.float32)
  nxt = np.concatenate([obs[1:], rng.normal(size=(1, S)).astype(np.float32)])
  terminals = np.zeros(n, bool)
  timeouts = np.zeros(n, bool)
  terminals[2] = True
  nxt[2] = rng.normal(size=S)          # a terminal's s' is whatever the env returned
  timeouts[6] = True
  nxt[6] = rng.normal(size=S)          # the true s' after a timeout is not the next row's s
  nxt[7] = rng.normal(size=S)          # a broken chain inside an episode (D4RL files have some)
  timeouts[9] = True
  out = dict(observations=obs, actions=rng.uniform(-1, 1, (n, A)).astype(np.float32),
             rewards=rng.normal(size=n).astype(np.float32), terminals=terminals,
             timeouts=timeouts)
  if next_obs:
    out["next_observations"] = nxt
  return out


def _write(path, arrays, metadata=True):
  with h5py.File(path, "w") as f:
    for k, v in arrays.items():
      f.create_dataset(k, data=v)
    f.create_dataset("infos/qpos", data=np.zeros((len(arrays["rewards"]), 6)))
    if metadata:
      f.create_dataset("metadata/algorithm", data=np.bytes_("SAC"))
      f.create_dataset("metadata/policy/nonlinearity", data=np.bytes_("relu"))
  return str(path)


def _qlearning(arrays):
  """D4RL's qlearning_dataset (terminate_on_end=False), written out directly."""
  obs, n = arrays["observations"], len(arrays["rewards"])
  has_next = "next_observations" in arrays
  rows = []
  for i in range(n if has_next else n - 1):
    if arrays["timeouts"][i] and not has_next:
      continue
    new_obs = arrays["next_observations"][i] if has_next else obs[i + 1]
    rows.append((obs[i], arrays["actions"][i], arrays["rewards"][i], new_obs,
                 float(arrays["terminals"][i])))
  return [np.array(x, np.float32) for x in zip(*rows)]


@pytest.mark.parametrize("next_obs", [True, False])
def test_round_trip_equals_qlearning_dataset(minari_root, tmp_path, next_obs):
  arrays = _arrays(next_obs)
  path = _write(tmp_path / "hopper_medium_replay-v2.hdf5", arrays)
  dataset_id = f"test-d4rl/hopper/medium-replay-{int(next_obs)}-v2"
  written = d4rl.import_file(path, "hopper-medium-replay", dataset_id,
                                    log_fn=lambda *_: None)
  assert written == dataset_id
  got = data.load_transitions(dataset_id)
  want = _qlearning(arrays)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
  assert names.env_name(dataset_id) == "hopper"
  assert scores.ref_scores(dataset_id)[:2] == scores.D4RL_REF_SCORES["hopper"]
  assert provenance.provenance(dataset_id)["recipe"] == "d4rl-import"
  assert envs.make_env(dataset_id).spec.id == "Hopper-v5"
  if next_obs:
    from mombo_jax.minari_io import read_episodes
    episodes = read_episodes(dataset_id)
    # terminal | timeout | cut by the broken chain | timeout | trailing rows
    assert [len(e["rewards"]) for e in episodes] == [3, 4, 1, 2, 2]
    assert [bool(e["terminations"][-1]) for e in episodes] == [True, False, False, False, False]


def test_refusals(minari_root, tmp_path):
  quiet = dict(log_fn=lambda *_: None)
  with pytest.raises(errors.UserError, match="does not exist.*hopper_medium_replay-v2.hdf5"):
    d4rl.import_file(str(tmp_path / "nope.hdf5"), "hopper-medium-replay", **quiet)
  arrays = _arrays()
  del arrays["timeouts"]
  with pytest.raises(errors.UserError, match="not in D4RL's layout: missing timeouts"):
    d4rl.import_file(_write(tmp_path / "a.hdf5", arrays), "hopper-medium", **quiet)
  with pytest.raises(errors.UserError, match="obs dim 11 and action dim 3, but walker2d"):
    d4rl.import_file(_write(tmp_path / "b.hdf5", _arrays()), "walker2d-medium", **quiet)
  arrays = _arrays()
  arrays["rewards"][4] = np.nan
  arrays["observations"][8, 3] = np.inf
  path = _write(tmp_path / "c.hdf5", arrays)
  with pytest.raises(errors.UserError, match="2 row.*NaN/inf.*first at row 4.*--drop_nonfinite"):
    d4rl.import_file(path, "hopper-medium", "test-d4rl/hopper/nan-v2", **quiet)
  d4rl.import_file(path, "hopper-medium", "test-d4rl/hopper/nan-v2", drop_nonfinite=True,
                          **quiet)
  got = data.load_transitions("test-d4rl/hopper/nan-v2")
  assert len(got.rewards) == 12 - 2 and np.all(np.isfinite(got.observations))
  with pytest.raises(errors.UserError, match="already exists.*--overwrite"):
    d4rl.import_file(path, "hopper-medium", "test-d4rl/hopper/nan-v2", drop_nonfinite=True,
                            **quiet)
  with pytest.raises(errors.UserError, match="Unknown dataset name"):
    d4rl.import_file(path, "hopper-mediocre", **quiet)


def test_cli_prints_the_id_last(tmp_path):
  path = _write(tmp_path / "hopper_medium-v2.hdf5", _arrays())
  env = dict(os.environ, MINARI_DATASETS_PATH=str(tmp_path / "root"), HF_HUB_OFFLINE="1")
  out = subprocess.run([sys.executable, "-m", "experiments.import_d4rl", f"--file={path}",
                        "--env=hopper-medium"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip().splitlines()[-1] == "d4rl/hopper/medium-v2"
  assert "--dataset=d4rl/hopper/medium-v2" in out.stdout
  bad = subprocess.run([sys.executable, "-m", "experiments.import_d4rl", f"--file={path}",
                        "--env=hopper-medium"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=120)
  assert bad.returncode == 1 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr


def test_published_table_and_urls():
  assert d4rl.url("hopper-medium-replay").endswith("gym_mujoco_v2/hopper_medium_replay-v2.hdf5")
  assert d4rl.PUBLISHED["hopper-medium-replay"][0] == 402_000
