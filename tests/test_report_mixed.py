"""The mixed datasets' table (mombo_jax.report.mixed, written by mombo_jax.report.writer): tiny
fake run folders (tests.test_report._write_run, no training) on hopper's mixed datasets beside one
D4RL run; the table in the paper's appendix layout (share, partner, environment; an average per
share), the paper's numbers beside ours, and runs below the paper's setup (a reduced budget, an
expert partner from a shorter SAC run) marked as such everywhere."""
import csv
import json

import numpy as np
import pytest

from mombo_jax.report import mixed, paper_setup, writer
from tests.test_report import _write_run

ALGOS = (("mopo", "elite_spread", 10.0), ("mobile", "elite_spread", 20.0),
         ("mombo", "elite_spread", 30.0))
DATASETS = ("hopper-random-expert-50pct", "hopper-random-medium-1pct",
            "hopper-random-expert-1pct", "hopper-random-medium-50pct")
REDUCED = "expert actor from a SAC run of 250,000 steps (D4RL's recipe: 1,000,000)"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
  """Every (mixed dataset, algorithm) on a reduced budget (20 epochs of the tiny preset, 2
  seeds; one setup, so one column per algorithm), the expert partner's actor from a shorter SAC
  run (config.json's data_reduced, as launch writes it); plus one hopper-random run (the D4RL
  table)."""
  root = tmp_path_factory.mktemp("mixed_runs")
  for dataset in DATASETS:
    for algo, target, level in ALGOS:
      scores = level + np.arange(4)[:, None] + np.arange(2)[None, :] / 4.0 + len(dataset) / 100
      path = root / dataset / algo
      _write_run(str(path), dataset, algo, [0, 1], scores, target, preset="tiny", epochs=20,
                 data={"num_transitions": 1_000_000})
      if "expert" in dataset:
        _add_reduced(path)
  # Another algorithm label (MOMBO's lcb target), so the mixed table's columns stay one each.
  _write_run(str(root / "hopper-random" / "mombo"), "hopper-random", "mombo", [0],
             np.full((3, 1), 5.0), "lcb")
  out = root / "out"
  result = writer.write_report([str(root)], str(out), log=lambda *_: None)
  return result, out


def _add_reduced(path):
  """config.json as a run on a reduced mixed dataset writes it (launch: data_reduced)."""
  with open(path / "config.json") as f:
    record = json.load(f)
  record["data_reduced"] = [f"hopper-expert: {REDUCED}"]
  with open(path / "config.json", "w") as f:
    json.dump(record, f)


def test_rows_and_columns_follow_the_papers_appendix_table(report):
  result, _ = report
  table = result["mixed_table"]
  assert table.rows == [("1", "hopper", "hopper-random-medium-1pct"),
                        ("1", "hopper", "hopper-random-expert-1pct"),
                        ("50", "hopper", "hopper-random-medium-50pct"),
                        ("50", "hopper", "hopper-random-expert-50pct")]
  final, aulc = table.blocks
  assert (final.metric, aulc.metric) == ("final", "aulc")
  assert final.columns == ["MOPO", "MOPO (paper)", "MOBILE", "MOBILE (paper)",
                           "MOMBO (elite_spread)", "MOMBO (paper)"]
  # The paper's appendix numbers beside ours (paper_results.MIXED).
  i = table.rows.index(("1", "hopper", "hopper-random-medium-1pct"))
  assert (final.mean[i, 1], final.std[i, 1]) == (48.9, 25.7)
  assert (aulc.mean[i, 5], aulc.std[i, 5]) == (27.3, 2.8)
  # Our final score: the last evaluation's mean over seeds (level + 3 + mean of s / 4).
  assert final.mean[i, 4] == pytest.approx(30 + 3 + 0.125 + len(table.rows[i][2]) / 100)
  # An average per share, over that share's rows only.
  assert set(final.type_avg) == {"1", "50"}
  np.testing.assert_allclose(final.type_avg["1"][0][4], final.mean[:2, 4].mean())
  # The D4RL table keeps the other datasets, and no mixed row.
  assert [r[2] for r in result["table"].rows] == ["hopper-random"]


def test_markdown_has_the_mixed_section_in_the_papers_layout(report):
  _, out = report
  text = (out / "report.md").read_text()
  section = text.split(f"## {writer.MIXED_TITLE}")[1]
  header = section.split("### ")[1].splitlines()[2]
  assert header.startswith("| Ratio (%) | Dataset type | Environment | MOPO | MOPO (paper) |")
  assert "| 1 | random-medium | hopper | " in section
  assert "| 50 | random-expert | hopper | " in section
  assert "| *Average on 50* | | | " in section
  # The D4RL table above it holds no mixed dataset.
  assert "random-medium" not in text.split(f"## {writer.MIXED_TITLE}")[0]
  tex = (out / "report.tex").read_text()
  assert r"\multirow{2}{*}{Ratio (\%)}" in tex and r"\multicolumn{3}{r}{Average Score}" in tex


def test_reduced_runs_are_labelled_and_compete_for_nothing(report):
  result, out = report
  table = result["mixed_table"]
  final = table.blocks[0]
  # Below the paper's setup: every cell marked §, none bold or underlined beside the paper's.
  assert not final.bold.any() and not final.under.any()
  assert all(final.marks.get((i, j)) for i in range(4) for j in (0, 2, 4))
  e = table.rows.index(("50", "hopper", "hopper-random-expert-50pct"))
  m = table.rows.index(("50", "hopper", "hopper-random-medium-50pct"))
  expert_notes, medium_notes = (" ".join(t for _, t in final.marks[(r, 4)]) for r in (e, m))
  # 20 epochs of the tiny preset's 20 steps, its small networks; the partner's short SAC run
  # only where the partner is the expert.
  assert "400 gradient steps (paper: 2,000,000)" in medium_notes
  assert "actor layers 32x32 (paper: 1024x1024x1024x1024x1024)" in medium_notes
  assert REDUCED in expert_notes and REDUCED not in medium_notes
  text = (out / "report.md").read_text()
  section = text.split(f"## {writer.MIXED_TITLE}")[1]
  assert "2 seed(s) each, 400 gradient steps (the paper: 4 seeds" in section
  assert "BELOW THE PAPER'S SETUP" in section and REDUCED in section
  # report.csv: every cell, ours and the paper's, the reduced ones saying why.
  with open(out / "report.csv") as f:
    rows = list(csv.DictReader(f))
  ours = [r for r in rows if r["dataset"] == "hopper-random-expert-50pct" and r["source"] == "ours"]
  assert len(ours) == 6 and all(REDUCED in r["below_paper_setup"] for r in ours)
  paper = [r for r in rows if r["dataset"] == "hopper-random-medium-1pct"
           and r["source"] != "ours"]
  assert {r["column"] for r in paper} == {"MOPO (paper)", "MOBILE (paper)", "MOMBO (paper)"}


def test_only_mixed_runs_and_names(tmp_path):
  _write_run(str(tmp_path / "a"), "hopper-random-medium-5pct", "mombo",
             [0], np.full((2, 1), 7.0), "elite_spread")
  result = writer.write_report([str(tmp_path)], str(tmp_path / "out"), log=lambda *_: None)
  assert result["table"] is None and result["mixed_table"].rows == [
      ("5", "hopper", "hopper-random-medium-5pct")]
  text = (tmp_path / "out" / "report.md").read_text()
  assert text.startswith("# Results of 1 run(s)") and "## Runs" in text
  assert mixed.mixed_parts("mombo/walker2d/random-expert-10pct-v0") == ("walker2d", "expert", 10)
  assert mixed.mixed_parts("hopper-random") is None
  assert mixed.mixed_parts("d4rl/hopper/medium-v2") is None


def test_shortfalls_read_the_reduced_recipe():
  config = {"env": "hopper-random-expert-1pct", "algo": "mopo", "epochs": 2000,
            "steps_per_epoch": 1000, "data_reduced": [f"hopper-expert: {REDUCED}"]}
  assert paper_setup.shortfalls(config)[-1] == f"dataset: hopper-expert: {REDUCED}"
  assert not any("dataset:" in s for s in paper_setup.shortfalls(
      dict(config, data_reduced=[])))
