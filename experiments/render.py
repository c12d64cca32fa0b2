r"""Render episodes of a trained policy (deterministic: evaluation's action) to a .gif or .mp4.

  python -m experiments.render --run=runs/hopper-random/mombo-elite_spread/s0x1 --seed=0 \
      --episodes=1 --out=hopper.mp4
  python -m experiments.render --policy=hopper_s2.msgpack --out=hopper.gif --width=320 --height=240

MuJoCo renders headless (MUJOCO_GL=egl or osmesa, picked when unset; apt-get install libegl1 or
libosmesa6 provides one). Each frame shows the step, the running return and its D4RL-normalised
score; the last frame of an episode shows the final ones, which are printed too. .mp4 needs an
ffmpeg program (apt-get install ffmpeg, or pip install imageio-ffmpeg); .gif needs nothing more.
"""
from absl import flags, logging

from experiments import _cli

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global)."""
  flags.DEFINE_string("run", None, "Run workdir of experiments.run (config.json + checkpoints).")
  flags.DEFINE_string("policy", None, "A policy file written by experiments.export (instead of "
                      "--run).")
  flags.DEFINE_integer("seed", None, "Which seed of the run; default its first.")
  flags.DEFINE_integer("step", None, "Checkpoint step of --run; default the newest valid one.")
  flags.DEFINE_integer("episodes", 1, "Episodes, one after the other in the video.")
  flags.DEFINE_integer("env_seed", 0, "Episode i is reset with env_seed + i.")
  flags.DEFINE_string("out", None, "Video file: .gif or .mp4.")
  flags.DEFINE_integer("width", 480, "Frame width in pixels.")
  flags.DEFINE_integer("height", 480, "Frame height in pixels.")
  flags.DEFINE_integer("max_steps", None, "Stop each episode after this many steps (default: "
                       "termination or the env's time limit).")
  flags.DEFINE_bool("overlay", True, "Write the step, return and normalised score on the frames.")
  flags.DEFINE_bool("allow_diverged", False, "Render a seed that diverged in training.")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if bool(FLAGS.run) == bool(FLAGS.policy):
    raise _cli.UsageError("pass one of --run=DIR (a run workdir) or --policy=FILE (of "
                          "experiments.export).")
  if not FLAGS.out:
    raise _cli.UsageError("--out is required, e.g. --out=hopper.gif or --out=hopper.mp4.")
  from mombo_jax.analysis import policy as policy_lib, render
  render.check_out(FLAGS.out)
  render.choose_backend()            # before MuJoCo is imported: it reads MUJOCO_GL then
  policy = policy_lib.load_policy(FLAGS.run or FLAGS.policy, FLAGS.seed, step=FLAGS.step,
                                  allow_diverged=FLAGS.allow_diverged)
  render.render(policy, FLAGS.out, render.Video(
      episodes=FLAGS.episodes, env_seed=FLAGS.env_seed, width=FLAGS.width, height=FLAGS.height,
      max_steps=FLAGS.max_steps, overlay=FLAGS.overlay))
  print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
  _cli.run(main, define_flags)
