"""Episode videos of a trained policy (policy.Policy), rendered headless by MuJoCo.

    render.render(policy, "hopper.gif", render.Video(episodes=1, width=320, height=240))

The policy acts deterministically (tanh(mean), evaluation's action) in the gymnasium env made with
render_mode="rgb_array"; episode i is reset with env_seed + i and runs to termination, the time
limit, or max_steps. Frames are kept at about FPS frames per second of simulated time (every k-th
env step, k = round(1 / (env dt * FPS)): the video plays in real time) and each episode's last
frame is held for HOLD_SECONDS. An overlay (overlay=False: none) names the dataset, seed and
epoch and shows the step, the running return and its D4RL-normalised score
(scores.normalized_score): the last frame of an episode shows its final return and score.

Formats, by the file's suffix: .gif through Pillow (installed with matplotlib); .mp4 through an
ffmpeg program: `ffmpeg` on PATH (apt-get install ffmpeg) or the one the imageio-ffmpeg package
ships (pip install imageio-ffmpeg); without either, a UserError says so before anything renders.

Renderer: MUJOCO_GL as set; when unset, the first of egl and osmesa that renders in a child
process (choose_backend) is set for this process. A missing or unusable renderer is one UserError
naming the Debian packages (libegl1, libosmesa6) and the MUJOCO_GL setting.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import shutil
import subprocess
import sys
import warnings
from typing import Callable, List, Optional

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from mombo_jax.data import scores
from mombo_jax.env import envs
from mombo_jax.errors import UserError

BACKENDS = ("egl", "osmesa")
FORMATS = (".gif", ".mp4")
FPS = 30.0
HOLD_SECONDS = 1.0
INSTALL_HINT = ("install a headless OpenGL renderer: apt-get install libegl1 (then MUJOCO_GL=egl) "
                "or apt-get install libosmesa6 (then MUJOCO_GL=osmesa)")
_PROBE = ("import mujoco; r = mujoco.Renderer(mujoco.MjModel.from_xml_string('<mujoco/>'), 8, 8); "
          "r.render(); r.close()")
_chosen: Optional[str] = None


def _one_line(e: BaseException, limit: int = 300) -> str:
  text = " ".join(str(e).split()) or type(e).__name__
  return f"{type(e).__name__}: {text[:limit]}"


def backend_works(backend: str, timeout: float = 120) -> bool:
  """Whether MuJoCo renders with MUJOCO_GL=backend, tried in a child process (a process can load
  only one OpenGL platform, so a failed try would spoil this one)."""
  env = dict(os.environ, MUJOCO_GL=backend, PYOPENGL_PLATFORM=backend)
  try:
    done = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                          timeout=timeout)
  except (OSError, subprocess.TimeoutExpired):
    return False
  return done.returncode == 0


def choose_backend() -> str:
  """MUJOCO_GL when set; else the first of BACKENDS that works (backend_works), which is then set
  in os.environ for this process (gymnasium reads it when it makes the render context). UserError
  naming the packages when none works."""
  global _chosen
  if os.environ.get("MUJOCO_GL"):
    backend = os.environ["MUJOCO_GL"]
    if backend.lower().strip() not in BACKENDS + ("glfw",):
      # MuJoCo refuses other values at import (RuntimeError), gymnasium when it renders.
      raise UserError(f"MUJOCO_GL={backend} is not a renderer gymnasium's MuJoCo envs know; set "
                      "MUJOCO_GL=egl or MUJOCO_GL=osmesa (or unset it to pick one), and "
                      f"{INSTALL_HINT}.")
    return backend
  if _chosen is None:
    platform = os.environ.get("PYOPENGL_PLATFORM", "").lower()
    order = [platform] if platform in BACKENDS else list(BACKENDS)
    _chosen = next((b for b in order if backend_works(b)), "")
  if not _chosen:
    raise UserError(f"MuJoCo cannot render headless here (MUJOCO_GL unset; tried "
                    f"{', '.join(BACKENDS)}): {INSTALL_HINT}.")
  os.environ["MUJOCO_GL"] = _chosen
  return _chosen


def _ffmpeg() -> Optional[str]:
  """An ffmpeg program: on PATH, else imageio-ffmpeg's, else None."""
  found = shutil.which("ffmpeg")
  if found:
    return found
  try:
    import imageio_ffmpeg  # optional: not an install dependency
    return imageio_ffmpeg.get_ffmpeg_exe()
  except Exception:  # not installed, or its binary missing
    return None


class _Gif:
  """Frames [H, W, 3] uint8 -> an animated GIF (Pillow), written at close()."""

  def __init__(self, path: str, fps: float):
    self.path, self.duration, self.frames = path, 1000.0 / fps, []

  def add(self, frame: np.ndarray):
    # Palette images: a byte a pixel held, not three.
    self.frames.append(Image.fromarray(frame).convert("P", palette=Image.Palette.ADAPTIVE))

  def abort(self):
    self.frames = []

  def close(self):
    if not self.frames:
      return
    self.frames[0].save(self.path, save_all=True, append_images=self.frames[1:],
                        duration=self.duration, loop=0, disposal=1)


class _Mp4:
  """Frames [H, W, 3] uint8 piped to ffmpeg (H.264, yuv420p: plays everywhere)."""

  def __init__(self, path: str, fps: float, program: str):
    self.path, self.fps, self.program, self.proc = path, fps, program, None

  def add(self, frame: np.ndarray):
    if self.proc is None:
      h, w = frame.shape[:2]
      self.proc = subprocess.Popen(
          [self.program, "-y", "-loglevel", "error", "-f", "rawvideo", "-pix_fmt", "rgb24",
           "-s", f"{w}x{h}", "-framerate", f"{self.fps:g}", "-i", "-", "-an",
           "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2", "-c:v", "libx264", "-pix_fmt", "yuv420p",
           self.path], stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
      self.proc.stdin.write(np.ascontiguousarray(frame, np.uint8).tobytes())
    except BrokenPipeError:
      self.close()

  def abort(self):
    if self.proc is not None:
      self.proc.kill()
      self.proc.wait()
      self.proc = None

  def close(self):
    if self.proc is None:
      return
    proc, self.proc = self.proc, None
    try:
      proc.stdin.close()
    except BrokenPipeError:
      pass
    err = proc.stderr.read().decode(errors="replace")
    if proc.wait() != 0:
      raise UserError(f"ffmpeg ({self.program}) failed writing {self.path}: "
                      f"{' '.join(err.split())[:300] or 'exit ' + str(proc.returncode)}; "
                      "write a .gif instead, or check that ffmpeg has libx264.")


def check_out(path: str) -> Optional[str]:
  """Refuses a video path that cannot be written (suffix, a folder that cannot be made, no ffmpeg
  for .mp4) before anything renders, and creates its folder (as experiments.export creates its
  file's); returns the ffmpeg program for .mp4, None for .gif."""
  suffix = os.path.splitext(path)[1].lower()
  if suffix not in FORMATS:
    raise UserError(f"{path}: videos are written as {' or '.join(FORMATS)}; name the file so.")
  folder = os.path.dirname(os.path.abspath(path))
  try:
    os.makedirs(folder, exist_ok=True)
  except OSError as e:
    raise UserError(f"Cannot create the folder {folder} of {path} ({e.strerror or e}); pass "
                    "another `out`.", params=("out",)) from None
  if suffix == ".gif":
    return None
  program = _ffmpeg()
  if program is None:
    raise UserError(f"Writing {path} needs the ffmpeg program: apt-get install ffmpeg (or pip "
                    "install imageio-ffmpeg), or write a .gif instead.")
  return program


def _writer(path: str, fps: float):
  program = check_out(path)
  return _Gif(path, fps) if program is None else _Mp4(path, fps, program)


def _overlay(frame: np.ndarray, text: str) -> np.ndarray:
  image = Image.fromarray(frame)
  size = max(8, min(frame.shape[0] // 24, frame.shape[1] // 24))
  try:
    font = ImageFont.load_default(size=size)
  except TypeError:  # a Pillow without FreeType: the fixed bitmap font
    font = ImageFont.load_default()
  ImageDraw.Draw(image).multiline_text((3, 2), text, font=font, fill=(255, 255, 255),
                                       stroke_width=1, stroke_fill=(0, 0, 0))
  return np.asarray(image)


@contextlib.contextmanager
def _quiet():
  """Mutes warnings and exceptions raised in __del__ (sys.unraisablehook) for the block."""
  hook, sys.unraisablehook = sys.unraisablehook, lambda *_: None
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      yield
  finally:
    sys.unraisablehook = hook


def make_render_env(env_name, width: int, height: int):
  """The env of `env_name` (what envs.make_env takes: an env or dataset name, an eval_env_spec
  dict; as evaluation makes it) rendering rgb_array frames [height, width, 3]; UserError (one
  line: packages, MUJOCO_GL) when no headless renderer works."""
  backend = choose_backend()
  env = envs.make_env(env_name, render_mode="rgb_array", width=int(width), height=int(height))
  # A failed context creation leaves gymnasium's viewer half built; its __del__ fails again and
  # GLFW warns: both would print under the one error line, so both are muted here.
  with _quiet():
    try:
      env.reset(seed=0)
      env.render()                   # gymnasium makes the GL context at the first render
      return env
    except Exception as e:  # PyOpenGL / EGL / OSMesa raise many types; one line for all of them
      problem = _one_line(e)
    try:
      env.close()
    except Exception:  # the same broken context; the error below says what to do
      pass
    del env
    gc.collect()
  raise UserError(f"MuJoCo's renderer failed (MUJOCO_GL={backend}: {problem}); {INSTALL_HINT}.")


@dataclasses.dataclass(frozen=True)
class Video:
  """What render draws: `episodes` episodes, one after the other (episode i reset with
  env_seed + i, each run to termination, the time limit or max_steps steps; None: no cut), in
  frames [height, width, 3], with the overlay text (overlay=False: none)."""
  episodes: int = 1
  env_seed: int = 0
  width: int = 480
  height: int = 480
  max_steps: Optional[int] = None
  overlay: bool = True


def render(policy, out: str, video: Video = Video(), log: Callable = print) -> List[dict]:
  """Renders the episodes `video` names of the policy's deterministic action into the video file
  `out` (.gif or .mp4). Returns per episode {episode, env_seed, return, normalized_score, length,
  ended} (ended: terminated / truncated / max_steps). See the module docstring."""
  episodes, width, height, max_steps = video.episodes, video.width, video.height, video.max_steps
  if episodes < 1:
    raise UserError(f"episodes must be >= 1, got {episodes}.")
  if width < 8 or height < 8:
    raise UserError(f"width and height must be >= 8 pixels, got {width}x{height}.")
  if max_steps is not None and max_steps < 1:
    raise UserError(f"max_steps must be >= 1 (or unset: the env's time limit), got {max_steps}.")
  check_out(out)
  # The physics the policy's run was evaluated in (an imported D4RL walker: D4RL's model).
  env = make_render_env(policy.eval_env or policy.dataset, width, height)
  dt = float(env.unwrapped.dt)
  every = max(1, int(round(1.0 / (dt * FPS))))
  fps = 1.0 / (dt * every)
  try:
    writer = _writer(out, fps)
  except UserError:
    env.close()
    raise
  label = f"{policy.dataset}  seed {policy.seed}  epoch {policy.epoch}"
  results = []
  try:
    for i in range(episodes):
      seed = int(video.env_seed) + i
      obs, _ = env.reset(seed=seed)
      total, t, ended = 0.0, 0, "max_steps"

      def frame():
        image = env.render()
        if video.overlay:
          score = float(scores.normalized_score(policy.dataset, total))
          image = _overlay(image, f"{label}\nep {i}  t={t}  return {total:.1f}  score {score:.1f}")
        return image
      writer.add(frame())
      while max_steps is None or t < max_steps:
        # The policy's action is already the env's (in its bounds): env.step, not envs.step.
        obs, reward, terminated, truncated, _ = env.step(policy(obs))
        t, total = t + 1, total + float(reward)
        done = terminated or truncated
        if done or t % every == 0 or t == max_steps:
          last = frame()
          writer.add(last)
        if done:
          ended = "terminated" if terminated else "truncated"
          break
      for _ in range(int(round(HOLD_SECONDS * fps))):
        writer.add(last)                 # t >= 1 here, so `last` is this episode's final frame
      score = float(scores.normalized_score(policy.dataset, total))
      results.append({"episode": i, "env_seed": seed, "return": total, "normalized_score": score,
                      "length": t, "ended": ended})
      log(f"episode {i} (env seed {seed}): return {total:.2f}, normalised score {score:.1f}, "
          f"{t} steps ({ended})")
  except BaseException:
    writer.abort()
    raise
  finally:
    env.close()
  writer.close()
  return results
