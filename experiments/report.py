r"""Tables and learning curves over many runs, in the paper's layout.

  python -m experiments.report runs/                       # writes into runs/
  python -m experiments.report runs/a runs/b --out=report/

Finds every run workdir (config.json + metrics.csv + summary.json, written by experiments.run)
under the folders, groups runs by environment, dataset, algorithm and setup (seeds of several runs
pooled; MOMBO's target always, and where runs of one algorithm differ in their setup anywhere in
the table - beta, epochs, steps_per_epoch, any config.json field but the seeds and evaluation
fields, each task's own settings counting alike - the fields that differ are part of the column's
name: different setups are never pooled), and writes
- report.md, report.tex: final normalised score (last evaluation), mean of the last 10
  evaluations, and AULC; each as mean +- std over every seed (a diverged seed counts at its frozen
  policy; its cell is marked, a footnote giving the others' mean) with a 95% bootstrap interval
  over seeds, best of our columns in bold, within one std of the best underlined, averages and
  average ranks; a cell below the paper's setup (fewer gradient steps, a smaller preset, a reduced
  dataset) marked with a footnote and, beside the paper's numbers, never bold; the paper's
  published number (mombo_jax.report.paper_results) in a column beside each algorithm's, with
  footnotes saying what it is (the paper's MOMBO is the released code's target, elite_spread);
  report.md also lists the runs, seeds, budget and dataset size of every cell;
- report.csv: every number of the tables, ours with its interval, seeds, diverged seeds, the
  healthy seeds' mean and std and what falls short of the paper's setup, the paper's with its
  table;
- curves_<env>.png: learning curves, mean +- std over seeds;
- with the optional extra `report` (rliable): report.md's section *Across tasks (rliable)* (IQM,
  median, mean, optimality gap with stratified-bootstrap intervals, probability of improvement)
  and performance_profile.png (mombo_jax.report.aggregates); without it, one line naming the
  install.
report.md links docs/protocol.md, which says what every number is. Refused in one line, before
anything is written: a run whose summary.json names a protocol the report cannot read, one seed of
one setup in two folders, a seed without a finite score.

Every option is a --flag; every word is a folder to search (a word that is not a folder is refused
in one line, before anything is read).
"""
import os
import sys

from absl import flags

from experiments import _cli

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global)."""
  flags.DEFINE_string("out", None, "Output folder (default: the first folder given).")


def main(argv):
  dirs = argv[1:]
  if not dirs:
    raise _cli.UsageError("pass one or more folders holding runs, e.g. "
                          "`python -m experiments.report runs/`.")
  # Words are folders; one that is not is a typo or an option without its dashes (`out=x`):
  # refused whole, as the other entry points refuse stray words.
  stray = [d for d in dirs if not os.path.isdir(d)]
  if stray:
    raise _cli.UsageError(f"{' '.join(stray)}: not a folder. Every word names a folder of runs, "
                          "and every option is a --flag (e.g. --out=DIR; see --help).")
  from mombo_jax.report import writer
  result = writer.write_report(dirs, FLAGS.out, log=lambda m: print(m, file=sys.stderr))
  print(f"{len(result['runs'])} run(s) in {len(result['groups'])} group(s); wrote "
        + ", ".join(result["files"]))


if __name__ == "__main__":
  _cli.run(main, define_flags, words=True)
