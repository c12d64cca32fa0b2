r"""The paper's uncertainty-quantifier experiment (Table 2; appendix "Uncertainty quantifier
experiment", label appsec:tightness, of mombo-neurips2024; SPEC.md section 9): how often, and how
tightly, each algorithm's own penalty U(s, a) bounds the error of a single-sample Bellman backup.

  python -m experiments.uncertainty --runs=runs/hopper-medium          # every run under it
  python -m experiments.uncertainty --runs=runs/a/s0x4,runs/b/s0x4 --states=dataset --out=report/

Definition. For every run (a folder with config.json and checkpoints/, written by experiments.run),
every seed and every selected tuple (s, a, r, s'_real, d) of the real environment:
  B Q(s, a)       = r + gamma (1-d) E_{a' ~ pi(s'_real)}[min_j Q'_j(s'_real, a')]
                    (the exact operator: MuJoCo's dynamics are deterministic; the expectation over
                    --num_policy policy samples, "we estimate the exact Bellman target by taking
                    samples from the policies"),
  B^ Q(s, a, s^') = r^ + gamma (1-d^) min_j Q'_j(s^', a^')
                    from ONE draw (s^', r^) of the run's learned model (a uniformly random elite per
                    row, as in rollouts), a^' ~ pi(s^') one sample, d^ the termination function
                    (or a runaway state, as in rollouts),
  accuracy        = 1(U >= |B Q - B^ Q|),      tightness = U - |B Q - B^ Q|,
each averaged over --draws model draws per tuple, then over the tuples, then (uncertainty.md) mean
+- std over seeds. Both backups are deterministic (no entropy term), for every algorithm. Q' are
the run's target critics, pi its policy. Averaging B^ Q over draws would remove the single-sample
error U is meant to cover, so only B Q is an expectation.

U is exactly the per-row penalty the run's training subtracts (mombo_jax.targets.get_penalty,
the functions the targets themselves call), redrawn with every model draw:
  MOMBO lcb           beta sqrt(var_r + gamma^2 (1-d^) v*) of the Gaussian of the elite that drew
                      s^' (what a rollout row stores), v* the MM variance of the target critic with
                      the smaller MM mean;
  MOMBO elite_spread  beta std_e T_e over the elites (ddof=1); mixture beta sqrt(mean_e MM var_e +
                      var_e T_e) (the run's config.target decides which);
  MOBILE              beta std over elites of the mean over N next-state samples of min_j Q';
  MOPO                lambda max over all members ||sigma||_2 (subtracted from the model reward).
It is reported as training subtracts it (accuracy, tightness, penalty_mean) and unscaled, U / beta
(accuracy_unscaled, tightness_unscaled, penalty_unscaled_mean), since the paper's definitions of U
carry no coefficient.

States (--states):
  policy   the paper's: each seed's own --episodes evaluation episodes of its deterministic policy
           in the real environment, every --every-th transition and the last of each;
  dataset  the same --num_states transitions of the dataset the run trained on for every algorithm
           and seed (drawn with --seed), so no policy-quality confound.

Writes (into --out, default the first --runs folder) uncertainty.csv and uncertainty.md for
--states=policy, uncertainty_dataset.csv / .md for --states=dataset: one CSV row per run and seed
(columns run, env, dataset, algo, target, states, seed, epoch, beta, transitions, draws,
num_policy, accuracy, tightness, accuracy_unscaled, tightness_unscaled, penalty_mean,
penalty_unscaled_mean, bellman_error_mean); the markdown gives mean +- std over seeds per dataset
and algorithm (the paper's bold / underline rule), the paper's own Table 2 numbers in their own
columns beside the as-trained accuracy and tightness (PAPER_NOTE says what they compare with), and
the mean U and Bellman error.
"""
import os
import sys

from absl import app, flags, logging

FLAGS = flags.FLAGS
STATES = ("policy", "dataset")


def define_flags():
  """Defined only when run as the program (absl flags are global; tests import this module)."""
  flags.DEFINE_list("runs", None, "Run workdirs, or folders searched for them.")
  flags.DEFINE_enum("states", "policy", STATES,
                    "Tuples: 'policy' (the paper's: each seed's evaluation episodes in the real "
                    "env, every --every-th step and the last) or 'dataset' (--num_states "
                    "transitions of the run's dataset, the same for every algorithm and seed).")
  flags.DEFINE_integer("episodes", 10, "--states=policy: real-env episodes per seed.")
  flags.DEFINE_integer("every", 10, "--states=policy: keep every n-th transition of an episode "
                       "(and the last).")
  flags.DEFINE_integer("max_episode_steps", None, "--states=policy: time-limit override "
                       "(default: the env's).")
  flags.DEFINE_integer("num_states", 1000, "--states=dataset: transitions drawn (with --seed) "
                       "from the run's dataset.")
  flags.DEFINE_integer("draws", 100, "Model draws (s^', r^) per tuple, each one single-sample "
                       "B^ Q and one U; accuracy and tightness are averaged over them.")
  flags.DEFINE_integer("num_policy", 1000, "Policy samples a' ~ pi(s'_real) in the exact "
                       "Bellman target B Q (the paper: 1000).")
  flags.DEFINE_integer("chunk", 256, "Tuples per jitted call (memory: num_policy x chunk critic "
                       "rows); lower it if memory is short.")
  flags.DEFINE_integer("seed", 0, "PRNG seed: env resets (seed + seed index), model and policy "
                       "draws, and the --states=dataset selection.")
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


def output_names(states):
  """(csv, md) file names of a --states mode: the paper's mode keeps the plain names."""
  suffix = "" if states == "policy" else f"_{states}"
  return f"uncertainty{suffix}.csv", f"uncertainty{suffix}.md"


def evaluate_runs(run_dirs, states="policy", episodes=10, every=10, num_states=1000, draws=100,
                  num_policy=1000, seed=0, max_episode_steps=None, chunk=256, log=print):
  """One row per (run, seed); see the module docstring for the columns."""
  import dataclasses

  import jax
  from mombo_jax import data, quantifier_quality, report
  from mombo_jax.trained import load_run
  if states not in STATES:
    raise ValueError(f"--states={states}: choose one of {', '.join(STATES)}.")
  rows, datasets = [], {}
  for path in run_dirs:
    trained = load_run(path)
    config = trained.config
    if states == "dataset" and trained.dataset not in datasets:
      datasets[trained.dataset] = quantifier_quality.dataset_states(
          data.load_transitions(trained.dataset), num_states, seed)
    for i, nets in enumerate(trained.nets):
      batch = (datasets[trained.dataset] if states == "dataset" else
               quantifier_quality.real_transitions(nets, config.env_name, episodes, seed + i,
                                                   every, max_episode_steps))
      res = quantifier_quality.uncertainty_quality(nets, batch, jax.random.PRNGKey(seed + i),
                                                   draws, num_policy, chunk)
      rows.append(dict(
          run=path, env=config.env_name, dataset=trained.dataset,
          algo=report.algo_label(dataclasses.asdict(config)),
          target=config.target if config.algo == "mombo" else "", states=states,
          seed=trained.seeds[i], epoch=trained.epoch, beta=float(config.beta),
          transitions=int(len(res["exact"])), draws=int(draws), num_policy=int(num_policy),
          **{k: res[f"{k}_mean"] for k in ("accuracy", "tightness", "accuracy_unscaled",
                                           "tightness_unscaled")},
          penalty_mean=res["penalty_mean"], penalty_unscaled_mean=res["penalty_unscaled_mean"],
          bellman_error_mean=res["bellman_error_mean"]))
      log(f"{path} seed {trained.seeds[i]} ({states} states): {len(res['exact'])} tuples x "
          f"{draws} draws, accuracy {res['accuracy_mean']:.2f} (unscaled "
          f"{res['accuracy_unscaled_mean']:.2f}), tightness {res['tightness_mean']:.3g} "
          f"(unscaled {res['tightness_unscaled_mean']:.3g})")
  return rows


class _Seeds:
  """Per-seed values of one (env, dataset, algo) for report.build_table."""

  def __init__(self, rows):
    self.rows = rows

  def stat(self, what):
    import numpy as np
    x = np.array([r[what] for r in self.rows], float)
    return (float(x.mean()), float(x.std())) if x.size else (None, None)


METRICS = (("accuracy", "Accuracy (U as trained: beta / lambda included)"),
           ("tightness", "Tightness (U as trained)"),
           ("accuracy_unscaled", "Accuracy (U / beta)"),
           ("tightness_unscaled", "Tightness (U / beta)"))


# The paper's Table 2 column goes beside the blocks of its metric names (accuracy, tightness: U as
# trained). Its appendix does not settle what its U was, so the note says so instead of choosing.
PAPER_NOTE = (
    "*({paper})* columns: the paper's Table 2 ({citation}): mean ± std over its 4 seeds, on tuples "
    "of 10 evaluation episodes of its trained policies, every 10th step and the last (our "
    "`--states=policy`); – where it has none (it reports the 12 D4RL tasks only). They stand "
    "beside our *U as trained* blocks (beta / lambda included: the penalty training subtracts), "
    "but the paper does not say whether its U carried the coefficient (its definitions of U carry "
    "none), so they are as comparable with the *U / beta* blocks. Nor does it say which MOMBO "
    "quantifier it scored: its MOMBO runs are the released code's (target `{target}`), its "
    "written U is eq. (1)'s moment-matched std (our `lcb`), and the released code holds no "
    "Table 2 script.")


def table_markdown(rows):
  """uncertainty.md: the paper's table per metric (mean +- std over seeds; the paper's Table 2
  numbers beside the as-trained accuracy and tightness), then the mean U and Bellman error per
  task and algorithm."""
  import numpy as np
  from mombo_jax import paper_results, report
  groups = {}
  for r in rows:
    groups.setdefault((r["env"], r["dataset"], r["algo"]), []).append(r)
  table = report.build_table({k: _Seeds(v) for k, v in groups.items()}, metrics=METRICS, digits=3,
                             paper=True)
  states = sorted({r["states"] for r in rows})
  draws = sorted({r["draws"] for r in rows})
  policy = sorted({r["num_policy"] for r in rows})
  text = report.render_markdown(
      table, title=f"Uncertainty quantifiers (paper Table 2), states={','.join(states)}",
      what="over seeds of each seed's mean over its tuples and draws")
  # render_markdown's first note on the paper's columns describes Table 1 (scores after training);
  # these are Table 2's.
  generic = report.paper_footnotes(table)
  if generic:
    text = text.replace(generic[0], PAPER_NOTE.format(
        paper=report.PAPER, citation=paper_results.CITATION,
        target=paper_results.PAPER_MOMBO_TARGET), 1)
  lines = ["", "Accuracy = 1(U >= |B Q - B^ Q|), tightness = U - |B Q - B^ Q|, B Q the exact "
           f"backup on the real s' ({','.join(map(str, policy))} policy samples), B^ Q one "
           f"draw of the learned model ({','.join(map(str, draws))} draws per tuple); see "
           "experiments/uncertainty.py and SPEC.md section 9.", "",
           "## Mean U and Bellman error", "",
           "| Dataset | Algorithm | Seeds | Tuples | beta | U (as trained) | U / beta "
           "| abs(B Q - B^ Q) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
  for (env, dataset, algo), seeds in sorted(groups.items()):
    stat = _Seeds(seeds).stat
    cells = [f"{stat(k)[0]:.4g} ± {stat(k)[1]:.2g}"
             for k in ("penalty_mean", "penalty_unscaled_mean", "bellman_error_mean")]
    tuples = int(round(np.mean([s["transitions"] for s in seeds])))
    betas = ",".join(sorted({f"{s['beta']:g}" for s in seeds}))
    lines.append(f"| {dataset} | {algo} | {len(seeds)} | {tuples} | {betas} | "
                 + " | ".join(cells) + " |")
  return text + "\n".join(lines) + "\n"


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if not FLAGS.runs:
    sys.exit("error: --runs is required (run workdirs or folders holding them).")
  for name in ("episodes", "every", "num_states", "draws", "num_policy", "chunk"):
    if getattr(FLAGS, name) < 1:
      sys.exit(f"error: --{name} must be >= 1, got {getattr(FLAGS, name)}.")
  from mombo_jax import outputs
  try:
    run_dirs = find_run_dirs(FLAGS.runs)
    rows = evaluate_runs(run_dirs, FLAGS.states, FLAGS.episodes, FLAGS.every, FLAGS.num_states,
                         FLAGS.draws, FLAGS.num_policy, FLAGS.seed, FLAGS.max_episode_steps,
                         FLAGS.chunk)
  except (ValueError, FileNotFoundError) as e:       # data.DatasetNotFoundError is one
    sys.exit(f"error: {e}")
  out = FLAGS.out or FLAGS.runs[0]
  os.makedirs(out, exist_ok=True)
  csv_name, md_name = output_names(FLAGS.states)
  outputs.write_rows(os.path.join(out, csv_name), rows)
  with open(os.path.join(out, md_name), "w") as f:
    f.write(table_markdown(rows))
  print(f"wrote {os.path.join(out, csv_name)} and {md_name}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
