r"""Build D4RL-recipe datasets as local Minari datasets (SPEC.md section 7).

  python -m experiments.collect --env=hopper-random                 # 1M uniform-random steps
  python -m experiments.collect \
      --env=hopper-medium-replay,hopper-medium,hopper-expert,hopper-medium-expert
  python -m experiments.collect --env=walker2d-random-expert-5pct

The recipes (D4RL's, and the paper's mixed datasets) are in mombo_jax/recipes.py, the online SAC
behind the medium / medium-replay / expert qualities in mombo_jax/online_sac.py. Datasets are
written under MINARI_DATASETS_PATH as `mombo/<env>/<quality>-v0`; an existing one is never
overwritten (it is skipped, with a message) unless --overwrite.

The SAC run lives in --workdir/<env>/sac: Orbax checkpoints (agent, replay buffer, medium snapshot)
every --checkpoint_every steps and at the medium point, so an interrupted run resumes where it
stopped (the interrupted episode is cut: marked truncated). Running again with a larger
--sac_steps continues a finished run.
"""
from __future__ import annotations

import sys

from absl import app, flags, logging

from mombo_jax.online_sac import UserError, _print
from mombo_jax.recipes import Builder, Options

FLAGS = flags.FLAGS


def define_flags():
  """Flags are defined only when this module runs as the program (see the __main__ block), so
  tests can import it next to experiments.run (absl flags are global: both define --env)."""
  flags.DEFINE_list("env", None, "Dataset short name(s), comma-separated, e.g. hopper-random or "
                    "hopper-medium,hopper-expert.")
  flags.DEFINE_integer("steps", 1_000_000, "Transitions of each random / medium / expert dataset "
                       "(and the size of a mixed dataset).")
  flags.DEFINE_integer("sac_steps", 1_000_000, "Environment steps (= gradient steps) of the SAC "
                       "run.")
  flags.DEFINE_integer("start_steps", 10_000, "Uniform-random warm-up steps of the SAC run.")
  flags.DEFINE_integer("eval_every", 10_000, "SAC steps between deterministic evaluations.")
  flags.DEFINE_integer("eval_episodes", 10, "Episodes per SAC evaluation.")
  flags.DEFINE_float("medium_fraction", 1.0 / 3.0, "The medium policy is the first whose "
                     "evaluation return reaches this fraction of the D4RL expert return.")
  flags.DEFINE_integer("checkpoint_every", 50_000, "SAC steps between Orbax checkpoints.")
  flags.DEFINE_integer("train_every", 1000, "SAC env steps between chunks of as many gradient "
                       "steps (D4RL's rlkit SAC alternates 1000 and 1000; 1 = after every step).")
  flags.DEFINE_integer("log_every", 5_000, "Steps between progress lines.")
  flags.DEFINE_list("hidden", ["256", "256"], "SAC hidden layer widths (actor and critics).")
  flags.DEFINE_integer("batch_size", 256, "SAC batch size.")
  flags.DEFINE_enum("rollout_policy", "stochastic", ["stochastic", "deterministic"],
                    "How the medium / expert policies act when their datasets are recorded.")
  flags.DEFINE_integer("num_envs", 8, "Environments stepped side by side when recording a policy "
                       "(one batched policy call per round).")
  flags.DEFINE_integer("max_episode_steps", None, "Episode time limit (default: the env's 1000).")
  flags.DEFINE_integer("seed", 0, "Seed of everything random here.")
  flags.DEFINE_string("workdir", "runs/collect", "Where the SAC runs keep their checkpoints.")
  flags.DEFINE_bool("overwrite", False, "Rebuild the named datasets even if they exist.")


def options_from_flags() -> Options:
  return Options(steps=FLAGS.steps, sac_steps=FLAGS.sac_steps, start_steps=FLAGS.start_steps,
                 eval_every=FLAGS.eval_every, eval_episodes=FLAGS.eval_episodes,
                 medium_fraction=FLAGS.medium_fraction, checkpoint_every=FLAGS.checkpoint_every,
                 train_every=FLAGS.train_every,
                 log_every=FLAGS.log_every, hidden=tuple(int(h) for h in FLAGS.hidden),
                 batch_size=FLAGS.batch_size, rollout_policy=FLAGS.rollout_policy,
                 num_envs=FLAGS.num_envs, max_episode_steps=FLAGS.max_episode_steps,
                 seed=FLAGS.seed, workdir=FLAGS.workdir, overwrite=FLAGS.overwrite)


def main(argv):
  del argv
  # Orbax reports every checkpoint write at INFO; progress lines are printed instead.
  logging.set_verbosity(logging.WARNING)
  from mombo_jax import config as config_lib
  if not FLAGS.env:
    raise app.UsageError("--env is required, e.g. --env=hopper-random. Valid names: "
                         f"{', '.join(config_lib.valid_names())}")
  try:
    for name in FLAGS.env:
      config_lib.parse_name(name)  # every name is checked before anything runs
    opts = options_from_flags()
    builder = Builder(opts)
    from mombo_jax import data
    _print(f"Minari root: {data.datasets_root()}")
    for name in FLAGS.env:
      builder.build(name)
  except (UserError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  except KeyboardInterrupt:
    print("\nInterrupted. Run the same command again: finished datasets are kept and the SAC run "
          "resumes from its last checkpoint (every --checkpoint_every steps).", file=sys.stderr)
    sys.exit(130)


if __name__ == "__main__":
  define_flags()
  app.run(main)
