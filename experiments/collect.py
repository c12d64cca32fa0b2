r"""Build D4RL-recipe datasets as local Minari datasets (docs/spec.md section 7).

  python -m experiments.collect --env=hopper-random                 # 1M uniform-random steps
  python -m experiments.collect \
      --env=hopper-medium-replay,hopper-medium,hopper-expert,hopper-medium-expert
  python -m experiments.collect --env=walker2d-random-expert-5pct

The recipes (D4RL's, and the paper's mixed datasets) are in mombo_jax/collection/recipes.py, the
online SAC behind the medium / medium-replay / expert qualities in
mombo_jax/collection/online_sac.py, the saved actors in mombo_jax/collection/saved_actors.py.
Datasets are written under MINARI_DATASETS_PATH as `mombo/<env>/<quality>-v0`; an existing one is
never overwritten (it is skipped, with a message) unless --overwrite.

The SAC run lives in --workdir/<env>/sac: Orbax checkpoints (agent, replay buffer, medium snapshot,
and the loop's host state: the env mid-episode, the RNGs) every --checkpoint_every steps, at the
medium point and when stopped (Ctrl-C / SIGTERM: within seconds, amid a chunk of gradient steps or
an evaluation too), so an interrupted run resumes where it stopped, bit for bit as it would have
gone on (a checkpoint from before that state was kept cuts the interrupted episode: marked
truncated). A stopped recording is recorded again from its start. Running again with a larger
--sac_steps continues a finished run. Its medium point is the first evaluation (--eval_episodes
deterministic episodes every --eval_every steps) that ends --medium_consecutive (default 2)
evaluations in a row at or above --medium_fraction x D4RL's expert return: one lucky evaluation
is not a medium policy.

Saved actors. As soon as the run has its medium point (and, once it reaches --sac_steps, its final
actor) the collector writes them small into --workdir/<env>/actors/:
  medium.msgpack  expert.msgpack   flax.serialization.to_bytes of the actor variables (~300 KB at
                                   256x256)
  medium.json     expert.json      env, gym id, obs / action dims, actor_hidden, log-std bounds,
                                   the SAC step, the evaluations that qualified it (medium: the
                                   threshold and --medium_consecutive), seed, package version, git
                                   commit, sha256 of the .msgpack and the collect command that
                                   retrains it
A build that finds the medium point already in the checkpoint (a resume) writes them too, without
training. --actors_only only exports them from the checkpoint (trains, records and writes nothing
else; run it once no build is writing checkpoints to that --workdir):
  python -m experiments.collect --env=hopper-medium --actors_only --workdir=runs/collect

--from_actors=DIR records medium / expert / medium-expert from DIR/medium.msgpack and
DIR/expert.msgpack (+ their .json) alone, no SAC run: minutes on any machine, the same episodes
for the same --seed / --num_envs / --steps / --rollout_policy (and, on one machine, the same
episodes a SAC build with those settings recorded from that actor). The dataset's provenance and
description name the actor file, its sha256 and the rebuild command. random and medium-replay
(the SAC run's replay buffer) are refused: they need no actor / the SAC run.
  python -m experiments.collect --env=hopper-medium,hopper-expert,hopper-medium-expert \
      --from_actors=benchmarks/datasets/hopper
"""
from __future__ import annotations

import dataclasses

from absl import flags, logging

from experiments import _cli
from mombo_jax.collection.options import Options
from mombo_jax.collection.recipes import Builder

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global). Every field of
  options.Options is a flag of the same name with the same default."""
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
                     "evaluation return reaches this fraction of the D4RL expert return on "
                     "--medium_consecutive evaluations in a row.")
  flags.DEFINE_integer("medium_consecutive", 2, "Consecutive evaluations (of --eval_episodes "
                       "episodes) that must reach the medium return: one lucky evaluation is "
                       "not a medium policy.")
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
  flags.DEFINE_string("from_actors", None, "Folder with saved actors (medium.msgpack, "
                      "expert.msgpack and their .json sidecars): record medium / expert / "
                      "medium-expert from them, no SAC run.")
  flags.DEFINE_bool("actors_only", False, "Only save the actors behind the named datasets from "
                    "the SAC checkpoint in --workdir (into --workdir/<env>/actors/); train, record "
                    "and write nothing else.")


def options_from_flags() -> Options:
  """options.Options from the flags of the same names (--hidden: a list of layer widths)."""
  values = {field.name: getattr(FLAGS, field.name) for field in dataclasses.fields(Options)}
  return Options(**{**values, "hidden": tuple(int(h) for h in FLAGS.hidden)})


def main(argv):
  del argv
  # Orbax reports every checkpoint write at INFO; progress lines are printed instead.
  logging.set_verbosity(logging.WARNING)
  from mombo_jax.data import names
  if not FLAGS.env:
    raise _cli.UsageError(f"--env is required, e.g. --env=hopper-random. {names.valid_names_text()}"
                          ".")
  from mombo_jax import signals
  # SIGINT / SIGTERM (and SIGUSR1: a launch that builds data through this process passes its
  # stop on) stop within seconds: the SAC run checkpoints where it is (the same command then
  # resumes it bit for bit), a recording is dropped (recorded again: the same episodes).
  stop = signals.StopFlag()
  stop.install()
  with _cli.as_user_error(ValueError):    # unknown names: the message lists the valid ones
    for name in FLAGS.env:
      names.parse_name(name)  # every name is checked before anything runs
  # Every value checked before any look at existing data (a dataset already built skips its
  # build, which must not let a bad value pass) or any env or SAC work.
  for name in ("steps", "sac_steps", "eval_every", "eval_episodes", "medium_consecutive",
               "checkpoint_every", "train_every", "log_every", "batch_size", "num_envs",
               "max_episode_steps"):
    value = getattr(FLAGS, name)
    if value is not None and value < 1:
      raise _cli.UsageError(f"--{name} must be >= 1, got {value}.")
  if FLAGS.start_steps < 0:
    raise _cli.UsageError(f"--start_steps must be >= 0, got {FLAGS.start_steps}.")
  try:
    if any(int(h) < 1 for h in FLAGS.hidden):
      raise ValueError
  except ValueError:
    raise _cli.UsageError(f"--hidden must be widths >= 1, got {','.join(FLAGS.hidden)}.") from None
  builder = Builder(options_from_flags(), should_stop=stop)
  for name in FLAGS.env:
    builder.check(name)  # --from_actors / --actors_only: refusals before anything runs
  from mombo_jax.data import minari_io
  print(f"Minari root: {minari_io.datasets_root()}", flush=True)
  for name in FLAGS.env:
    signals.check(stop, f"before building {name}")
    builder.build(name)


if __name__ == "__main__":
  _cli.run(main, define_flags, flag_names={"num_steps": "steps"},
           resume_note="finished datasets are kept and the SAC run resumes exactly where it "
           "stopped")
