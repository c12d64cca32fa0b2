r"""Run a grid of `experiments.run` launches into one folder, resumably.

  python -m experiments.sweep --envs=hopper-random,hopper-medium-replay \
      --algos=mombo,mobile,mopo --seeds=3 --out=sweeps/hopper
  python -m experiments.report sweeps/hopper          # tables and curves of what finished

Entries are (dataset, algorithm); each entry is ONE `python -m experiments.run` launch that trains
all --seeds seeds together (vmapped), in `<out>/<dataset>/<algo>[-<target>]/s<seed>x<seeds>`. The
algorithms of one dataset share one set of dynamics ensembles where their dynamics settings agree
(the ensembles depend on the dataset, the seeds and the dynamics settings only, never on the
algorithm; the paper's protocol: one pretrained ensemble per task for every algorithm): the first
such entry trains them in `<out>/<dataset>/dynamics/seed<seed>x<seeds>-<tag>` (<tag>: the settings)
and the others reuse them. An algorithm whose reference source sets other dynamics settings for the
dataset (e.g. another epoch cap) trains its own beside them. Before anything runs (and with
--dry_run) the sweep prints, per dataset, which entries share an ensemble, the dynamics settings
each ensemble follows and where each value comes from (flag, preset, the algorithm's reference
source in mombo_jax/settings/references.py, or the Config default).

Resumable: an entry whose summary.json exists is finished and skipped; any other entry is launched
again and resumes from its own checkpoints. Run the same command again after an interruption. An
entry whose folder holds a run of another setup (its config.json: another --beta, --epochs, preset,
...) is refused before anything is launched, naming the fields that differ: pass another --out, or
the setup it was run with. `<out>/sweep.json` records each entry's command, status, exit code and
wall time, and its history over every sweep into <out> (a diverged entry stays diverged). A failing
entry does not stop the sweep; the sweep's exit status is 1 when any entry failed (3 when seeds of
an entry diverged, now or before, and nothing failed outright), 130 / 143 when SIGINT / SIGTERM
interrupted it (the running entry checkpoints first).

Setup flags (--preset, --reference, --epochs, --steps_per_epoch, --beta, ...) are checked and passed
to every entry (a given --beta also names the entries' folders, <algo>[-<target>]-beta<b>, and so
does a --reference that is not the algorithm's default source); after `--` go only experiments.run's
flags that do not change the setup (--keep_checkpoints, --compilation_cache, --build_missing,
--build_steps, --download, --allow_small_dataset, --log, --eval_workers, --allow_epochs_change: it
continues finished entries to a larger --epochs). Any other word is refused. The entries and their
launch are mombo_jax.run.sweep's; this program only parses the flags.
"""
import sys

from absl import flags

from experiments import _cli
from mombo_jax.run.sweep import (
  BUDGET_FLAGS,
  Launcher,
  check_entries,
  dynamics_plan,
  plan,
  run_sweep,
)
from mombo_jax.run.sweep_record import exit_code, summary

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global)."""
  flags.DEFINE_list("envs", None, "Dataset short names, e.g. hopper-random,hopper-medium-replay.")
  from mombo_jax.core import algorithms
  flags.DEFINE_list("algos", ["mombo", "mobile", "mopo"], "Algorithms, each one of "
                    f"<{'|'.join(algorithms.names())}> (the registered ones) or MODULE:NAME for "
                    "one your own module registers (as experiments.run's --algo).")
  flags.DEFINE_integer("seeds", 3, "Seeds per entry, trained together in one launch.")
  flags.DEFINE_integer("seed", 0, "First seed.")
  flags.DEFINE_string("out", None, "The sweep's folder (required).")
  flags.DEFINE_bool("dry_run", False, "Print the commands and exit.")
  for name, kind in BUDGET_FLAGS.items():
    getattr(flags, f"DEFINE_{kind}")(name, None, "Passed to every entry's experiments.run.")


def main(argv):
  # absl drops `--` and leaves the words after it, and any stray word before it, in argv: only
  # --flags (checked by plan) may be passed on; a bare word is a mistake.
  extra = argv[1:]
  line = _cli.stray_words([w for w in extra if not w.startswith("-")])
  if line:
    raise _cli.UsageError(line)
  missing = [f"--{n}" for n in ("envs", "out") if not getattr(FLAGS, n)]
  if missing:                               # a missing required flag: usage, exit 2
    raise _cli.UsageError(f"{' and '.join(missing)} required, e.g. --envs=hopper-random "
                          "--out=sweeps/hopper.")
  entries = plan(FLAGS.envs, FLAGS.algos, FLAGS.seeds, FLAGS.seed, FLAGS.out,
               {k: getattr(FLAGS, k) for k in BUDGET_FLAGS}, extra)
  budget = {k: getattr(FLAGS, k) for k in BUDGET_FLAGS}
  # Comment lines: a dry run's output stays a list of shell commands.
  for line in dynamics_plan(entries, budget):
    print("# " + line, flush=True)
  if FLAGS.dry_run:
    check_entries(entries)
    for entry in entries:
      print(("# finished: " if entry.finished else "") + entry.command_line)
    return 0
  launcher = Launcher()
  launcher.install()
  result = run_sweep(entries, FLAGS.out, runner=launcher)
  print(summary(result, FLAGS.out))
  if result["status"] == "interrupted":
    print("Resume with:\n  " + _cli.resume_command(main, sys.argv), file=sys.stderr)
  return exit_code(result)


if __name__ == "__main__":
  _cli.run(main, define_flags, words=True)
