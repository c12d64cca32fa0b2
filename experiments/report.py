r"""Tables and learning curves over many runs, in the paper's layout.

  python -m experiments.report runs/                       # writes into runs/
  python -m experiments.report runs/a runs/b --out=report/

Finds every run workdir (config.json + metrics.csv + summary.json, written by experiments.run)
under the folders, groups runs by environment, dataset and algorithm (seeds of several runs pooled;
MOMBO's target, and beta where runs of one algorithm on one dataset differ in it, are part of the
algorithm and never pooled), and writes
- report.md, report.tex: final normalised score (last evaluation), mean of the last 10
  evaluations, and AULC; each as mean +- std over seeds with a 95% bootstrap interval over seeds,
  best in bold, within one std of the best underlined, averages and average ranks; the paper's
  published number (mombo_jax.paper_results) in a column beside each algorithm's, with footnotes
  saying what it is (the paper's MOMBO is the released code's target, elite_spread);
  report.md also lists the runs, seeds and beta of every cell;
- report.csv: every number of the tables, ours with its interval, the paper's with its table;
- curves_<env>.png: learning curves, mean +- std over seeds.
"""
import sys

from absl import app, flags

FLAGS = flags.FLAGS


def define_flags():
  """Defined only when run as the program (absl flags are global)."""
  flags.DEFINE_string("out", None, "Output folder (default: the first folder given).")


def main(argv):
  from mombo_jax import report
  from mombo_jax.errors import UserError
  dirs = argv[1:]
  if not dirs:
    sys.exit("error: pass one or more folders holding runs, e.g. "
             "`python -m experiments.report runs/`.")
  try:
    result = report.write_report(dirs, FLAGS.out, log=lambda m: print(m, file=sys.stderr))
  except UserError as e:
    sys.exit(f"error: {e}")
  print(f"{len(result['runs'])} run(s) in {len(result['groups'])} group(s); wrote "
        + ", ".join(result["files"]))


if __name__ == "__main__":
  define_flags()
  app.run(main)
