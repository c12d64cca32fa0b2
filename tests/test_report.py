"""experiments.report and the modules behind it: the table rule (bold, underline, ranks;
mombo_jax.report.tables) on fixed tables, including the paper's own Table 1; the statistics
(bootstrap interval, mean of the last evaluations), labels and grouping (MOMBO's target, beta never
pooled; mombo_jax.report.results); the paper's columns; the writer's faults. Its run folders in the
real on-disk format (_write_run); the writer end to end on them: tests/test_report_written.py."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import mombo_jax
from mombo_jax.errors import UserError
from mombo_jax.records import outputs
from mombo_jax.report import latex, markdown, paper_results, protocols, results, tables, writer
from mombo_jax.report.labels import algo_label, base_algo, label_key
from mombo_jax.report.paper_setup import paper_dataset
from mombo_jax.settings import config as config_lib
from mombo_jax.storage import atomic
from tests.conftest import HANG_S

NAN = np.nan


# ------------------------------------------------------------------------- the rule, by hand

@pytest.mark.parametrize("means, stds, bold, under", [
    # Best 43.6 +- 1.1; 41.2 is 2.4 below: neither underlined.
    ([37.2, 41.2, 43.6], [1.6, 1.1, 1.1], [2], []),
    # Within one std of the BEST (0.9), not of its own (0.1): underlined.
    ([8.2, 22.1, 21.5], [5.6, 0.9, 0.1], [1], [2]),
    # 25.4 +- 10.2 is within its own std of 31.7 but not within the best's 0.1: not underlined.
    ([31.7, 31.3, 25.4], [0.1, 0.1, 10.2], [0], []),
    # Exactly one std below the best counts as within (dyadic numbers: no rounding).
    ([9.5, 10.0, 9.0], [1.0, 0.5, 1.0], [1], [0]),
    # Tied bests are both bold; the larger of their stds (1.0) decides the underline of 4.0.
    ([5.0, 5.0, 4.0], [0.25, 1.0, 0.0], [0, 1], [2]),
    # A missing cell is neither bold nor underlined, and does not count as the best.
    ([NAN, 3.0, 2.0], [NAN, 0.5, 2.0], [1], []),
    ([NAN, NAN], [NAN, NAN], [], []),
])
def test_bold_and_underline(means, stds, bold, under):
  b, u = tables.mark_row(means, stds)
  assert np.flatnonzero(b).tolist() == bold
  assert np.flatnonzero(u).tolist() == under


def test_ranks_with_ties_and_missing_cells():
  np.testing.assert_array_equal(tables.ranks([5.0, 5.0, 4.0]), [1.5, 1.5, 3.0])
  np.testing.assert_array_equal(tables.ranks([1.0, 2.0, 2.0, 2.0]), [4.0, 2.0, 2.0, 2.0])
  r = tables.ranks([NAN, 3.0, 2.0])
  assert np.isnan(r[0]) and r[1:].tolist() == [1.0, 2.0]
  # Average over the rows where the algorithm has a value.
  table = [[1.0, 2.0, 3.0], [3.0, 2.0, NAN], [2.0, 2.0, 1.0]]
  np.testing.assert_allclose(tables.average_ranks(table), [(3 + 1 + 1.5) / 3,
                                                           (2 + 2 + 1.5) / 3, (1 + 3) / 2])


# The paper's Table 1 (D4RL), columns MOPO, MOBILE, MOMBO; rows hc/hop/w x random, medium,
# medium-replay, medium-expert. (mean, std) per cell, and the cells the paper sets in bold and
# underlined.
PAPER_FINAL = [
    [(37.2, 1.6), (41.2, 1.1), (43.6, 1.1)], [(31.7, 0.1), (31.3, 0.1), (25.4, 10.2)],
    [(8.2, 5.6), (22.1, 0.9), (21.5, 0.1)], [(72.4, 4.2), (75.8, 0.8), (76.1, 0.8)],
    [(62.8, 38.1), (103.6, 1.0), (104.2, 0.5)], [(85.4, 2.9), (88.3, 2.5), (86.4, 1.2)],
    [(72.1, 3.8), (71.9, 3.2), (72.0, 4.3)], [(92.7, 20.7), (105.1, 1.3), (104.8, 1.0)],
    [(85.9, 5.3), (90.5, 1.7), (89.6, 3.8)], [(83.6, 12.5), (100.9, 1.5), (103.3, 0.8)],
    [(74.9, 44.2), (112.5, 0.2), (112.6, 0.3)], [(108.2, 4.3), (114.5, 2.2), (113.9, 0.9)]]
PAPER_FINAL_BOLD = [2, 0, 1, 2, 2, 1, 0, 1, 1, 2, 2, 1]
PAPER_FINAL_UNDER = [[], [], [2], [1], [], [2], [1, 2], [2], [2], [], [1], [2]]
PAPER_AULC = [
    [(36.3, 1.0), (39.5, 1.2), (41.4, 1.0)], [(28.6, 1.4), (23.6, 3.7), (17.3, 1.3)],
    [(5.4, 3.2), (18.0, 0.4), (19.2, 0.5)], [(70.9, 2.0), (72.1, 1.0), (73.0, 0.9)],
    [(37.0, 15.3), (82.2, 7.3), (95.9, 2.5)], [(77.6, 1.3), (79.0, 1.3), (84.0, 1.1)],
    [(68.4, 4.7), (67.9, 2.8), (68.7, 3.9)], [(81.7, 4.6), (78.7, 4.0), (87.3, 2.0)],
    [(65.3, 12.7), (79.9, 4.3), (80.8, 5.6)], [(77.1, 4.0), (94.5, 1.8), (95.2, 0.7)],
    [(55.6, 17.3), (82.7, 7.3), (84.3, 4.7)], [(88.3, 6.3), (94.3, 0.9), (98.9, 3.3)]]
PAPER_AULC_BOLD = [2, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]
PAPER_AULC_UNDER = [[], [], [], [1], [], [], [0, 1], [], [1], [1], [1], []]


@pytest.mark.parametrize("cells, bold, under, avg_rank", [
    (PAPER_FINAL, PAPER_FINAL_BOLD, PAPER_FINAL_UNDER, [32 / 12, 20 / 12, 20 / 12]),
    (PAPER_AULC, PAPER_AULC_BOLD, PAPER_AULC_UNDER, [32 / 12, 26 / 12, 14 / 12])])
def test_the_rule_reproduces_the_papers_table(cells, bold, under, avg_rank):
  """Every bold and underlined cell of the paper's Table 1, and its average ranks (2.7 / 1.7 /
  1.7 and 2.7 / 2.2 / 1.2): the rule is the paper's, not a look-alike."""
  means = np.array([[m for m, _ in row] for row in cells])
  stds = np.array([[s for _, s in row] for row in cells])
  for i in range(len(cells)):
    b, u = tables.mark_row(means[i], stds[i])
    assert np.flatnonzero(b).tolist() == [bold[i]], i
    assert np.flatnonzero(u).tolist() == under[i], i
  np.testing.assert_allclose(tables.average_ranks(means), avg_rank, rtol=1e-12)


@pytest.mark.parametrize("cells, metric", [(PAPER_FINAL, "final"), (PAPER_AULC, "aulc")])
def test_paper_results_agree_with_this_files_transcription(cells, metric):
  """Two transcriptions of Table 1 made independently (this file's,
  mombo_jax.report.paper_results')."""
  tasks = [f"{e}-{q}" for q in ("random", "medium", "medium-replay", "medium-expert")
           for e in ("halfcheetah", "hopper", "walker2d")]
  for task, row in zip(tasks, cells):
    for algo, cell in zip(("MOPO", "MOBILE", "MOMBO"), row):
      assert paper_results.lookup(metric, task, algo) == pytest.approx(cell, rel=1e-12)


# ---------------------------------------------------------------------- synthetic run folders

def _write_run(path, env, algo, seeds, scores, target="lcb", diverged=(), preset="paper",
               data=None, **overrides):
  """A run workdir exactly as experiments.run leaves it: config.json (the config's fields plus
  the dataset, and `data`, the dataset's record, when given), metrics.csv (one row per seed per
  evaluation) and summary.json, through the writers in mombo_jax.records.outputs. scores [T, S]: T
  evaluations spread over the preset's epochs (the paper's full budget by default: the report
  marks a run below it)."""
  os.makedirs(path, exist_ok=True)
  epochs = overrides.pop("epochs", config_lib.make_config(env, algo, preset).epochs)
  every = overrides.pop("eval_every", max(1, epochs // len(scores)))
  config = config_lib.make_config(env, algo, preset=preset, target=target, seed=seeds[0],
                                  num_seeds=len(seeds), epochs=every * len(scores),
                                  eval_every=every, **overrides)
  record = dict(config.settings(), dataset=env)
  if data is not None:
    record["data"] = data
  atomic.write_json(os.path.join(path, "config.json"), record)
  rows = [dict(epoch=(t + 1) * every, step=(t + 1) * every * config.steps_per_epoch, seed=int(s),
               return_mean=float(10 * scores[t][i]), normalized_score=float(scores[t][i]),
               diverged=float(int(s) in diverged), critic_loss=1.0)
          for t in range(len(scores)) for i, s in enumerate(seeds)]
  outputs.write_rows(os.path.join(path, "metrics.csv"), rows)
  bad = [{"seed": int(s), "epoch": 1, "quantity": "params"} for s in diverged]
  atomic.write_json(os.path.join(path, "summary.json"), outputs.summarise(rows, seeds, bad))


def _md_block(text, name):
  """{(type, env): [cell strings]} of one block of report.md, plus the summary rows by label."""
  block = text.split(f"## {name}")[1].split("\n## ")[0]
  lines = [l for l in block.splitlines() if l.startswith("|")]
  header = [c.strip() for c in lines[0].strip("|").split("|")]
  cells = {}
  for line in lines[2:]:
    parts = [c.strip() for c in line.strip("|").split("|")]
    cells[(parts[0], parts[1])] = parts[2:]
  return header[2:], cells


def _number(cell):
  """'**61.2 ± 3.4** [58.1, 64.0]' / '<u>61.2 ± 3.4</u> [..]' / '61.2 ± 3.4' -> (61.2, 3.4, bold,
  underlined, (58.1, 64.0) or None)."""
  m = re.search(r"(-?[\d.]+) ± (-?[\d.]+)", cell)
  ci = re.search(r"\[(-?[\d.]+), (-?[\d.]+)\]", cell)
  return (float(m.group(1)), float(m.group(2)), cell.startswith("**"), cell.startswith("<u>"),
          (float(ci.group(1)), float(ci.group(2))) if ci else None)


def test_missing_folder_and_no_runs_are_clear_errors(tmp_path):
  with pytest.raises(UserError, match="nowhere.*is not a folder"):
    writer.write_report([str(tmp_path / "nowhere")])
  (tmp_path / "half").mkdir()
  (tmp_path / "half" / "config.json").write_text("{}")
  logged = []
  with pytest.raises(UserError, match=f"No runs found under {tmp_path}.*skipped"):
    writer.write_report([str(tmp_path)], log=logged.append)
  assert logged == [f"warning: skipping {tmp_path / 'half'}: missing metrics.csv, summary.json "
                    "(unfinished run?)"]


# ----------------------------------------------------------------------- statistics and labels

def test_bootstrap_interval():
  # One seed (or identical seeds): the point itself; none: no interval.
  assert results.bootstrap_ci([42.0]) == (42.0, 42.0)
  assert results.bootstrap_ci([3.0, 3.0, 3.0]) == (3.0, 3.0)
  assert results.bootstrap_ci([]) == (None, None)
  x = np.array([10.0, 12.0, 30.0, 31.0])
  lo, hi = results.bootstrap_ci(x)
  # Fixed RNG seed: the same seeds always give the same interval; it holds the mean and cannot
  # leave the seeds' range.
  assert results.bootstrap_ci(x) == (lo, hi)
  assert x.min() <= lo < x.mean() < hi <= x.max()
  # The percentile interval of the resampled means, recomputed from the same resamples.
  rng = np.random.default_rng(results.BOOTSTRAP_SEED)
  means = x[rng.integers(0, 4, (results.N_BOOTSTRAP, 4))].mean(axis=1)
  np.testing.assert_allclose([lo, hi], np.quantile(means, [0.025, 0.975]), rtol=1e-12)
  # Many seeds: close to the normal interval mean +- 1.96 sd / sqrt(n).
  y = np.random.default_rng(3).normal(5.0, 2.0, 400)
  lo, hi = results.bootstrap_ci(y)
  half = 1.96 * y.std() / np.sqrt(len(y))
  assert lo == pytest.approx(y.mean() - half, abs=0.1 * half)
  assert hi == pytest.approx(y.mean() + half, abs=0.1 * half)


def test_labels_name_mombos_target():
  assert algo_label({"algo": "mopo", "target": "lcb"}) == "MOPO"
  assert algo_label({"algo": "mobile"}) == "MOBILE"
  for target in ("lcb", "elite_spread", "mixture"):
    assert algo_label({"algo": "mombo", "target": target}) == f"MOMBO ({target})"
  assert algo_label({"algo": "mombo"}) == "MOMBO (target?)"
  assert base_algo("MOMBO (elite_spread, β=3)") == "MOMBO"
  labels = ["MOMBO (mixture)", "MOBILE (β=5)", "MOMBO (elite_spread, β=3)", "MOPO",
            "MOMBO (elite_spread, β=0.5)", "MOBILE (β=1.5)", "MOMBO (lcb)"]
  assert sorted(labels, key=label_key) == [
      "MOPO", "MOBILE (β=1.5)", "MOBILE (β=5)", "MOMBO (lcb)", "MOMBO (elite_spread, β=0.5)",
      "MOMBO (elite_spread, β=3)", "MOMBO (mixture)"]


def test_paper_dataset_names():
  assert paper_dataset("hopper-medium-replay") == "hopper-medium-replay"
  assert paper_dataset("d4rl/hopper/medium-replay-v2") == "hopper-medium-replay"
  assert paper_dataset("mombo/walker2d/random-expert-5pct-v0") == \
      "walker2d-random-expert-5pct"
  assert paper_dataset("mujoco/hopper/expert-v0") is None


def _run(dataset, algo, seeds, level, beta=1.0, steps=12):
  """A Run as read_run returns it: scores [T, S] rising by 0.5 per evaluation to `level` + seed."""
  scores = (level + 0.5 * (np.arange(steps) - (steps - 1))[:, None]
            + np.asarray(seeds, float)[None, :])
  env = dataset.split("/")[1] if "/" in dataset else dataset.split("-")[0]
  return results.Run(path=f"runs/{dataset}/{algo}/{beta}/{seeds[0]}", env=env, dataset=dataset,
                    algo=algo, seeds=list(seeds), final=scores[-1], aulc=scores.mean(axis=0),
                    steps=np.arange(1, steps + 1) * 1000, scores=scores,
                    last=scores[-results.LAST_K:].mean(axis=0), beta=beta)


def test_targets_and_betas_are_never_pooled():
  runs = [_run("hopper-random", "MOMBO (lcb)", [0, 1], 20.0, beta=4.5),
          _run("hopper-random", "MOMBO (elite_spread)", [0, 1], 30.0, beta=4.5),
          _run("hopper-random", "MOMBO (elite_spread)", [2, 3], 32.0, beta=4.5),
          _run("hopper-random", "MOBILE", [0, 1], 40.0, beta=5.0),
          _run("hopper-random", "MOBILE", [0, 1], 50.0, beta=1.5),
          # Another dataset: MOBILE's betas differ in the table, so its label names its beta too
          # (one column is one setup in every row; these Runs carry no paper setup to compare
          # with, so the value itself is named).
          _run("hopper-medium", "MOBILE", [0, 1], 60.0, beta=1.5)]
  groups, warnings = results.group_runs(runs)
  assert sorted(groups) == sorted(
      [("hopper", "hopper-random", a) for a in ("MOMBO (lcb)", "MOMBO (elite_spread)",
                                                "MOBILE (β=5)", "MOBILE (β=1.5)")]
      + [("hopper", "hopper-medium", "MOBILE (β=1.5)")])
  es = groups[("hopper", "hopper-random", "MOMBO (elite_spread)")]
  assert es.seeds == [0, 1, 2, 3] and es.beta == 4.5       # same target and beta: pooled
  assert groups[("hopper", "hopper-random", "MOBILE (β=1.5)")].stat("final")[0] == \
      pytest.approx(50.5)
  assert warnings == []
  # Different betas of one MOMBO target: both named.
  groups, _ = results.group_runs([_run("hopper-random", "MOMBO (elite_spread)", [0], 1.0, beta=3),
                                 _run("hopper-random", "MOMBO (elite_spread)", [0], 2.0, beta=1)])
  assert {k[2] for k in groups} == {"MOMBO (elite_spread, β=3)", "MOMBO (elite_spread, β=1)"}


def test_last_k_is_the_mean_of_the_last_evaluations():
  r = _run("hopper-random", "MOPO", [0, 1], 10.0, steps=25)
  groups, _ = results.group_runs([r])
  np.testing.assert_allclose(groups[("hopper", "hopper-random", "MOPO")].values("last"),
                             r.scores[-10:].mean(axis=0), rtol=1e-12)
  # A short run: the mean of all its evaluations, and a warning says so.
  groups, warnings = results.group_runs([_run("hopper-random", "MOPO", [0], 10.0, steps=4)])
  assert len(warnings) == 1 and "only 4 evaluations" in warnings[0]
  g = groups[("hopper", "hopper-random", "MOPO")]
  assert g.stat("last")[0] == pytest.approx(g.stat("aulc")[0])


def test_paper_columns_beside_ours():
  runs = [_run("hopper-random", "MOPO", [0, 1, 2, 3], 30.0),
          _run("hopper-random", "MOMBO (lcb)", [0, 1, 2, 3], 20.0),
          _run("hopper-random", "MOMBO (elite_spread)", [0, 1, 2, 3], 28.0),
          _run("hopper-expert", "MOMBO (elite_spread)", [0], 90.0)]
  groups, _ = results.group_runs(runs)
  table = tables.build_table(groups, paper=True)
  final, last, aulc = table.blocks
  assert final.columns == ["MOPO", "MOPO (paper)", "MOMBO (lcb)", "MOMBO (elite_spread)",
                           "MOMBO (paper)"]
  assert last.columns == table.algos == ["MOPO", "MOMBO (lcb)", "MOMBO (elite_spread)"]
  assert aulc.columns == final.columns
  i = table.rows.index(("random", "hopper", "hopper-random"))
  e = table.rows.index(("expert", "hopper", "hopper-expert"))
  assert (final.mean[i, 1], final.std[i, 1]) == (31.7, 0.1)
  assert (final.mean[i, 4], final.std[i, 4]) == (25.4, 10.2) and (i, 4) in final.notes
  assert (aulc.mean[i, 4], aulc.std[i, 4]) == (17.3, 1.3)
  assert np.isnan(final.mean[e, 4]) and not np.isnan(final.mean[e, 3])   # no paper expert
  # Our columns only compete: MOPO's 30 beats MOMBO's 28 although the paper's 31.7 is higher.
  assert final.bold[i].tolist() == [True, False, False, False, False]
  assert np.isnan(final.avg_rank[[1, 4]]).all() and not np.isnan(final.avg_rank[0])
  text = markdown.render_markdown(table, groups=groups)
  assert "| expert | hopper | – | – | – | **90.0 ± 0.0** [90.0, 90.0] | – |" in text
  assert "MOMBO (paper)* is the paper's MOMBO" in text
  tex = latex.render_latex(table)
  assert tex.count(r"\begin{tabular}") == 3 and r"$31.7 \sd{\pm 0.1}$" in tex
  # D4RL's own files, imported (d4rl/<env>/<quality>-v2), are the paper's very data.
  groups, _ = results.group_runs([_run("d4rl/hopper/medium-replay-v2", "MOMBO (elite_spread)",
                                      [0, 1], 100.0)])
  final = tables.build_table(groups, paper=True).blocks[0]
  assert final.columns[-1] == "MOMBO (paper)" and final.mean[0, -1] == 104.8
  # Without paper=True (experiments.uncertainty's tables) nothing of the paper appears.
  plain = tables.build_table(groups)
  assert all(b.columns == plain.algos for b in plain.blocks)
  assert "(paper)" not in markdown.render_markdown(plain)


class _Seeds:
  """A group as experiments.uncertainty passes it: stat() only, no interval."""

  def __init__(self, x):
    self.x = np.asarray(x, float)

  def stat(self, what):
    return float(self.x.mean()), float(self.x.std())


def test_tables_of_other_metrics_still_render():
  groups = {("hopper", "hopper-random", "MOBILE"): _Seeds([0.8, 0.9]),
            ("hopper", "hopper-random", "MOMBO (elite_spread)"): _Seeds([0.6, 0.62])}
  table = tables.build_table(groups, metrics=(("accuracy", "Accuracy"),), digits=2, paper=True)
  text = markdown.render_markdown(table, title="Uncertainty quantifiers")
  # The paper's Table 2 beside ours, no interval where none is known.
  assert "| random | hopper | **0.85 ± 0.05** | 0.85 ± 0.03 | 0.61 ± 0.01 | 0.61 ± 0.07 |" in text
  assert "bootstrap" not in text.split("##")[0]


def test_overestimated_seeds_are_listed(tmp_path):
  """summary.json's per-seed 'overestimated' flags (critics' mean Q above the return bound) reach
  the Runs table and a warning; a run that did not record them shows –."""
  flagged, plain = tmp_path / "flagged", tmp_path / "plain"
  _write_run(str(flagged), "hopper-random", "mopo", [0, 1, 2], np.full((3, 3), 10.0),
             diverged=(2,))
  summary = json.loads((flagged / "summary.json").read_text())
  summary["overestimated"] = [False, True, True]   # seed 2 diverged: it counts all the same
  atomic.write_json(str(flagged / "summary.json"), summary)
  _write_run(str(plain), "hopper-medium", "mopo", [0], np.full((3, 1), 10.0))
  logged = []
  writer.write_report([str(tmp_path)], str(tmp_path / "out"), log=logged.append)
  assert results.read_run(str(flagged)).overestimated == [1, 2]
  text = (tmp_path / "out" / "report.md").read_text().split("## Runs")[1]
  assert re.search(r"\| hopper-random \| MOPO \| [\d.]+ \| 3 \(0, 1, 2‡\), 1 diverged \| 3 \| "
                   r"\d+ \| [\d,]+ \| – \| 1, 2 \|", text)
  assert re.search(r"\| hopper-medium \| MOPO \| [\d.]+ \| 1 \(0\) \| 3 \| \d+ \| [\d,]+ \| – \| "
                   r"– \|", text)
  assert any("seed(s) 1, 2 passed the return bound" in w and str(flagged) in w for w in logged)


# ------------------------------------------------------------- setups, protocol, faults (#18, #20)

def _label_columns(text):
  """Our column labels of report.md's first block."""
  columns, _ = _md_block(text, "Normalised score (final evaluation)")
  return [c for c in columns if not c.endswith("(paper)")]


def test_runs_of_different_setups_are_never_pooled(tmp_path):
  """Two runs differing only in beta are two named columns, never one mean; the same for a budget
  field (steps_per_epoch); runs differing only in seeds or evaluation fields are pooled."""
  scores = lambda level: np.full((3, 2), level)   # noqa: E731
  _write_run(str(tmp_path / "a"), "hopper-random", "mombo", [0, 1], scores(10.0), beta=0.5)
  _write_run(str(tmp_path / "b"), "hopper-random", "mombo", [0, 1], scores(30.0), beta=4.5)
  result = writer.write_report([str(tmp_path)], str(tmp_path / "out"), log=lambda *_: None)
  text = (tmp_path / "out" / "report.md").read_text()
  assert _label_columns(text) == ["MOMBO (lcb, β=0.5)", "MOMBO (lcb, β=4.5)"]
  groups = result["groups"]
  assert groups[("hopper", "hopper-random", "MOMBO (lcb, β=0.5)")].stat("final")[0] == 10.0
  assert groups[("hopper", "hopper-random", "MOMBO (lcb, β=4.5)")].stat("final")[0] == 30.0
  assert groups[("hopper", "hopper-random", "MOMBO (lcb, β=4.5)")].differs == ["beta"]
  assert "MOMBO (lcb) |" not in text        # no pooled column of both

  runs = [results.read_run(str(tmp_path / x)) for x in ("a", "b")]
  for sub, level, overrides in [("c", 50.0, dict(beta=0.5, steps_per_epoch=7)),
                                ("d", 12.0, dict(beta=0.5, eval_episodes=3)),   # pooled with a
                                ("e", 14.0, dict(beta=4.5))]:                   # pooled with b
    path = str(tmp_path / "more" / sub)
    _write_run(path, "hopper-random", "mombo", [2, 3], scores(level), **overrides)
    runs.append(results.read_run(path))
  groups, _ = results.group_runs(runs)
  labels = sorted(groups, key=lambda k: label_key(k[2]))
  # Sorted by beta, then by the other fields, numbers as numbers (7 before 20).
  assert [k[2] for k in labels] == ["MOMBO (lcb, β=0.5, steps_per_epoch=7)",
                                    "MOMBO (lcb, β=0.5, steps_per_epoch=1000)",
                                    "MOMBO (lcb, β=4.5, steps_per_epoch=1000)"]
  pooled = groups[labels[1]]
  assert sorted(pooled.seeds) == [0, 1, 2, 3] and pooled.stat("final")[0] == 11.0
  assert pooled.differs == ["beta", "steps_per_epoch"]
  assert groups[labels[0]].seeds == [2, 3] and groups[labels[0]].stat("final")[0] == 50.0
  # 1 and 1.0 are one value (a flag typed as an integer changes nothing).
  groups, _ = results.group_runs([_run("hopper-random", "MOPO", [0], 1.0, beta=1),
                                 _run("hopper-random", "MOPO", [1], 1.0, beta=1.0)])
  assert list(groups) == [("hopper", "hopper-random", "MOPO")]
  # A field the older run does not record is a difference too (unknown is not "equal").
  runs[-1].setup = dict(runs[-1].setup, data={"fingerprint": "abc"})
  groups, _ = results.group_runs(runs)
  assert any("data=abc" in k[2] for k in groups) and any("data=?" in k[2] for k in groups)


def test_the_protocol_is_written_checked_and_linked(tmp_path):
  rows = [dict(epoch=1, step=5, seed=0, normalized_score=1.0)]
  assert outputs.summarise(rows, [0])["protocol"] == outputs.PROTOCOL == "mombo_jax.protocol/2"
  runs = tmp_path / "runs"
  _write_run(str(runs / "new"), "hopper-random", "mopo", [0], np.full((2, 1), 5.0))
  _write_run(str(runs / "old"), "hopper-medium", "mopo", [0], np.full((2, 1), 5.0))
  summary = json.loads((runs / "old" / "summary.json").read_text())
  del summary["protocol"]
  atomic.write_json(str(runs / "old" / "summary.json"), summary)
  logged = []
  writer.write_report([str(runs)], str(tmp_path / "out"), log=logged.append)
  # A summary without the field: its numbers recomputed from its per-seed scores, with a warning
  # naming it and a note.
  assert any("before the protocol was recorded" in w and str(runs / "old") in w
             for w in logged), logged
  text = (tmp_path / "out" / "report.md").read_text()
  # By version and the page's place in the repository, never a path from where it was written:
  # the same line in a report written elsewhere (moved or shared, the reference holds).
  line = next(x for x in text.splitlines() if x.startswith("Protocol: "))
  assert line.startswith("Protocol: mombo_jax.protocol/2, defined in `docs/protocol.md` of the "
                         f"mombo_jax repository (package version {mombo_jax.__version__})")
  assert "](" not in line and "../" not in line
  writer.write_report([str(runs)], str(tmp_path / "elsewhere" / "deeper"), log=lambda *_: None)
  assert line in (tmp_path / "elsewhere" / "deeper" / "report.md").read_text().splitlines()
  assert "1 run(s) were summarised under mombo_jax.protocol/1 or predate the protocol field" \
      in text
  assert "protocol.md" in (tmp_path / "out" / "report.tex").read_text().splitlines()[0]
  doc = open(protocols.protocol_doc()).read()
  assert outputs.PROTOCOL in doc and "ddof = 0" in doc and "v5" in doc
  # Another protocol: refused in one line naming the run and the fix; nothing is written.
  summary["protocol"] = "mombo_jax.protocol/9"
  atomic.write_json(str(runs / "old" / "summary.json"), summary)
  with pytest.raises(UserError) as e:
    writer.write_report([str(runs)], str(tmp_path / "out2"), log=lambda *_: None)
  assert f"{runs / 'old'} (mombo_jax.protocol/9)" in str(e.value)
  assert "leave their folders out" in str(e.value) and "\n" not in str(e.value)
  assert not (tmp_path / "out2").exists()


def test_writes_are_atomic_and_refused_in_one_line(tmp_path, monkeypatch):
  """outputs' writers: a refused write names the path and the OS's cause, removes its temporary
  file and leaves the committed file as it was."""
  import errno
  path = tmp_path / "summary.json"
  atomic.write_json(str(path), {"a": 1})
  real = os.replace

  def refuse(src, dst):
    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))

  monkeypatch.setattr(os, "replace", refuse)
  with pytest.raises(atomic.WriteError) as e:
    atomic.write_json(str(path), {"a": 2})
  assert isinstance(e.value, UserError) and e.value.path == str(path)
  assert str(e.value) == (f"Cannot write {path}: Read-only file system; pass a folder on a "
                          "writable file system.")
  monkeypatch.setattr(os, "replace", real)
  assert json.loads(path.read_text()) == {"a": 1} and os.listdir(tmp_path) == ["summary.json"]

  def full(f):
    f.write("x")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  with pytest.raises(atomic.WriteError, match="No space left on device; free some space"):
    atomic.atomic_write(str(path), full)
  assert json.loads(path.read_text()) == {"a": 1} and os.listdir(tmp_path) == ["summary.json"]
  # Not an OSError (a bug): no WriteError, but the temporary file goes all the same.
  with pytest.raises(TypeError):
    atomic.write_json(str(path), {"a": object()})
  assert os.listdir(tmp_path) == ["summary.json"]
  with pytest.raises(atomic.WriteError, match="Not a directory"):
    outputs.write_rows(str(path / "metrics.csv"), [{"a": 1}])
  # The report: --out under a file is one refusal naming it.
  _write_run(str(tmp_path / "runs" / "r"), "hopper-random", "mopo", [0], np.full((2, 1), 5.0))
  with pytest.raises(atomic.WriteError, match=re.escape(f"Cannot write {path / 'out'}: Not a "
                                                         "directory")):
    writer.write_report([str(tmp_path / "runs")], str(path / "out"), log=lambda *_: None)


@pytest.mark.parametrize("args, match, code", [
    (["RUNS", "out=x"], "error: out=x: not a folder", 2),
    (["RUNS", "--out=FILE/report"], "error: Cannot write FILE/report: Not a directory", 1),
])
def test_cli_refuses_stray_words_and_an_unwritable_out_in_one_line(tmp_path, args, match, code):
  runs = tmp_path / "runs"
  _write_run(str(runs / "r"), "hopper-random", "mopo", [0], np.full((2, 1), 5.0))
  blocker = tmp_path / "file"
  blocker.write_text("")
  args = [a.replace("RUNS", str(runs)).replace("FILE", str(blocker)) for a in args]
  got = subprocess.run([sys.executable, "-m", "experiments.report"] + args, capture_output=True,
                       text=True, timeout=HANG_S)
  lines = got.stderr.strip().splitlines()
  assert got.returncode == code and len(lines) == 1, got.stderr
  assert lines[0].startswith(match.replace("FILE", str(blocker))), lines[0]
  assert not (runs / "report.md").exists()


def test_curves_keep_coinciding_lines_visible_and_mark_a_smoke_run():
  """A tiny sweep gave MOMBO and MOPO the same 3.1 at every point: curves_<env>.png drew one line
  over the other and marked nothing. Each algorithm now has its own marker (the later ones hollow
  and smaller, on top), and a pool below the paper's setup is marked BELOW_MARK in the legend and
  named in a note, as in report.md."""
  import matplotlib.pyplot as plt

  from mombo_jax.report import curves
  scores = np.array([[3.1, 3.1], [3.1, 3.1]])          # [evaluations, seeds], both algorithms
  pools = {("hopper", "hopper-random", algo): results.Pool(
      env="hopper", dataset="hopper-random", algo=algo, runs=["r"], seeds=[0, 1],
      final=scores[-1], aulc=scores.mean(0), steps=np.array([20, 40]), scores=scores,
      shortfalls=["40 gradient steps (paper: 3,000,000)", "batch size 32 (paper: 256)"]
      if algo == "MOPO" else []) for algo in ("MOMBO (elite_spread)", "MOPO")}
  fig = curves.curves_figure(pools, "hopper")
  try:
    lines = fig.axes[0].get_lines()
    assert len({line.get_marker() for line in lines}) == 2
    assert [line.get_markerfacecolor() == "none" for line in lines].count(True) == 1
    assert lines[0].get_markersize() > lines[1].get_markersize()
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert sorted(t.split(":")[0] for t in legend) == [
        "MOMBO (elite_spread)", f"MOPO {tables.BELOW_MARK}"], legend
    note = "\n".join(t.get_text() for t in fig.texts)
    assert "below the paper's setup" in note
    assert "MOPO on hopper-random: 40 gradient steps (paper: 3,000,000) and 1 more" in note
  finally:
    plt.close(fig)
