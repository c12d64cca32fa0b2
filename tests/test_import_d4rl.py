"""D4RL's hdf5 layout -> a real Minari dataset whose transitions equal the paper's loader's
(--timeouts=drop) or every row's (keep); the physics check against files simulated in the real envs;
damaged files and failed writes."""
import os
import re
import shlex
import subprocess
import sys

import h5py
import numpy as np
import pytest

from mombo_jax import errors
from mombo_jax.collection import cards, d4rl, d4rl_physics
from mombo_jax.data import d4rl_stats, minari_io, provenance, scores, transitions as transitions_lib
from mombo_jax.env import envs
from tests.conftest import HANG_S

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


def _paper_loader(arrays):
  """The paper's loader: adinlab/MOMBO utils/load_dataset.py qlearning_dataset
  (terminate_on_end=False), transcribed loop for loop."""
  has_next_obs = "next_observations" in arrays
  n = arrays["rewards"].shape[0]
  rows = []
  for i in range(n - 1):
    obs = arrays["observations"][i]
    new_obs = arrays["next_observations"][i] if has_next_obs else arrays["observations"][i + 1]
    done_bool = bool(arrays["terminals"][i])
    final_timestep = arrays["timeouts"][i]
    if final_timestep:
      continue
    if done_bool or final_timestep:
      if not has_next_obs:
        continue
    rows.append((obs, arrays["actions"][i], arrays["rewards"][i], new_obs, float(done_bool)))
  return [np.array(x, np.float32) for x in zip(*rows)]


def _d4rl_qlearning(arrays):
  """D4RL's own d4rl/__init__.py qlearning_dataset (terminate_on_end=False): s' is always the
  next row, whatever the file holds."""
  n = arrays["rewards"].shape[0]
  rows = []
  for i in range(n - 1):
    if arrays["timeouts"][i]:
      continue
    rows.append((arrays["observations"][i], arrays["actions"][i], arrays["rewards"][i],
                 arrays["observations"][i + 1], float(bool(arrays["terminals"][i]))))
  return [np.array(x, np.float32) for x in zip(*rows)]


def _keep_rows(arrays):
  """--timeouts=keep: with next_observations every row and its own s'; without, D4RL's rows."""
  if "next_observations" not in arrays:
    return _d4rl_qlearning(arrays)
  return [np.asarray(arrays[k], np.float32) for k in
          ("observations", "actions", "rewards", "next_observations", "terminals")]


@pytest.mark.parametrize("timeouts", ["drop", "keep"])
@pytest.mark.parametrize("next_obs", [True, False])
def test_round_trip_equals_the_loaders(minari_root, tmp_path, next_obs, timeouts):
  arrays = _arrays(next_obs)
  path = _write(tmp_path / "hopper_medium_replay-v2.hdf5", arrays)
  dataset_id = f"test-d4rl/hopper/medium-replay-{int(next_obs)}{timeouts}-v2"
  options = d4rl.ImportOptions() if timeouts == "drop" else d4rl.ImportOptions(timeouts=timeouts)
  written = d4rl.import_file(path, "hopper-medium-replay", dataset_id, options,
                             log_fn=lambda *_: None)
  assert written == dataset_id
  got = transitions_lib.load_transitions(dataset_id)
  want = _paper_loader(arrays) if timeouts == "drop" else _keep_rows(arrays)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)
  if timeouts == "drop" and next_obs:
    # D4RL's own qlearning_dataset picks the same rows (s, a, r, terminal); only s' differs.
    for field in (0, 1, 2, 4):
      np.testing.assert_array_equal(got[field], _d4rl_qlearning(arrays)[field])
  if timeouts == "drop" and not next_obs:
    assert len(got.rewards) == len(_d4rl_qlearning(arrays)[2]) - 1   # less the terminal row
  assert minari_io.env_name(dataset_id) == "hopper"
  assert scores.ref_scores(dataset_id)[:2] == scores.D4RL_REF_SCORES["hopper"]
  prov = provenance.provenance(dataset_id)
  assert prov["recipe"] == "d4rl-import" and prov["timeouts"] == timeouts
  assert f"--timeouts={timeouts}" in prov["command"]
  card = cards.card_text(dataset_id)
  assert f"(--timeouts={timeouts}" in card
  assert envs.make_env(dataset_id).spec.id == "Hopper-v5"
  if next_obs:
    from mombo_jax.data.minari_io import read_episodes
    episodes = read_episodes(dataset_id)
    # keep: terminal | timeout | cut by the broken chain | timeout | trailing rows
    # drop: the timed-out rows 6 and 9 and the last row 11 go, the chain still cuts after row 7
    lengths = [3, 4, 1, 2, 2] if timeouts == "keep" else [3, 3, 1, 1, 1]
    assert [len(e["rewards"]) for e in episodes] == lengths
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
  with pytest.raises(errors.UserError, match="2 row.*NaN/inf.*first at row 4.*drop_nonfinite=True"):
    d4rl.import_file(path, "hopper-medium", "test-d4rl/hopper/nan-v2", **quiet)
  d4rl.import_file(path, "hopper-medium", "test-d4rl/hopper/nan-v2",
                   d4rl.ImportOptions(drop_nonfinite=True), **quiet)
  got = transitions_lib.load_transitions("test-d4rl/hopper/nan-v2")
  # less the 2 NaN/inf rows, the timed-out rows 6 and 9 and the last row (--timeouts=drop)
  assert len(got.rewards) == 12 - 2 - 3 and np.all(np.isfinite(got.observations))
  with pytest.raises(errors.UserError, match="already exists.*overwrite=True"):
    d4rl.import_file(path, "hopper-medium", "test-d4rl/hopper/nan-v2",
                     d4rl.ImportOptions(drop_nonfinite=True), **quiet)
  with pytest.raises(errors.UserError, match="Unknown dataset name"):
    d4rl.import_file(path, "hopper-mediocre", **quiet)


def test_cli_prints_the_id_last(tmp_path):
  path = _write(tmp_path / "hopper_medium-v2.hdf5", _arrays())
  env = dict(os.environ, MINARI_DATASETS_PATH=str(tmp_path / "root"), HF_HUB_OFFLINE="1")
  out = subprocess.run([sys.executable, "-m", "experiments.import_d4rl", f"--file={path}",
                        "--env=hopper-medium"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=HANG_S)
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip().splitlines()[-1] == "d4rl/hopper/medium-v2"
  assert "--dataset=d4rl/hopper/medium-v2" in out.stdout
  assert "Could not check that" in out.stdout      # infos/qpos without infos/qvel
  # A damaged file: one `error:` line naming it, no traceback.
  damaged = _damaged(tmp_path)["inside"]
  out = subprocess.run([sys.executable, "-m", "experiments.import_d4rl", f"--file={damaged}",
                        "--env=hopper-medium", "--timeouts=keep", "--dataset_id=d4rl/hopper/x-v2"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)
  assert out.returncode == 1 and out.stdout == "" and "Traceback" not in out.stderr
  assert out.stderr.startswith(f"error: {damaged} is not a readable hdf5 file: reading its keys "
                               "failed"), out.stderr
  assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_published_table_and_urls():
  assert d4rl.url("hopper-medium-replay").endswith("gym_mujoco_v2/hopper_medium_replay-v2.hdf5")
  assert d4rl.PUBLISHED["hopper-medium-replay"][0] == 402_000


# ------------------------------------------------------------ files simulated in the real envs

def _simulate(env, rows=300, seed=0, horizon=100):
  """A D4RL-style file's arrays made as D4RL's scripts/generation/mujoco/collect_data.py makes
  them, in gymnasium's env (the walker in its v2 model, as D4RL's data): uniform random actions,
  infos/qpos and infos/qvel recorded before each step, a timeout every `horizon` steps, everything
  stored as float32 / bool."""
  import gymnasium as gym
  kwargs = {}
  if env == "walker2d":
    kwargs["xml_file"] = os.path.join(os.path.dirname(gym.__file__), "envs", "mujoco", "assets",
                                      "walker2d.xml")
  sim = gym.make(envs.GYM_IDS[env], **kwargs).unwrapped
  rng = np.random.default_rng(seed)
  keys = ("observations", "actions", "rewards", "terminals", "timeouts", "next_observations",
          "infos/qpos", "infos/qvel")
  out = {k: [] for k in keys}
  s, _ = sim.reset(seed=seed)
  t = 0
  while len(out["rewards"]) < rows:
    a = rng.uniform(-1, 1, sim.action_space.shape).astype(np.float32)
    qpos, qvel = sim.data.qpos.ravel().copy(), sim.data.qvel.ravel().copy()
    ns, r, done, _, _ = sim.step(a)
    t += 1
    timeout = t == horizon
    for k, v in zip(keys, (s, a, r, done and not timeout, timeout, ns, qpos, qvel)):
      out[k].append(v)
    s = ns
    if done or timeout:
      s, _ = sim.reset(seed=int(rng.integers(1 << 30)))
      t = 0
  sim.close()
  return {k: np.asarray(v, bool if k in ("terminals", "timeouts") else np.float32)
          for k, v in out.items()}


def _write_d4rl(path, arrays):
  with h5py.File(path, "w") as f:
    for k, v in arrays.items():
      f.create_dataset(k, data=v)
    f.create_dataset("metadata/algorithm", data=np.bytes_("SAC"))
  return str(path)


@pytest.fixture(scope="module")
def simulated():
  return {env: _simulate(env) for env in ("halfcheetah", "walker2d", "hopper")}


def test_physics_names_the_env_a_file_replays_as(minari_root, tmp_path, simulated):
  cheetah = _write_d4rl(tmp_path / "halfcheetah_medium-v2.hdf5", simulated["halfcheetah"])
  walker = _write_d4rl(tmp_path / "walker2d_medium-v2.hdf5", simulated["walker2d"])
  lines = []
  # 17 / 6 dims fit walker2d too: only the physics tells.
  with pytest.raises(errors.UserError, match=r"halfcheetah_medium-v2.hdf5 is not walker2d-medium's "
                     r"data: expected walker2d's physics, but .*next observations off by .* they "
                     r"replay as halfcheetah's \(name=halfcheetah-medium\?\)\. Pass "
                     r"check_physics=False") as e:
    d4rl.import_file(cheetah, "walker2d-medium", "test-d4rl/walker2d/wrong-v2", log_fn=lines.append)
  assert "\n" not in str(e.value)
  assert not minari_io.exists_locally("test-d4rl/walker2d/wrong-v2")
  with pytest.raises(errors.UserError, match=r"replay as walker2d's \(name=walker2d-expert\?\)"):
    d4rl.import_file(walker, "halfcheetah-expert", "test-d4rl/halfcheetah/wrong-v2",
                     log_fn=lines.append)
  # The right env passes, and the card says so.
  d4rl.import_file(cheetah, "halfcheetah-medium", "test-d4rl/halfcheetah/right-v2",
                   log_fn=lines.append)
  assert any(line.startswith("Physics check: 32 rows replayed in HalfCheetah-v5") for line in lines)
  note = provenance.provenance("test-d4rl/halfcheetah/right-v2")["physics_check"]
  assert note.startswith("passed: 32 rows replayed")
  assert f"- physics check: {note}" in cards.card_text("test-d4rl/halfcheetah/right-v2")
  for env in ("walker2d", "hopper"):
    result = d4rl_physics.replay_check(simulated[env], env)
    assert result.status == "match" and result.obs_error < 1e-3 and result.reward_error < 1e-3
  # Without the check the wrong env imports, and the provenance says it was not checked.
  d4rl.import_file(cheetah, "walker2d-medium", "test-d4rl/walker2d/unchecked-v2",
                   d4rl.ImportOptions(check_physics=False), log_fn=lines.append)
  assert provenance.provenance("test-d4rl/walker2d/unchecked-v2")["physics_check"] == \
      "not checked (--nocheck_physics)"


def test_physics_refuses_rewards_not_of_the_env(minari_root, tmp_path, simulated):
  arrays = dict(simulated["walker2d"], rewards=simulated["walker2d"]["rewards"] * 2 + 1)
  path = _write_d4rl(tmp_path / "rescaled.hdf5", arrays)
  with pytest.raises(errors.UserError, match=r"rescaled.hdf5 holds walker2d's physics but not its "
                     r"rewards: .*rewards of \d+ non-terminal rows by .*check_physics=False"):
    d4rl.import_file(path, "walker2d-medium", "test-d4rl/walker2d/rescaled-v2",
                     log_fn=lambda *_: None)


def test_physics_without_infos_says_it_could_not_check(minari_root, tmp_path, simulated):
  arrays = {k: v for k, v in simulated["halfcheetah"].items() if not k.startswith("infos/")}
  path = _write_d4rl(tmp_path / "noinfos.hdf5", arrays)
  lines = []
  d4rl.import_file(path, "walker2d-medium", "test-d4rl/walker2d/noinfos-v2", log_fn=lines.append)
  could_not = [line for line in lines if "Could not check" in line]
  assert could_not == [f"Could not check that {path} holds walker2d's physics: the file has no "
                       "infos/qpos and infos/qvel to replay."]
  note = provenance.provenance("test-d4rl/walker2d/noinfos-v2")["physics_check"]
  assert note == "not possible: the file has no infos/qpos and infos/qvel to replay"
  assert f"- physics check: {note}" in cards.card_text("test-d4rl/walker2d/noinfos-v2")


def test_physics_finds_states_recorded_after_the_step(simulated):
  """Files whose infos/qpos, infos/qvel hold the state after each row's step are replayed from the
  previous row's state; states that give no row's observation cannot be checked."""
  arrays = dict(simulated["hopper"])
  arrays["infos/qpos"] = np.roll(arrays["infos/qpos"], -1, axis=0)
  arrays["infos/qvel"] = np.roll(arrays["infos/qvel"], -1, axis=0)
  assert d4rl_physics.replay_check(arrays, "hopper").status == "match"
  arrays["infos/qpos"] = np.zeros_like(arrays["infos/qpos"])
  result = d4rl_physics.replay_check(arrays, "hopper")
  assert result.status == "unchecked" and result.note.startswith("only 0 row(s)")


# ------------------------------------------------------------ damaged files, failed writes

def _damaged(tmp_path):
  """{kind: path} of a valid file truncated, of garbage bytes, empty, and damaged inside (its
  group's heap signature overwritten: it opens, reading its keys fails)."""
  good = open(_write(tmp_path / "good.hdf5", _arrays()), "rb").read()
  assert good.count(b"HEAP") >= 1
  files = {"truncated": good[: len(good) // 2], "garbage": np.random.default_rng(0).bytes(4096),
           "empty": b"", "inside": good.replace(b"HEAP", b"XXXX")}
  out = {}
  for kind, content in files.items():
    out[kind] = str(tmp_path / f"{kind}.hdf5")
    with open(out[kind], "wb") as f:
      f.write(content)
  return out


def test_damaged_hdf5_is_one_line(minari_root, tmp_path):
  for kind, path in _damaged(tmp_path).items():
    with pytest.raises(errors.UserError) as e:
      d4rl.import_file(path, "hopper-medium", f"test-d4rl/hopper/{kind}-v2", log_fn=lambda *_: None)
    message = str(e.value)
    assert message.startswith(f"{path} is not a readable hdf5 file"), message
    assert "\n" not in message
    assert ("reading its keys failed" in message) == (kind == "inside"), message
    assert not minari_io.exists_locally(f"test-d4rl/hopper/{kind}-v2")


def test_a_failed_write_leaves_no_dataset(minari_root, tmp_path, monkeypatch):
  import minari
  path = _write(tmp_path / "f.hdf5", _arrays())
  dataset_id = "test-d4rl/hopper/failed-v2"
  folder = os.path.join(minari_io.datasets_root(), dataset_id)
  real = minari.create_dataset_from_buffers

  def written_then_interrupted(*args, **kwargs):
    real(*args, **kwargs)
    raise KeyboardInterrupt

  def no_card(*args, **kwargs):
    raise OSError("disk full")

  for target, fake, raised in ((minari, written_then_interrupted, KeyboardInterrupt),
                               (cards, no_card, OSError)):
    name = "create_dataset_from_buffers" if target is minari else "write_card"
    with monkeypatch.context() as m:
      m.setattr(target, name, fake)
      with pytest.raises(raised):
        d4rl.import_file(path, "hopper-medium", dataset_id, log_fn=lambda *_: None)
    assert not os.path.exists(folder), name
  # Nothing is left in the way: the import succeeds without --overwrite.
  d4rl.import_file(path, "hopper-medium", dataset_id, log_fn=lambda *_: None)
  assert os.path.isfile(os.path.join(folder, "dataset_card.md"))


def test_card_lines_of_an_import():
  lines = cards._provenance_lines({"recipe": "d4rl-import", "timeouts": "drop",
                                   "physics_check": "passed: 32 rows"})
  assert lines == ["- D4RL rows: timed-out rows and the file's last row skipped "
                   "(--timeouts=drop, the paper's loader)", "- physics check: passed: 32 rows"]
  # Imports from before --timeouts kept every row and checked nothing.
  assert cards._provenance_lines({"recipe": "d4rl-import"}) == [
      "- D4RL rows: timeout mode not recorded (imported before --timeouts: rows kept)",
      "- physics check: not recorded"]


# ------------------------------------------------ what an import records, and what it warns of

def test_the_cards_rebuild_command_reproduces_a_drop_nonfinite_import(minari_root, tmp_path):
  """--drop_nonfinite (and a --dataset_id of one's own) is recorded in the provenance and on the
  card, and the card's rebuild command, run as it stands, writes the same data again."""
  arrays = _arrays()
  arrays["rewards"][4] = np.nan
  arrays["observations"][8, 3] = np.inf
  path = _write(tmp_path / "with nan.hdf5", arrays)          # a path the command must quote
  dataset_id = "test-d4rl/hopper/rebuild-v2"
  d4rl.import_file(path, "hopper-medium", dataset_id, d4rl.ImportOptions(drop_nonfinite=True),
                   log_fn=lambda *_: None)
  before = provenance.fingerprint(transitions_lib.load_transitions(dataset_id, cache=False))
  prov = provenance.provenance(dataset_id)
  assert prov["drop_nonfinite"] is True and prov["nonfinite_rows_dropped"] == 2
  with open(os.path.join(minari_io.datasets_root(), dataset_id, "dataset_card.md")) as f:
    card = f.read()
  assert "- non-finite rows: 2 row(s) holding NaN/inf dropped (--drop_nonfinite)" in card
  argv = shlex.split(re.search(r"^- rebuild: `(.*)`$", card, re.M).group(1))
  assert argv[:3] == ["python", "-m", "experiments.import_d4rl"], argv
  assert "--drop_nonfinite" in argv and f"--dataset_id={dataset_id}" in argv
  out = subprocess.run([sys.executable] + argv[1:], cwd=REPO, capture_output=True, text=True,
                       timeout=HANG_S, env=dict(os.environ, HF_HUB_OFFLINE="1"))
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip().splitlines()[-1] == dataset_id
  assert provenance.fingerprint(transitions_lib.load_transitions(dataset_id, cache=False)) == before


def test_a_file_far_from_its_names_statistics_gets_a_warning(minari_root, tmp_path, simulated):
  """A uniform-random policy's hopper file imported as hopper-medium: one warning line with both
  numbers (recorded in the provenance and on the card); named hopper-random it passes;
  check_quality=False silences it."""
  path = _write_d4rl(tmp_path / "random.hdf5", simulated["hopper"])
  lines = []
  d4rl.import_file(path, "hopper-medium", "test-d4rl/hopper/q-medium-v2", log_fn=lines.append)
  warned = [line for line in lines if line.startswith("warning:")]
  assert len(warned) == 1 and "\n" not in warned[0], lines
  assert re.search(rf"^warning: {re.escape(path)} does not look like D4RL's hopper-medium: mean "
                   r"episode return \d+\.\d \(normalised \d\.\d\) over \d+ episodes; D4RL's "
                   r"published hopper-medium-v2 has 1422\.1: normalised 44\.3 \(accepted 33\.2 "
                   r"to 55\.4\)\. Is --env right\? \(Pass --nocheck_quality", warned[0]), warned[0]
  note = provenance.provenance("test-d4rl/hopper/q-medium-v2")["quality_check"]
  assert note.startswith("far from D4RL's: mean episode return")
  assert f"- quality check: {note}" in cards.card_text("test-d4rl/hopper/q-medium-v2")
  lines = []
  d4rl.import_file(path, "hopper-random", "test-d4rl/hopper/q-random-v2", log_fn=lines.append)
  assert not any(line.startswith("warning:") for line in lines), lines
  assert any(line.startswith("Quality check: mean episode return") for line in lines), lines
  lines = []
  d4rl.import_file(path, "hopper-medium", "test-d4rl/hopper/q-quiet-v2",
                   d4rl.ImportOptions(check_quality=False), log_fn=lines.append)
  assert not any(line.startswith("warning:") for line in lines), lines
  prov = provenance.provenance("test-d4rl/hopper/q-quiet-v2")
  assert prov["quality_check"] == "not checked (--nocheck_quality)"
  assert "--nocheck_quality" in shlex.split(prov["command"])


def test_quality_expectations():
  """Published means pass near themselves; other qualities are far; medium-expert spans medium
  to expert; random expects D4RL's random reference return; a mixed name has no statistics."""
  check = lambda name, returns: d4rl_stats.quality_check(name, returns)[0]  # noqa: E731
  assert check("hopper-medium", [1300.0, 1500.0]) is True
  assert check("hopper-expert", [1422.0]) is False              # a medium file named expert
  assert check("hopper-medium-replay", [18.5]) is False         # a random one named medium-replay
  assert check("hopper-medium", [467.3]) is False               # medium-replay named medium
  assert check("hopper-medium-expert", [2500.0]) is True
  assert check("hopper-medium-expert", [467.3]) is False
  assert check("walker2d-random", [1.6]) is True and check("walker2d-random", [2852.0]) is False
  assert check("halfcheetah-random", [-280.0]) is True
  assert check("hopper-random-medium-50pct", [0.0]) is None
  assert d4rl.PUBLISHED is d4rl_stats.PUBLISHED


def test_cli_refusal_is_one_line_without_mujoco_noise(tmp_path, simulated):
  """MuJoCo's deprecation warning of gymnasium's half_cheetah.xml (`settotalmass`, built while
  the physics check tries the other env of these dims) no longer precedes the one-line refusal,
  nor leaves a MUJOCO_LOG.TXT behind; --nocheck_quality silences the quality warning."""
  cheetah = _write_d4rl(tmp_path / "halfcheetah_medium-v2.hdf5", simulated["halfcheetah"])
  env = dict(os.environ, MINARI_DATASETS_PATH=str(tmp_path / "root"), HF_HUB_OFFLINE="1",
             PYTHONPATH=REPO)
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  out = subprocess.run([sys.executable, "-m", "experiments.import_d4rl", f"--file={cheetah}",
                        "--env=walker2d-medium"], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=HANG_S)
  assert out.returncode == 1 and out.stdout == "", out.stdout
  assert out.stderr.startswith(f"error: {cheetah} is not walker2d-medium's data"), out.stderr
  assert len(out.stderr.splitlines()) == 1, out.stderr
  assert os.listdir(cwd) == []
  hopper = _write_d4rl(tmp_path / "hopper_random.hdf5", simulated["hopper"])
  out = subprocess.run([sys.executable, "-m", "experiments.import_d4rl", f"--file={hopper}",
                        "--env=hopper-medium", "--nocheck_quality"], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=HANG_S)
  assert out.returncode == 0 and "warning" not in out.stdout + out.stderr, out.stdout + out.stderr
