r"""Train MOMBO / MOBILE / MOPO on a D4RL-style Minari dataset, many seeds in one launch.

  python -m experiments.run --env=walker2d-medium-replay --seeds=4
  python -m experiments.run --env=hopper-random --preset=quick        # offline quick start

Steps: load the dataset (building the random ones when missing and --build_missing), train or reuse
the dynamics ensembles (one per seed, vmapped), then the jit(vmap(epoch)) loop. The workdir gets
Orbax checkpoints (resumed when the same command runs again), metrics.csv, summary.json and
learning_curve.png. From Python the same launch is one call, mombo_jax.fit (mombo_jax/run/fit.py:
this program calls its two steps, fit.plan and fit.fit_runs).
"""
import sys

from absl import flags, logging

from experiments import _cli
from mombo_jax.run.compilation_cache import DEFAULT_COMPILATION_CACHE

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when this module runs as the program (absl flags are global): what is trained,
  its settings, where its files go, how the launch runs."""
  _what_flags()
  _settings_flags()
  _files_flags()
  _launch_flags()


def _what_flags():
  # --- what is trained: the data and the algorithm
  flags.DEFINE_string("env", "hopper-random", "Short dataset name, e.g. walker2d-medium-replay; "
                      "selects the paper's hyperparameters and the evaluation environment.")
  flags.DEFINE_string("dataset", None,
                      "Dataset to train on (short name or Minari id); default --env.")
  flags.DEFINE_list("datasets", None, "Several datasets of one env trained in one program "
                    "(each short name with its own paper settings, its rollout length, real "
                    "ratio and alpha included; other settings must agree or be set by flags); "
                    "each gets its own workdir under --workdir.")
  flags.DEFINE_list("betas", None, "Several betas (MOPO: lambdas) trained in one program, each "
                    "(dataset, beta) in its own workdir; the dynamics are shared by the betas.")
  _cli.define_algo("algo", "mombo", "Algorithm.")
  flags.DEFINE_enum("target", "elite_spread", ["elite_spread", "lcb", "mixture"],
                    "MOMBO's target. elite_spread (default): the released code's (adinlab/MOMBO), "
                    "which produced the paper's numbers and for which the per-task betas were "
                    "tuned; lcb: the paper's written eq. (1), whose penalty is much smaller at "
                    "those betas (see benchmarks/learning/README.md for its matched beta); "
                    "mixture: law of total variance over the elites.")
  flags.DEFINE_string("reference", None, "Whose settings the per-task values follow "
                      "(config.json's `reference`; mombo_jax/settings/references.py). mombo: "
                      "authors (adinlab/MOMBO configs, default). mobile: offlinerl_kit (default: "
                      "OfflineRL-Kit "
                      "run_example/run_mobile.py, whose logs are the paper's MOBILE column) or "
                      "authors (yihaosun1124/mobile configs). mopo: offlinerl_kit (run_mopo.py, "
                      "default). A non-default source adds -<reference> to the default workdir.")


def _settings_flags():
  # --- its settings: the budget and the overrides of the per-task Config
  flags.DEFINE_enum("preset", "paper", ["paper", "quick", "tiny"],
                    "Budget preset (config.PRESETS).")
  flags.DEFINE_integer("seeds", None, "Number of seeds, trained together (vmapped). Default: "
                       "the preset's (paper: the paper's 4; quick and tiny: 1).")
  flags.DEFINE_integer("seed", 0, "First seed.")
  flags.DEFINE_integer("epochs", None,
                       "Epochs (each steps_per_epoch gradient steps + one rollout).")
  flags.DEFINE_integer("schedule_epochs", None, "Epochs the actor's cosine learning-rate schedule "
                       "spans, apart from when the run stops (--epochs). Default: the paper's "
                       "3000 (2000 for the mixed datasets) under --preset=paper, so a shorter run "
                       "is the prefix of the paper's; --epochs under the other presets; 0: "
                       "--epochs.")
  flags.DEFINE_integer("steps_per_epoch", None, "Gradient steps per epoch.")
  flags.DEFINE_integer("eval_every", None, "Epochs between evaluations (and checkpoints). "
                       "Default under --preset=paper: the reference's cadence where practical "
                       "(MOMBO 50, MOBILE and MOPO 10; docs/protocol.md).")
  flags.DEFINE_integer("eval_episodes", None, "Evaluation episodes per seed.")
  flags.DEFINE_integer("rollout_batch_size", None, "Model rollout start states per epoch.")
  flags.DEFINE_integer("rollout_length", None, "Model rollout length k.")
  flags.DEFINE_integer("dynamics_max_epochs", None, "Cap on dynamics training epochs.")
  flags.DEFINE_float("beta", None, "Penalty coefficient (MOMBO/MOBILE beta, MOPO lambda).")
  flags.DEFINE_float("real_ratio", None, "Fraction of real transitions in each batch.")
  flags.DEFINE_enum("matmul_precision", None, ["float32", "tensorfloat32"],
                    "Precision of every float32 matmul the run compiles (config.json's "
                    "`matmul_precision`). float32 (default): full float32 on every backend, as "
                    "the PyTorch references compute and the paper's numbers need; tensorfloat32: "
                    "TF32 inputs (10 mantissa bits) on a GPU that has them, faster and less "
                    "exact (docs/spec.md). The CPU computes both alike.")
  flags.DEFINE_string("moments", None, "How MOMBO's targets (elite_spread, lcb, mixture) "
                      "moment-match the target critic (config.json's `moments`): diagonal "
                      "(default: the paper's Algorithm 1, the released code's), lowrank (the next "
                      "state's covariance carried through the critic with its correlations; "
                      "lowrank<k>: at most k state dimensions kept correlated; "
                      "docs/moment_matching.md) or full (the analyses only). Named in the "
                      "workdir when not diagonal.")


def _files_flags():
  # --- where its files go and where the data comes from
  flags.DEFINE_string("workdir", None, "Output folder; default runs/<dataset>/<algo>[-target]"
                      "[-moments]/s<seed>x<seeds>. With --datasets / --betas: the root under "
                      "which each cell gets <dataset>/<algo>[-target][-beta<b>]/s<seed>x<seeds> "
                      "(default runs).")
  flags.DEFINE_string("dynamics_dir", None, "Where the dynamics ensembles are saved / reused, "
                      "in seed<s>x<S>-<tag> (<tag>: the dynamics settings; only a run of the same "
                      "data, seeds and settings reuses them); default <workdir>/dynamics.")
  flags.DEFINE_bool("build_missing", None, "Build a missing dataset locally with the collector "
                    "(any short name: random, SAC-based, mixed); default: random datasets only, "
                    "with "
                    "--preset=quick/tiny.")
  flags.DEFINE_integer("build_steps", None, "Steps of each dataset recorded by --build_missing "
                       "(default 1M, quick preset 100k, tiny 5k).")
  flags.DEFINE_bool("download", False, "Try Minari's server for a dataset that is not local "
                    "(e.g. --dataset=mujoco/hopper/medium-v0).")
  flags.DEFINE_integer("keep_checkpoints", 3, "Checkpoints kept in <workdir>/checkpoints.")
  flags.DEFINE_bool("allow_small_dataset", False, "Train with the paper preset on a reduced build "
                    "of the dataset's recipe (refused by default).")
  flags.DEFINE_bool("allow_epochs_change", False, "Continue a run with another --epochs (the "
                    "actor's cosine schedule is re-spanned; recorded in config.json).")
  flags.DEFINE_string("compilation_cache", DEFAULT_COMPILATION_CACHE, "Folder of JAX's "
                      "persistent compilation cache: a later launch of the same setup reads the "
                      "compiled epoch from there instead of compiling again. Empty: off.")


def _launch_flags():
  # --- how the launch runs: processes, loggers, evaluation workers, stopping
  flags.DEFINE_string("coordinator_address", None, "Multi-process run: host:port of process 0 "
                      "(with --num_processes and --process_id; see docs/scaling.md).")
  flags.DEFINE_integer("num_processes", None, "Multi-process run: how many processes.")
  flags.DEFINE_integer("process_id", None, "Multi-process run: this process's index, 0 first.")
  flags.DEFINE_bool("distributed", False, "Multi-process run configured by the cluster's "
                    "environment (SLURM, Open MPI, TPU pods: jax.distributed.initialize()).")
  flags.DEFINE_float("init_timeout", 300, "Multi-process run: seconds to wait for every process "
                     "to connect; then one error line naming the missing ones, exit "
                     "4 (mombo_jax.run.distributed.EXIT_INIT_TIMEOUT).")
  flags.DEFINE_list("log", ["csv"], "Where the metrics go besides metrics.csv (always written): "
                    "csv, tensorboard (<workdir>/tb/seed<s>/; needs pip install -e "
                    ".[tensorboard]), wandb (one W&B run per seed under <workdir>/wandb/, offline "
                    "unless WANDB_MODE or WANDB_API_KEY is set: upload with `wandb sync`; needs "
                    "pip install -e .[wandb]). E.g. --log=tensorboard,wandb.")
  flags.DEFINE_integer("eval_workers", 0, "Processes stepping the evaluation envs (every cell's "
                       "episodes, in one pass); 0: auto, in the training process below 8 envs, "
                       "else one per 2 envs up to the host's cores (1 cell x 10 episodes: 5; 16 "
                       "or 48 cells on a 16-core host: 16); 1: in the training process. Changes "
                       "no result, only the time (benchmarks/bench_eval.txt).", lower_bound=0)
  flags.DEFINE_integer("stop_after", None, "Stop after this many epochs of this launch (e.g. to "
                       "fit "
                       "a job time limit); the same command resumes.")


def _settings():
  """The flags that set the runs' Config (fit's **settings), as config.make_config names them."""
  mapping = dict(epochs="epochs", steps_per_epoch="steps_per_epoch", eval_every="eval_every",
                 eval_episodes="eval_episodes", rollout_batch_size="rollout_batch_size",
                 rollout_length="rollout_length", dynamics_max_epochs="dyn_max_epochs",
                 beta="beta", real_ratio="real_ratio", matmul_precision="matmul_precision",
                 moments="moments")
  out = {field: getattr(FLAGS, flag) for flag, field in mapping.items()
         if getattr(FLAGS, flag) is not None}
  if FLAGS.schedule_epochs is not None:
    out["schedule_epochs"] = FLAGS.schedule_epochs or None
  if FLAGS.reference is not None:
    out["reference"] = FLAGS.reference
  out.update(target=FLAGS.target)
  return out


# Python parameters / config fields whose flag has another name (errors speak Python).
FLAG_NAMES = {"num_seeds": "seeds", "dyn_max_epochs": "dynamics_max_epochs",
              "keep": "keep_checkpoints", "log_to": "log", "auto": "distributed",
              "timeout": "init_timeout"}


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)   # Orbax logs every save at INFO
  from mombo_jax import signals
  from mombo_jax.records import workdir as workdir_lib
  from mombo_jax.run import console, distributed, fit
  stop = signals.StopFlag()
  stop.install()
  # before anything touches JAX's devices
  distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id,
                         auto=FLAGS.distributed, timeout=FLAGS.init_timeout)
  grid = FLAGS.datasets is not None or FLAGS.betas is not None
  if grid and (FLAGS.dataset or FLAGS.beta is not None):
    raise _cli.UsageError("pass --dataset / --beta for one run, or --datasets / --betas for a "
                          "grid, not both.")
  try:
    betas = [float(b) for b in FLAGS.betas] if FLAGS.betas is not None else None
  except ValueError:
    raise _cli.UsageError(f"--betas={','.join(FLAGS.betas)}: not all numbers.") from None
  # mombo_jax.fit's own two steps: the runs, then their launch.
  with _cli.as_user_error(ValueError, flag_names=FLAG_NAMES):  # a field's value: its flag named
    specs = fit.plan(FLAGS.env, FLAGS.algo, dataset=FLAGS.dataset, datasets=FLAGS.datasets,
                     betas=betas, preset=FLAGS.preset, seeds=FLAGS.seeds, seed=FLAGS.seed,
                     workdir=FLAGS.workdir, dynamics_dir=FLAGS.dynamics_dir, **_settings())
  summaries = fit.fit_runs(
      specs, FLAGS.preset, build_missing=FLAGS.build_missing, build_steps=FLAGS.build_steps,
      download=FLAGS.download, keep_checkpoints=FLAGS.keep_checkpoints,
      allow_small_dataset=FLAGS.allow_small_dataset,
      allow_epochs_change=FLAGS.allow_epochs_change, stop_after=FLAGS.stop_after, log=FLAGS.log,
      eval_workers=FLAGS.eval_workers, compilation_cache=FLAGS.compilation_cache,
      should_stop=stop)
  failed = [(s, summary) for s, summary in zip(specs, summaries)
            if summary and summary.get("diverged")]
  for s, summary in failed:
    seeds = ", ".join(f"seed {d['seed']} (epoch {d['epoch']}, {d['quantity']})"
                      for d in summary["diverged"])
    print(f"error: {len(summary['diverged'])} of {len(summary['seeds'])} seed(s) diverged: "
          f"{seeds}. Frozen at their last healthy state, they are counted in the summary's means "
          "(docs/protocol.md; `*_healthy` leaves them out). Their last healthy checkpoints are in "
          f"{workdir_lib.Workdir(s.workdir).checkpoints}; a smaller --beta often helps.",
          file=sys.stderr, flush=True)
  return console.EXIT_DIVERGED if failed else 0


if __name__ == "__main__":
  _cli.run(main, define_flags, flag_names=FLAG_NAMES)
