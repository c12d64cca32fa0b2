"""policy.load_policy / Policy / export and render: a run's seed as a callable policy (evaluation's
action, computed here independently), its export round trip, refusals of bad seeds and damaged
files in one line, episode videos rendered headless, and the two entry points. That the policy
reproduces a real run's recorded evaluation returns is tested in tests/test_run.py (it needs a
trained run)."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from experiments import _cli as cli_shell
from mombo_jax.analysis import policy as policy_lib, render
from mombo_jax.core import sac
from mombo_jax.errors import UserError
from mombo_jax.records.workdir import Workdir
from mombo_jax.run import run_state
from tests.conftest import HANG_S
from tests.conftest_runs import DATASET, tiny_run  # noqa: F401


@pytest.fixture(scope="module")
def policy(tiny_run):
  workdir, _ = tiny_run
  return policy_lib.load_policy(workdir, seed=1)


def _one_line(e):
  return "\n" not in str(e.value)


def _numpy_mode(actor_variables, obs):
  """tanh(mean) [B, A] of the actor, by hand from its layers (sac.actor_layers), in float64."""
  hidden, (w_mean, b_mean), _ = sac.actor_layers(actor_variables)
  x = np.asarray(obs, np.float64)
  for w, b in hidden:
    x = np.maximum(x @ np.asarray(w, np.float64) + np.asarray(b, np.float64), 0.0)
  return np.tanh(x @ np.asarray(w_mean, np.float64) + np.asarray(b_mean, np.float64))


def test_a_run_seed_is_a_callable_policy(tiny_run, policy):
  workdir, state = tiny_run
  assert (policy.env_name, policy.dataset, policy.obs_dim, policy.action_dim) == (
      "hopper", DATASET, 11, 3)
  assert policy.seed == 1 and policy.epoch == 2 and policy.config["num_seeds"] == 2
  assert policy.hidden_dims == tuple(policy.config["actor_hidden"])
  obs = np.random.default_rng(0).normal(size=(5, 11))       # float64 in: cast as evaluation does
  batch = policy(obs)
  assert batch.shape == (5, 3) and batch.dtype == np.float32
  single = policy(obs[2])
  assert single.shape == (3,)
  np.testing.assert_allclose(single, batch[2], rtol=1e-6, atol=1e-7)
  seed1 = jax.tree.map(lambda x: np.asarray(x)[1], state.agent.actor.params)   # index 1 - seed 0
  np.testing.assert_allclose(batch, _numpy_mode(seed1, obs.astype(np.float32)), atol=1e-5)
  seed0 = policy_lib.load_policy(workdir)                    # default: the run's first seed
  assert seed0.seed == 0 and not np.allclose(seed0(obs), batch)
  with pytest.raises(ValueError, match=r"obs must have shape \[11\]"):
    policy(np.zeros(17))


def test_sampled_actions_differ_and_stay_in_range(policy):
  obs = np.random.default_rng(1).normal(size=(64, 11))
  sampled = policy(obs, sample=True, key=jax.random.PRNGKey(3))
  assert sampled.shape == (64, 3)
  assert np.all(sampled >= policy.action_low) and np.all(sampled <= policy.action_high)
  assert not np.allclose(sampled, policy(obs))
  np.testing.assert_array_equal(sampled, policy(obs, sample=True, key=3))   # an int seeds a key
  assert not np.allclose(sampled, policy(obs, sample=True, key=4))
  with pytest.raises(ValueError, match="needs key"):
    policy(obs, sample=True)


def test_export_round_trip(tiny_run, policy, tmp_path):
  workdir, _ = tiny_run
  path = str(tmp_path / "p.msgpack")
  exported = policy_lib.export_policy(workdir, 1, path)
  loaded = policy_lib.load_policy(path)
  jax.tree.map(np.testing.assert_array_equal, loaded.params, policy.params)
  for field in ("env_name", "dataset", "obs_dim", "action_dim", "hidden_dims", "seed", "epoch",
                "config", "log_std_min", "log_std_max", "action_dtype", "eval_env"):
    assert getattr(loaded, field) == getattr(exported, field), field
  # The env its run was evaluated in travels with it (rendering builds it; tests/test_eval_env.py).
  from mombo_jax.env import envs
  assert loaded.eval_env == envs.standard_env_spec("hopper") == envs.eval_env_spec(DATASET)
  np.testing.assert_array_equal(loaded.action_low, policy.action_low)
  obs = np.random.default_rng(2).normal(size=(7, 11))
  np.testing.assert_array_equal(loaded(obs), policy(obs))
  np.testing.assert_array_equal(loaded(obs, sample=True, key=0), policy(obs, sample=True, key=0))
  assert policy_lib.load_policy(path, seed=1).seed == 1
  with pytest.raises(UserError, match="holds seed 1, not 0") as e:
    policy_lib.load_policy(path, seed=0)
  assert _one_line(e)


def test_bad_seeds_steps_and_diverged_seeds_are_refused(tiny_run, tmp_path):
  workdir, state = tiny_run
  for seed in (2, -1):
    # The API speaks Python (seed=), the command lines their flags (experiments/_cli.py).
    with pytest.raises(UserError, match=r"holds seeds 0\.\.1; seed .* is not one of them\. Pass "
                       r"one of seed=0 \.\. seed=1\.$") as e:
      policy_lib.load_policy(workdir, seed=seed)
    assert _one_line(e) and "--" not in str(e.value)
    assert e.value.params == ("seed",)
    assert cli_shell.in_flags(e.value, known=["seed"]).endswith("Pass one of --seed=0 .. --seed=1.")
  with pytest.raises(UserError, match=r"no checkpoint step 7 \(it has \[2\]\)"):
    policy_lib.load_policy(workdir, step=7)
  with pytest.raises(UserError, match="does not exist"):
    policy_lib.load_policy(str(tmp_path / "nowhere"))
  with pytest.raises(UserError, match="config.json is missing"):
    policy_lib.load_policy(str(tmp_path))
  # A run whose seed 1 diverged: refused unless asked for; seed 0 loads.
  wd = Workdir(str(tmp_path / "diverged"))
  wd.write_config(Workdir(workdir).read_record())
  ckpt = run_state.checkpointer(wd)
  ckpt.save(2, state, {"epoch": 2, "diverged": [{"seed": 1, "epoch": 1, "quantity": "q"}]})
  ckpt.close()
  with pytest.raises(UserError, match="Seed 1 .* diverged at epoch 1 .*pass allow_diverged=True "
                     "to load it") as e:
    policy_lib.load_policy(wd.path, seed=1)
  assert _one_line(e) and "--" not in str(e.value)
  assert "pass --allow_diverged to load it" in cli_shell.in_flags(e.value, known=["allow_diverged"])
  assert policy_lib.load_policy(wd.path, seed=1, allow_diverged=True).seed == 1
  assert policy_lib.load_policy(wd.path, seed=0).seed == 0


def test_damaged_and_foreign_files_are_refused_in_one_line(policy, tmp_path):
  from flax import serialization
  good = policy.save(str(tmp_path / "good.msgpack"))
  raw = open(good, "rb").read()
  cases = {
      "garbage": (os.urandom(64), "not a readable policy file|not a mombo_jax policy file"),
      "truncated": (raw[:len(raw) // 2], "not a readable policy file"),
      "foreign": (serialization.msgpack_serialize({"params": {"w": np.zeros(3)}}),
                  "not a mombo_jax policy file"),
      "other_format": (serialization.msgpack_serialize({"meta": {"format": "x/9"}}),
                       "format 'x/9'"),
  }
  # One float of the parameters altered in place: the CRC32 refuses it.
  flipped = bytearray(raw)
  kernel = np.asarray(policy.params["params"]["Dense_0"]["kernel"]).tobytes()
  at = raw.index(kernel[:32]) + 8
  flipped[at] ^= 0x40
  cases["flipped"] = (bytes(flipped), "CRC32")
  # Parameters that do not fit the actor the metadata describes.
  meta = policy.metadata()
  cases["misfit"] = (serialization.msgpack_serialize(
      {"meta": dict(meta, hidden_dims=[7]), "params": policy.params}), "do not fit the \\[7\\]")
  for name, (blob, match) in cases.items():
    path = tmp_path / f"{name}.msgpack"
    path.write_bytes(blob)
    with pytest.raises(UserError, match=match) as e:
      policy_lib.load_policy(str(path))
    assert _one_line(e), name
  with pytest.raises(UserError, match="step= does not apply"):
    policy_lib.load_policy(good, step=2)


@pytest.fixture(scope="module")
def renderer():
  """The headless renderer (render.choose_backend), or a skip where none works; .ci/run installs
  one and sets MOMBO_JAX_REQUIRE_RENDERER, so that CI fails instead of skipping."""
  try:
    return render.choose_backend()
  except UserError as e:
    if os.environ.get("MOMBO_JAX_REQUIRE_RENDERER"):
      raise
    pytest.skip(f"no headless renderer here: {e}")


def test_render_a_gif(policy, renderer, tmp_path):
  from PIL import Image, ImageSequence
  out = str(tmp_path / "ep.gif")
  video = render.Video(episodes=2, env_seed=5, width=64, height=48, max_steps=3)
  results = render.render(policy, out, video, log=lambda *a: None)
  assert [r["env_seed"] for r in results] == [5, 6]
  assert all(r["length"] == 3 and r["ended"] == "max_steps" for r in results)
  assert all(np.isfinite(r["return"]) and np.isfinite(r["normalized_score"]) for r in results)
  with Image.open(out) as gif:
    assert gif.size == (64, 48)
    frames = [np.asarray(f.convert("RGB"), np.float64) for f in ImageSequence.Iterator(gif)]
    played = sum(f.info["duration"] for f in ImageSequence.Iterator(gif))
  # Two pictures an episode (t=0, then t=3 held for HOLD_SECONDS): Pillow stores a held frame
  # once with the summed duration. Played: (2 + 31) frames an episode at 31.25 fps (hopper's dt
  # 0.008 s, every 4th step; see test_render_an_mp4), GIF durations in 10 ms units.
  assert len(frames) == 4 and abs(played - 2 * 33 * 32) <= 10 * len(frames), (len(frames), played)
  assert all(f.std() > 10 for f in frames)                          # not blank
  assert not np.array_equal(frames[0], frames[1]) and not np.array_equal(frames[0], frames[2])


def _decode(program, path):
  """The video's frames [N, H, W, 3] uint8, decoded by the ffmpeg program that wrote it; (W, H)
  as ffmpeg reads the stream's header."""
  import re
  probe = subprocess.run([program, "-hide_banner", "-i", str(path)], capture_output=True,
                         text=True)
  size = re.search(r"Video: h264\b.*?, (\d+)x(\d+)", probe.stderr)
  assert size, probe.stderr
  w, h = int(size.group(1)), int(size.group(2))
  raw = subprocess.run([program, "-v", "error", "-i", str(path), "-f", "rawvideo", "-pix_fmt",
                        "rgb24", "-"], capture_output=True, check=True).stdout
  assert len(raw) % (w * h * 3) == 0, (len(raw), w, h)
  return np.frombuffer(raw, np.uint8).reshape(-1, h, w, 3), (w, h)


@pytest.mark.skipif(render._ffmpeg() is None, reason="no ffmpeg program (apt-get install ffmpeg)")
def test_render_an_mp4(policy, renderer, tmp_path, monkeypatch):
  """The video holds the frames rendered: their number (hopper: dt 0.008 s, so every 4th step is
  kept for 30 fps, 31.25 fps played; max_steps=2 gives the first frame and step 2's, then step
  2's held for round(HOLD_SECONDS * 31.25) = 31 more), their size (an odd width padded to even
  for H.264's 4:2:0), and their picture (not blank; what the renderer drew, up to H.264's loss)."""
  drawn = []
  add = render._Mp4.add
  monkeypatch.setattr(render._Mp4, "add", lambda self, frame: (drawn.append(np.array(frame)),
                                                              add(self, frame)))
  out = tmp_path / "ep.mp4"
  render.render(policy, str(out), render.Video(width=33, height=24, max_steps=2),
                log=lambda *a: None)
  frames, size = _decode(render._ffmpeg(), out)
  assert len(drawn) == 2 + 31 and drawn[0].shape == (24, 33, 3)
  assert size == (34, 24) and frames.shape == (len(drawn), 24, 34, 3)
  frames = frames[:, :, :33].astype(np.float64)               # the padded column dropped
  drawn = np.stack(drawn).astype(np.float64)
  # Not blank: a scene and its overlay, not one flat colour (a flat frame has std 0; these ~50).
  assert np.all(drawn.std(axis=(1, 2, 3)) > 10) and np.all(frames.std(axis=(1, 2, 3)) > 10)
  assert not np.array_equal(drawn[0], drawn[1])               # t=0, then t=2
  np.testing.assert_array_equal(drawn[2:], drawn[1:-1])       # then t=2 held
  # Each decoded frame is the one drawn, up to H.264's loss (mean absolute error on the 0-255
  # scale: ~3 measured; a flat frame of the mean colour is ~40 away).
  error = np.abs(frames - drawn).mean(axis=(1, 2, 3))
  assert np.all(error < 8), error


class _BrokenGL:
  """An env whose renderer cannot make its context, as on a machine without EGL / OSMesa."""
  unwrapped = dt = None

  def reset(self, seed=None):
    return np.zeros(11), {}

  def render(self):
    raise RuntimeError("eglInitialize failed:\n EGL_NOT_INITIALIZED")

  def close(self):
    pass


def test_video_and_renderer_problems_are_one_line(policy, tmp_path, monkeypatch):
  from mombo_jax.env import envs
  with pytest.raises(UserError, match="written as .gif or .mp4") as e:
    render.render(policy, str(tmp_path / "ep.avi"))
  assert _one_line(e)
  with monkeypatch.context() as m:
    m.setattr(render, "_ffmpeg", lambda: None)
    with pytest.raises(UserError, match="needs the ffmpeg program: apt-get install ffmpeg") as e:
      render.render(policy, str(tmp_path / "ep.mp4"))
    assert _one_line(e)
  with monkeypatch.context() as m:   # a renderer that fails when gymnasium makes its context
    m.setattr(render, "choose_backend", lambda: "egl")
    m.setattr(envs, "make_env", lambda *a, **k: _BrokenGL())
    with pytest.raises(UserError, match="renderer failed \\(MUJOCO_GL=egl: RuntimeError: egl"
                                        ".*apt-get install libegl1.*libosmesa6") as e:
      render.render(policy, str(tmp_path / "ep.gif"))
    assert _one_line(e)
  monkeypatch.setenv("MUJOCO_GL", "nogl")      # MuJoCo itself refuses it at import
  with pytest.raises(UserError, match="MUJOCO_GL=nogl is not a renderer.*libosmesa6") as e:
    render.choose_backend()
  assert _one_line(e)
  monkeypatch.delenv("MUJOCO_GL")              # unset, and no renderer works
  monkeypatch.setattr(render, "_chosen", None)
  monkeypatch.setattr(render, "backend_works", lambda backend: False)
  with pytest.raises(UserError, match="cannot render headless .*apt-get install libosmesa6") as e:
    render.choose_backend()
  assert _one_line(e)


def _cli(module, args, **env_extra):
  env = dict(os.environ, PYTHONUNBUFFERED="1", **env_extra)
  return subprocess.run([sys.executable, "-m", module] + args, capture_output=True, text=True,
                        timeout=HANG_S, env=env)


def _error_line(out):
  assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
  lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
  return lines[0]


def test_export_and_render_entry_points(tiny_run, policy, tmp_path):
  workdir, _ = tiny_run
  out = tmp_path / "s1.msgpack"
  done = _cli("experiments.export", [f"--run={workdir}", "--seed=1", f"--out={out}"])
  assert done.returncode == 0, done.stderr
  obs = np.random.default_rng(3).normal(size=(4, 11))
  np.testing.assert_array_equal(policy_lib.load_policy(str(out))(obs), policy(obs))
  assert "unexpected argument(s) stray" in _error_line(
      _cli("experiments.export", [f"--run={workdir}", "stray"]))
  assert _error_line(_cli("experiments.export", [f"--run={workdir}", "--seed=5"])).endswith(
      "seed 5 is not one of them. Pass one of --seed=0 .. --seed=1.")
  gif = tmp_path / "s1.gif"
  # A renderer that cannot load (PyOpenGL bound to another platform): one line, no traceback.
  assert "renderer failed (MUJOCO_GL=osmesa: ImportError" in _error_line(_cli(
      "experiments.render", [f"--policy={out}", f"--out={gif}"],
      MUJOCO_GL="osmesa", PYOPENGL_PLATFORM="egl"))
  assert not gif.exists()


def test_render_entry_point(tiny_run, renderer, tmp_path):
  workdir, _ = tiny_run
  gif = tmp_path / "s1.gif"
  done = _cli("experiments.render", [f"--run={workdir}", "--seed=1", f"--out={gif}", "--width=32",
                                     "--height=32", "--max_steps=2"])
  assert done.returncode == 0, done.stderr
  assert gif.stat().st_size > 0 and "normalised score" in done.stdout
  assert "--flag=false" in _error_line(
      _cli("experiments.render", [f"--run={workdir}", f"--out={gif}", "--overlay", "false"]))


def test_render_creates_the_folder_of_its_out(tmp_path):
  """--out into a folder that does not exist: created (as experiments.export creates its file's),
  before anything renders; a folder that cannot be made is one line."""
  gif = tmp_path / "videos" / "hopper" / "s1.gif"
  assert render.check_out(str(gif)) is None
  assert gif.parent.is_dir() and not gif.exists()
  (tmp_path / "file").write_text("")
  with pytest.raises(UserError, match=r"Cannot create the folder .*file/sub of .*; pass another "
                     r"`out`\.") as e:
    render.check_out(str(tmp_path / "file" / "sub" / "x.gif"))
  assert _one_line(e)
