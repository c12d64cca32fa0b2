"""experiments.report's writer end to end (mombo_jax.report.writer) on run folders written in the
real on-disk format by mombo_jax.records.outputs' writers (tests.test_report._write_run): one report
of synthetic runs whose per-seed scores are known, written once (the `written` fixture), and one
proposition of it per test: columns, numbers, marks, averages, ranks, footnotes, pooling, figures,
LaTeX, CSV; then the command line."""
import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from mombo_jax.report import footnotes, paper_results, results, tables, writer
from tests.conftest import HANG_S
from tests.test_report import NAN, _md_block, _number, _write_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Two hopper tasks x three algorithms (MOMBO with the lcb target, + a MOMBO elite_spread column
  on one task), one group split over two launches, one diverged seed, one unfinished run folder
  and one walker2d run; 12 evaluations each (more than LAST_K). Returns (root, {(dataset, label):
  per-seed scores [T, S], every seed}, the unfinished folder)."""
  root = tmp_path_factory.mktemp("runs")
  rng = np.random.default_rng(0)
  truth = {}

  def add(sub, env, algo, seeds, label, target="lcb", diverged=(), level=50.0):
    scores = level + rng.normal(0, 5, (12, len(seeds))) + np.arange(12)[:, None]
    _write_run(str(root / sub), env, algo, seeds, scores, target, diverged)
    old = truth.get((env, label))
    truth[(env, label)] = scores if old is None else np.hstack([old, scores])

  add("hopper-random/mombo/s0x2", "hopper-random", "mombo", [0, 1], "MOMBO (lcb)", level=60)
  add("hopper-random/mombo/s2x2", "hopper-random", "mombo", [2, 3], "MOMBO (lcb)", level=60)
  add("hopper-random/mobile/s0x3", "hopper-random", "mobile", [0, 1, 2], "MOBILE", diverged=(1,),
      level=55)
  add("hopper-random/mopo/s0x2", "hopper-random", "mopo", [0, 1], "MOPO", level=30)
  add("hopper-medium/mombo/s0x2", "hopper-medium", "mombo", [0, 1], "MOMBO (lcb)", level=70)
  add("hopper-medium/mombo-es/s0x2", "hopper-medium", "mombo", [0, 1], "MOMBO (elite_spread)",
      target="elite_spread", level=72)
  add("hopper-medium/mobile/s0x2", "hopper-medium", "mobile", [0, 1], "MOBILE", level=71)
  add("hopper-medium/mopo/s0x2", "hopper-medium", "mopo", [0, 1], "MOPO", level=40)
  add("walker2d-random/mombo/s0x2", "walker2d-random", "mombo", [0, 1], "MOMBO (lcb)", level=20)
  # An unfinished run: config.json and metrics.csv, no summary.json yet.
  unfinished = root / "hopper-random" / "mopo" / "s9x1"
  _write_run(str(unfinished), "hopper-random", "mopo", [9], np.zeros((2, 1)))
  os.remove(unfinished / "summary.json")
  return root, truth, str(unfinished)


# The table prints one decimal: numbers are checked to half a unit of it (plus float slack).
HALF = 0.05 + 1e-9
BLOCKS = {"Normalised score (final evaluation)": ("final", lambda s: s[-1]),
          "Normalised score (mean of the last 10 evaluations)": ("last",
                                                                 lambda s: s[-10:].mean(axis=0)),
          "AULC": ("aulc", lambda s: s.mean(axis=0))}
OURS = ["MOPO", "MOBILE", "MOMBO (lcb)", "MOMBO (elite_spread)"]


TASKS = ("hopper-random", "hopper-medium", "walker2d-random")


@pytest.fixture(scope="module")
def written(runs, tmp_path_factory):
  """writer.write_report over the `runs` folders, once for the tests below: {result, logged (its
  log lines), text (report.md), out (the folder written)}."""
  out = tmp_path_factory.mktemp("report")
  logged = []
  result = writer.write_report([str(runs[0])], str(out), log=logged.append)
  return dict(result=result, logged=logged, text=(out / "report.md").read_text(), out=out)


def _block(written, name):
  """(columns, cells) of report.md's block `name` (_md_block), our columns' indices (OURS)."""
  columns, cells = _md_block(written["text"], name)
  return columns, cells, [columns.index(a) for a in OURS]


def _means(runs, name):
  """{(dataset, label): the mean over seeds of block `name`'s per-seed metric} from the truth."""
  _, fn = BLOCKS[name]
  return {key: fn(scores).mean() for key, scores in runs[1].items()}


PAPER_BLOCKS = [name for name, (metric, _) in BLOCKS.items() if metric != "last"]


@pytest.mark.slow
def test_an_unfinished_run_is_skipped_with_a_warning_naming_it(runs, written):
  _, _, unfinished = runs
  assert any(unfinished in w and "summary.json" in w for w in written["logged"]), written["logged"]
  assert len(written["result"]["runs"]) == 9


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BLOCKS))
def test_our_columns_come_in_the_papers_order_each_beside_the_papers(written, name):
  """Each algorithm's column is followed by the paper's where the paper reports the metric
  (final, AULC; not the mean of the last 10)."""
  columns, _, _ = _block(written, name)
  assert [c for c in columns if not c.endswith("(paper)")] == OURS
  if BLOCKS[name][0] == "last":
    assert columns == OURS
  else:
    assert columns == ["MOPO", "MOPO (paper)", "MOBILE", "MOBILE (paper)", "MOMBO (lcb)",
                       "MOMBO (elite_spread)", "MOMBO (paper)"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BLOCKS))
def test_each_cell_is_its_seeds_mean_std_and_bootstrap_interval(runs, written, name):
  columns, cells, _ = _block(written, name)
  _, fn = BLOCKS[name]
  for (dataset, label), scores in runs[1].items():
    per_seed = fn(scores)
    env, _, dtype = dataset.partition("-")
    mean, std, _, _, ci = _number(cells[(dtype, env)][columns.index(label)])
    assert abs(mean - per_seed.mean()) <= HALF, (dataset, label)
    assert abs(std - per_seed.std()) <= HALF, (dataset, label)
    # The interval is the bootstrap's of these seeds, and holds the mean.
    lo, hi = results.bootstrap_ci(per_seed)
    assert ci[0] == pytest.approx(lo, abs=HALF) and ci[1] == pytest.approx(hi, abs=HALF)
    assert lo <= per_seed.mean() <= hi


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BLOCKS))
def test_bold_and_underline_follow_the_rule_on_the_true_numbers(runs, written, name):
  """Our columns only; a task an algorithm did not run is footnotes.MISSING."""
  _, cells, ours = _block(written, name)
  _, fn = BLOCKS[name]
  means, truth = _means(runs, name), runs[1]
  for dataset in ("hopper-random", "hopper-medium"):
    m = np.array([means.get((dataset, a), NAN) for a in OURS])
    s = np.array([fn(truth[(dataset, a)]).std() if (dataset, a) in truth else NAN for a in OURS])
    bold, under = tables.mark_row(m, s)
    row = [cells[(dataset.partition("-")[2], "hopper")][j] for j in ours]
    for j, cell in enumerate(row):
      if np.isnan(m[j]):
        assert cell == footnotes.MISSING
      else:
        assert _number(cell)[2:4] == (bool(bold[j]), bool(under[j])), (dataset, OURS[j])


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPER_BLOCKS)
def test_the_papers_columns_hold_its_numbers_never_marked(written, name):
  """Its mean +- std as printed, never bold or underlined; the dagger of its footnote."""
  columns, cells, _ = _block(written, name)
  metric = BLOCKS[name][0]
  papers = [(j, c.split()[0]) for j, c in enumerate(columns) if c.endswith("(paper)")]
  assert len(papers) == 3
  for j, base in papers:
    for (dtype, env), row in cells.items():
      if env in ("hopper", "walker2d"):
        want = paper_results.lookup(metric, f"{env}-{dtype}", base)
        assert row[j] == f"{want[0]:.1f} ± {want[1]:.1f}" + (
            " †" if (metric, base, dtype, env) == ("final", "MOMBO", "random", "hopper") else "")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BLOCKS))
def test_average_scores_mark_columns_missing_a_task_and_bold_only_a_complete_one(runs, written,
                                                                                  name):
  """Over all three tasks only MOMBO (lcb) ran on every task (walker2d-random has it alone,
  hopper-medium has MOMBO (elite_spread) besides): the other averages are marked * and may not
  take the bold from a column that covers every task."""
  columns, cells, ours = _block(written, name)
  means = _means(runs, name)
  avg = cells[("**Average score**", "")]
  for j, a in zip(ours, OURS):
    vals = [means[(d, a)] for d in TASKS if (d, a) in means]
    assert float(avg[j].strip("*\\")) == pytest.approx(np.mean(vals), abs=HALF)
  assert ["\\*" in avg[j] for j in ours] == [True, True, False, True]
  assert [c.startswith("**") for c in avg] == [c == "MOMBO (lcb)" for c in columns]


@pytest.mark.slow
@pytest.mark.parametrize("name", PAPER_BLOCKS)
def test_the_papers_averages_cover_the_tasks_we_ran_its_algorithm_on_unranked(runs, written, name):
  """MOPO and MOBILE: not walker2d-random, so that they read against ours."""
  columns, cells, _ = _block(written, name)
  metric, means = BLOCKS[name][0], _means(runs, name)
  avg = cells[("**Average score**", "")]
  for j, c in enumerate(columns):
    if c.endswith("(paper)"):
      base = c.split()[0]
      ran = [d for d in TASKS if any((d, a) in means for a in OURS if a.startswith(base))]
      want = np.mean([paper_results.lookup(metric, d, base)[0] for d in ran])
      assert float(avg[j].strip("*\\")) == pytest.approx(want, abs=HALF)
      assert ("\\*" in avg[j]) == (len(ran) < len(TASKS)) and not avg[j].startswith("**")
      assert cells[("**Average rank**", "")][j] == footnotes.MISSING


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BLOCKS))
def test_average_ranks_are_each_tasks_ranks_among_the_algorithms_present(runs, written, name):
  _, cells, ours = _block(written, name)
  means = _means(runs, name)
  table = np.array([[means.get((d, a), NAN) for a in OURS] for d in TASKS])
  want = tables.average_ranks(table)
  got = [float(cells[("**Average rank**", "")][j].strip("*\\")) for j in ours]
  np.testing.assert_allclose(got, want, atol=HALF)
  np.testing.assert_allclose(want, [np.mean([tables.ranks(r)[j] for r in table
                                             if not np.isnan(r[j])]) for j in range(4)])


@pytest.mark.slow
def test_the_footnotes_say_which_mombo_the_papers_is_and_explain_the_dagger(written):
  text = written["text"]
  assert "MOMBO (paper)* is the paper's MOMBO" in text and "`elite_spread`" in text
  assert "† MOMBO on hopper-random: high std from one failed repetition" in text


@pytest.mark.slow
def test_launches_of_one_group_pool_and_a_diverged_seed_counts_marked(written):
  """The MOMBO (lcb) hopper-random group holds seeds 0-3 of two launches; MOBILE's seed 1
  diverged and counts (at its frozen policy), marked in the runs table."""
  groups, text = written["result"]["groups"], written["text"]
  assert sorted(groups[("hopper", "hopper-random", "MOMBO (lcb)")].seeds) == [0, 1, 2, 3]
  assert groups[("hopper", "hopper-random", "MOBILE")].seeds == [0, 1, 2]
  assert groups[("hopper", "hopper-random", "MOBILE")].diverged == {1: 1}
  beta = groups[("hopper", "hopper-random", "MOMBO (lcb)")].beta
  assert f"| hopper-random | MOMBO (lcb) | {beta:g} | 4 (0, 1, 2, 3) | 12 |" in text.split(
      "## Runs")[1]
  assert "| hopper-random | MOBILE | 5 | 3 (0, 1‡, 2), 1 diverged | 12 |" in text


@pytest.mark.slow
def test_a_curve_figure_per_env(written):
  for env in ("hopper", "walker2d"):
    assert (written["out"] / f"curves_{env}.png").stat().st_size > 10_000


@pytest.mark.slow
def test_the_latex_tables_mark_and_name_as_the_markdown(written):
  tex = (written["out"] / "report.tex").read_text()
  assert tex.count(r"\bf ") >= 4 and tex.count(r"\begin{tabular}") == 3
  assert "Average Ranking" in tex and r"\texttt{MOMBO (paper)}" in tex
  assert r"\texttt{MOMBO (elite\_spread)}" in tex and r"$25.4 \sd{\pm 10.2}{}^{\dagger}$" in tex
  assert r"\texttt{elite\_spread}" in tex   # the footnote


@pytest.mark.slow
def test_report_csv_holds_every_printed_number_ours_with_its_interval(runs, written):
  with open(written["out"] / "report.csv") as f:
    rows = list(csv.DictReader(f))
  got = {(r["dataset"], r["column"], r["metric"]): r for r in rows}
  r = got[("hopper-random", "MOMBO (lcb)", "last")]
  per_seed = runs[1][("hopper-random", "MOMBO (lcb)")][-10:].mean(axis=0)
  assert float(r["mean"]) == pytest.approx(per_seed.mean(), rel=1e-9)
  assert float(r["ci_low"]) <= float(r["mean"]) <= float(r["ci_high"]) and r["source"] == "ours"
  r = got[("hopper-medium", "MOBILE (paper)", "aulc")]
  assert (float(r["mean"]), float(r["std"])) == (82.2, 7.3) and r["source"].startswith("Table 1")
  assert ("hopper-medium", "MOBILE (paper)", "last") not in got


@pytest.mark.slow
def test_cli_writes_into_the_first_folder_and_warns(runs, tmp_path):
  root, _, unfinished = runs
  out = subprocess.run([sys.executable, "-m", "experiments.report", str(root)],
                       capture_output=True, text=True, timeout=HANG_S)
  assert out.returncode == 0, out.stderr
  assert f"warning: skipping {unfinished}" in out.stderr
  assert (root / "report.md").exists() and (root / "curves_hopper.png").exists()
  empty = tmp_path / "empty"
  empty.mkdir()
  out = subprocess.run([sys.executable, "-m", "experiments.report", str(empty), str(tmp_path)],
                       capture_output=True, text=True, timeout=HANG_S)
  assert out.returncode != 0 and "Traceback" not in out.stderr
  assert f"No runs found under {empty}, {tmp_path}" in out.stderr


