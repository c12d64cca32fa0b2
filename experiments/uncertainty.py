r"""The paper's uncertainty-quantifier experiment (appendix): how often, and how tightly, each
algorithm's own penalty U(s, a) bounds the Bellman error of its critics on real transitions.

  python -m experiments.uncertainty --runs=runs/hopper-medium          # every run under it
  python -m experiments.uncertainty --runs=runs/a/s0x4,runs/b/s0x4 --episodes=10 --out=report/

For every run (a folder with config.json and checkpoints/, written by experiments.run) and seed:
roll the deterministic policy out in the real env for --episodes episodes, keep every 10th
transition and the last, and compute with the run's dynamics and target critics
  accuracy  = 1(U(s, a) >= |B Q(s, a) - B^ Q(s, a, s')|),  tightness = U(s, a) - |B Q - B^ Q|,
U the algorithm's penalty (mombo_jax.analysis.penalty), B^ the sample Bellman operator on the real
s', B Q the Bellman target under the learned model from --num_samples samples (deterministic
backup for all algorithms). Writes uncertainty.csv (one row per run and seed) and uncertainty.md
(mean +- std over seeds per dataset and algorithm, the paper's bold / underline rule).
"""
import os
import sys

from absl import app, flags, logging

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global; tests import this module)."""
  flags.DEFINE_list("runs", None, "Run workdirs, or folders searched for them.")
  flags.DEFINE_integer("episodes", 10, "Real-env episodes per seed.")
  flags.DEFINE_integer("every", 10, "Keep every n-th transition of an episode (and the last).")
  flags.DEFINE_integer("num_samples", 1000, "Samples for the exact Bellman target B Q and the "
                       "policy expectation in B^ Q.")
  flags.DEFINE_integer("max_episode_steps", None, "Time-limit override (default: the env's).")
  flags.DEFINE_integer("seed", 0, "Env reset and PRNG seed.")
  flags.DEFINE_string("out", None, "Output folder (default: the first --runs folder).")


def find_run_dirs(dirs):
  """Folders under `dirs` holding config.json and checkpoints/ (sorted); ValueError if none."""
  found = []
  for top in dirs:
    if not os.path.isdir(top):
      raise ValueError(f"--runs: {top} is not a folder.")
    for root, subdirs, files in os.walk(top):
      if "config.json" in files and "checkpoints" in subdirs:
        found.append(os.path.normpath(root))
        subdirs[:] = []
  if not found:
    raise ValueError(f"No runs (config.json + checkpoints/) found under {', '.join(dirs)}.")
  return sorted(set(found))


def evaluate_runs(run_dirs, episodes=10, every=10, num_samples=1000, seed=0,
                  max_episode_steps=None, log=print):
  """One row per (run, seed): accuracy, tightness and the means of U and |B Q - B^ Q|."""
  import jax
  import numpy as np
  from mombo_jax import analysis, report
  rows = []
  for path in run_dirs:
    trained = analysis.load_run(path)
    for i, nets in enumerate(trained.nets):
      batch = analysis.real_transitions(nets, trained.config.env_name, episodes, seed + i, every,
                                        max_episode_steps)
      res = analysis.uncertainty_quality(nets, batch, jax.random.PRNGKey(seed + i), num_samples)
      err = np.abs(res["exact"] - res["sample"])
      rows.append(dict(run=path, env=trained.config.env_name, dataset=trained.dataset,
                       algo=report.algo_label(dataclass_dict(trained.config)),
                       seed=trained.seeds[i], transitions=len(err),
                       accuracy=res["accuracy_mean"], tightness=res["tightness_mean"],
                       penalty_mean=float(res["u"].mean()), bellman_error_mean=float(err.mean())))
      log(f"{path} seed {trained.seeds[i]}: {len(err)} transitions, accuracy "
          f"{res['accuracy_mean']:.2f}, tightness {res['tightness_mean']:.3g}")
  return rows


def dataclass_dict(config):
  import dataclasses
  return dataclasses.asdict(config)


class _Seeds:
  """Per-seed values of one (env, dataset, algo) for report.build_table."""

  def __init__(self, rows):
    self.rows = rows

  def stat(self, what):
    import numpy as np
    x = np.array([r[what] for r in self.rows], float)
    return (float(x.mean()), float(x.std())) if x.size else (None, None)


def table_markdown(rows):
  from mombo_jax import report
  groups = {}
  for r in rows:
    groups.setdefault((r["env"], r["dataset"], r["algo"]), []).append(r)
  table = report.build_table({k: _Seeds(v) for k, v in groups.items()},
                             metrics=(("accuracy", "Accuracy"), ("tightness", "Tightness")),
                             digits=2)
  return report.render_markdown(table, title="Uncertainty quantifiers",
                                what="over seeds of each seed's mean over its transitions")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if not FLAGS.runs:
    sys.exit("error: --runs is required (run workdirs or folders holding them).")
  for name in ("episodes", "every", "num_samples"):
    if getattr(FLAGS, name) < 1:
      sys.exit(f"error: --{name} must be >= 1, got {getattr(FLAGS, name)}.")
  from mombo_jax import outputs
  try:
    run_dirs = find_run_dirs(FLAGS.runs)
    rows = evaluate_runs(run_dirs, FLAGS.episodes, FLAGS.every, FLAGS.num_samples, FLAGS.seed,
                         FLAGS.max_episode_steps)
  except (ValueError, FileNotFoundError) as e:
    sys.exit(f"error: {e}")
  out = FLAGS.out or FLAGS.runs[0]
  os.makedirs(out, exist_ok=True)
  outputs.write_rows(os.path.join(out, "uncertainty.csv"), rows)
  with open(os.path.join(out, "uncertainty.md"), "w") as f:
    f.write(table_markdown(rows))
  print(f"wrote {os.path.join(out, 'uncertainty.csv')} and uncertainty.md")


if __name__ == "__main__":
  define_flags()
  app.run(main)
