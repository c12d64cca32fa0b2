"""The uncertainty-quantifier experiment over trained runs (the paper's Table 2; SPEC.md section 9;
experiments.uncertainty is its CLI and documents the definitions and the output columns).

This module owns the experiment's runs and outputs: finding the run workdirs (`find_run_dirs`),
scoring every seed of every run on policy or dataset tuples (`evaluate_runs`, one row per run and
seed), and writing uncertainty[_<states>].csv / .md (`write_outputs`, `table_markdown`: mean +- std
over seeds beside the paper's own Table 2 numbers). The per-tuple Bellman backups, penalties and
scores are mombo_jax.quantifier_quality's.
"""
import os

# jax, numpy and the other modules are imported where they are used: experiments.uncertainty imports
# this module before parsing its flags, and --help should not wait for jax.

STATES = ("policy", "dataset")


def find_run_dirs(dirs):
  """Run workdirs under `dirs` holding config.json and checkpoints/ (sorted); ValueError if none."""
  from mombo_jax import workdir
  from mombo_jax.errors import UserError
  try:
    found, _ = workdir.find(dirs, need=(workdir.CONFIG, workdir.CHECKPOINTS))
  except UserError as e:
    raise ValueError(f"--runs: {e}") from None
  if not found:
    raise ValueError(f"No runs (config.json + checkpoints/) found under {', '.join(dirs)}.")
  return found


def output_names(states):
  """(csv, md) file names of a --states mode: the paper's mode keeps the plain names."""
  suffix = "" if states == "policy" else f"_{states}"
  return f"uncertainty{suffix}.csv", f"uncertainty{suffix}.md"


def evaluate_runs(run_dirs, states="policy", episodes=10, every=10, num_states=1000, draws=100,
                  num_policy=1000, seed=0, max_episode_steps=None, chunk=256, log=print):
  """One row per (run, seed), as a dict of scalars: run, env, dataset, algo, target, states, seed,
  epoch, beta, transitions (tuples scored), draws, num_policy, accuracy, tightness,
  accuracy_unscaled, tightness_unscaled, penalty_mean, penalty_unscaled_mean, bellman_error_mean
  (each seed's mean over its tuples and draws; experiments.uncertainty defines them). The arguments
  are experiments.uncertainty's flags of the same names; ValueError / FileNotFoundError (a dataset
  not found) for what the user can fix. log: a line per run (what reading its checkpoint read and
  the peak memory, TrainedRun.memory_line) and a progress line per seed."""
  import dataclasses

  import jax
  from mombo_jax import data, quantifier_quality, results
  from mombo_jax.trained import load_run
  if states not in STATES:
    raise ValueError(f"--states={states}: choose one of {', '.join(STATES)}.")
  rows, datasets = [], {}
  for path in run_dirs:
    trained = load_run(path)
    log(f"{path}: {trained.memory_line()}")
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
          algo=results.algo_label(dataclasses.asdict(config)),
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
  """Per-seed values of one (env, dataset, algo) for tables.build_table."""

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
  from mombo_jax import paper_results, report, tables
  groups = {}
  for r in rows:
    groups.setdefault((r["env"], r["dataset"], r["algo"]), []).append(r)
  table = tables.build_table({k: _Seeds(v) for k, v in groups.items()}, metrics=METRICS, digits=3,
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
        paper=tables.PAPER, citation=paper_results.CITATION,
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


def write_outputs(rows, out: str, states: str = "policy"):
  """Writes the rows as <out>/uncertainty[_<states>].csv and their tables as the .md beside it;
  returns (csv path, md path)."""
  from mombo_jax import outputs
  os.makedirs(out, exist_ok=True)
  csv_path, md_path = (os.path.join(out, name) for name in output_names(states))
  outputs.write_rows(csv_path, rows)
  with open(md_path, "w") as f:
    f.write(table_markdown(rows))
  return csv_path, md_path
