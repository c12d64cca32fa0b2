"""#26 items 3 and 9, one proposition per test: every seed counts (summary.json, the run's last
line, the report; protocol/1 runs read over every seed), one seed never counts twice, runs below
the paper's setup are marked and never bold beside the paper's numbers, and column labels come
from what differs over the whole table. Run folders are written in the real on-disk format by
tests/test_report.py's `_write_run`; nothing trains."""
import csv
import json
import os

import numpy as np
import pytest

from mombo_jax.errors import UserError
from mombo_jax.records import outputs
from mombo_jax.records.workdir import Workdir
from mombo_jax.report import results, writer
from mombo_jax.run import host_run, overestimation
from mombo_jax.run.run_specs import RunSpec
from mombo_jax.settings import config as config_lib
from mombo_jax.storage import atomic
from tests.test_report import _md_block, _number, _write_run

FINAL = "Normalised score (final evaluation)"
# Three seeds, seed 1 diverged: its frozen policy scores 0 at every evaluation.
SCORES = np.array([[40.0, 0.0, 50.0]] * 3)


def _rows(scores, seeds, diverged=()):
  return [dict(epoch=t + 1, step=t + 1, seed=s, normalized_score=float(scores[t][i]),
               diverged=float(s in diverged)) for t in range(len(scores))
          for i, s in enumerate(seeds)]


def _report(tmp_path, *dirs, log=None):
  out = tmp_path / "out"
  result = writer.write_report([str(d) for d in dirs], str(out),
                               log=(log.append if log is not None else lambda *_: None))
  return result, (out / "report.md").read_text()


def _cell(text, dataset, label, block=FINAL):
  env, _, dtype = dataset.partition("-")
  columns, cells = _md_block(text, block)
  return cells[(dtype, env)][columns.index(label)]


# ---------------------------------------------------------------------------- every seed counts

def test_summary_headline_covers_every_seed():
  bad = [{"seed": 1, "epoch": 2, "quantity": "params"}]
  s = outputs.summarise(_rows(SCORES, [0, 1, 2], {1}), [0, 1, 2], bad)
  assert s["protocol"] == "mombo_jax.protocol/2"
  assert (s["num_seeds"], s["num_diverged"]) == (3, 1)
  assert s["final_normalized_score_mean"] == pytest.approx(30.0)
  assert s["final_normalized_score_std"] == pytest.approx(np.std([40.0, 0.0, 50.0]))
  assert s["aulc_mean"] == pytest.approx(30.0)
  # The finite seeds only, beside.
  assert s["final_normalized_score_mean_healthy"] == pytest.approx(45.0)
  assert s["final_normalized_score_std_healthy"] == pytest.approx(5.0)
  assert s["aulc_mean_healthy"] == pytest.approx(45.0)


def test_summary_never_writes_a_nan_mean():
  scores = SCORES.copy()
  scores[-1, 1] = np.nan
  s = outputs.summarise(_rows(scores, [0, 1, 2]), [0, 1, 2])
  assert s["final_normalized_score_mean"] is None and s["final_normalized_score_std"] is None
  assert np.isnan(s["final_normalized_score"][1])


def test_the_last_line_says_over_how_many_seeds_and_how_many_diverged(tmp_path, capsys):
  config = config_lib.make_config("hopper-random", "mopo", "tiny", num_seeds=3)
  wd = Workdir(str(tmp_path / "run"))
  os.makedirs(wd.path)
  r = host_run.HostRun(RunSpec(config, "hopper-random", wd.path))
  r.rows = _rows(SCORES, [0, 1, 2], {1})
  r.q = overestimation.OverestimationWatch([0, 1, 2], 100.0)
  r.diverged = {1: {"seed": 1, "epoch": 2, "quantity": "critic_loss"}}
  summary = r.finish()
  line = capsys.readouterr().out.strip().splitlines()[-1]
  assert summary["final_normalized_score_mean"] == pytest.approx(30.0)
  assert line.startswith("final normalised score 30.0 +- 21.6, AULC 30.0 over all 3 seed(s), "
                         "1 diverged (counted at their frozen policy; over the 2 healthy seed(s): "
                         "45.0 +- 5.0)"), line
  assert json.loads((tmp_path / "run" / "summary.json").read_text())["num_diverged"] == 1


def test_the_last_line_sets_the_score_beside_the_datasets_own_mean():
  summary = outputs.summarise(_rows(SCORES, [0, 1, 2]), [0, 1, 2])
  line = host_run.finish_line(summary, None, 1.16)
  assert line.startswith("final normalised score 30.0 +- 21.6 (dataset's own episodes: mean 1.2), "
                         "AULC 30.0 over all 3 seed(s), 0 diverged"), line
  assert "dataset" not in host_run.finish_line(summary)
  # It says what +- and AULC are (docs/protocol.md has the rest).
  assert line.endswith("[+-: the std over the seeds; AULC: the mean score over all "
                       "evaluations; docs/protocol.md]"), line


def test_the_learning_curve_shows_seeds_band_points_and_the_datasets_level():
  """Each seed with its evaluation points, the mean with a band of +- the std over the seeds
  (said in the legend), the dataset's own level as a labelled line, axes with units."""
  import matplotlib.pyplot as plt
  scores = np.array([[1.0, 3.0], [2.0, 6.0], [4.0, 8.0], [5.0, 9.0]])
  fig = outputs.curve_figure(_rows(scores, [0, 1]), [0, 1], "t", dataset_score=1.16)
  try:
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["seed 0", "seed 1", "mean of 2 seeds", "± std over the 2 seeds",
                      "dataset's own episodes (mean 1.2)"] or set(labels) == {
        "seed 0", "seed 1", "mean of 2 seeds", "± std over the 2 seeds",
        "dataset's own episodes (mean 1.2)"}, labels
    lines = {line.get_label(): line for line in ax.get_lines()}
    # Each seed its own hollow marker, over the mean: seeds at one score stay visible.
    assert [lines[f"seed {s}"].get_marker() for s in (0, 1)] == ["o", "s"]
    assert all(lines[f"seed {s}"].get_markerfacecolor() == "none" for s in (0, 1))
    assert lines["seed 1"].get_zorder() > lines["mean of 2 seeds"].get_zorder()
    np.testing.assert_allclose(lines["mean of 2 seeds"].get_ydata(), scores.mean(1))
    np.testing.assert_allclose(lines["dataset's own episodes (mean 1.2)"].get_ydata(), 1.16)
    band = next(c for c in ax.collections if c.get_label() == "± std over the 2 seeds")
    top = band.get_paths()[0].vertices[:, 1].max()
    assert top == pytest.approx((scores.mean(1) + scores.std(1)).max())
    assert "normalised" in ax.get_ylabel() and "gradient steps" in ax.get_xlabel()
  finally:
    plt.close(fig)


def test_the_report_counts_a_diverged_seed_and_marks_its_cell(tmp_path):
  _write_run(str(tmp_path / "runs" / "a"), "hopper-random", "mopo", [0, 1, 2], SCORES,
             diverged=(1,))
  result, text = _report(tmp_path, tmp_path / "runs")
  pool = result["groups"][("hopper", "hopper-random", "MOPO")]
  assert pool.seeds == [0, 1, 2] and pool.scores.shape == (3, 3)   # the curve's mean too
  mean, std, *_ = _number(_cell(text, "hopper-random", "MOPO"))
  assert (mean, std) == (30.0, pytest.approx(21.6, abs=0.05))
  assert _cell(text, "hopper-random", "MOPO").endswith(" ‡")
  assert ("‡ MOPO on hopper-random: 1 of 3 seeds diverged (seed 1 at epoch 1), counted at their "
          "frozen policy; over the 2 others 45.0 ± 5.0.") in text
  assert "| 3 (0, 1‡, 2), 1 diverged |" in text.split("## Runs")[1]
  with open(tmp_path / "out" / "report.csv") as f:
    row = next(r for r in csv.DictReader(f) if r["column"] == "MOPO" and r["metric"] == "final")
  assert (row["seeds"], row["diverged"], float(row["mean_healthy"])) == ("3", "1", 45.0)


def test_a_seed_without_a_finite_score_is_refused(tmp_path):
  """A seed whose evaluations are missing (NaN) cannot count, and leaving it out would bias the
  mean: the report refuses the run in one line, before writing anything."""
  scores = SCORES.copy()
  scores[:, 1] = np.nan
  _write_run(str(tmp_path / "runs" / "a"), "hopper-random", "mopo", [0, 1, 2], scores,
             diverged=(1,))
  with pytest.raises(UserError) as e:
    _report(tmp_path, tmp_path / "runs")
  assert str(tmp_path / "runs" / "a") in str(e.value) and "seed(s) 1" in str(e.value)
  assert "\n" not in str(e.value) and not (tmp_path / "out").exists()


def test_protocol_1_runs_are_read_over_every_seed(tmp_path):
  """A protocol/1 summary's means leave diverged seeds out; its per-seed scores hold them: the
  report counts every seed, names the run in a warning and notes it in report.md."""
  path = tmp_path / "runs" / "old"
  _write_run(str(path), "hopper-random", "mopo", [0, 1, 2], SCORES, diverged=(1,))
  summary = json.loads((path / "summary.json").read_text())
  summary.update(protocol="mombo_jax.protocol/1", final_normalized_score_mean=45.0,
                 final_normalized_score_std=5.0)
  for k in [k for k in summary if k.endswith("_healthy") or k.startswith("num_")]:
    del summary[k]
  atomic.write_json(str(path / "summary.json"), summary)
  logged = []
  result, text = _report(tmp_path, tmp_path / "runs", log=logged)
  assert result["groups"][("hopper", "hopper-random", "MOPO")].stat("final")[0] == 30.0
  assert any("mombo_jax.protocol/1" in w and str(path) in w for w in logged), logged
  assert "1 run(s) were summarised under mombo_jax.protocol/1" in text


# ----------------------------------------------------------------------- one seed counts once

def test_one_seed_in_two_folders_is_refused(tmp_path):
  for sub in ("a", "copy_of_a"):
    _write_run(str(tmp_path / "runs" / sub), "hopper-random", "mopo", [0], np.full((3, 1), 5.0))
  with pytest.raises(UserError) as e:
    _report(tmp_path, tmp_path / "runs")
  message = str(e.value)
  assert str(tmp_path / "runs" / "a") in message and str(tmp_path / "runs" / "copy_of_a") in message
  assert "counts once" in message and "`seed`" in message and "\n" not in message
  assert not (tmp_path / "out").exists()
  # The library refuses too: no caller can pool it twice.
  runs = [results.read_run(str(tmp_path / "runs" / s)) for s in ("a", "copy_of_a")]
  with pytest.raises(UserError):
    results.group_runs(runs)


def test_one_folder_reached_twice_is_one_run(tmp_path):
  _write_run(str(tmp_path / "runs" / "a"), "hopper-random", "mopo", [0], np.full((3, 1), 5.0))
  result, _ = _report(tmp_path, tmp_path / "runs", os.path.relpath(tmp_path / "runs"))
  assert result["groups"][("hopper", "hopper-random", "MOPO")].seeds == [0]


# ------------------------------------------------------------------ below the paper's setup

def _record(env="hopper-random", algo="mombo", preset="paper", **fields):
  config = config_lib.make_config(env, algo, preset, target="lcb")
  return json.loads(json.dumps(dict(config.settings(), dataset=env, **fields)))


def test_what_falls_short_of_the_papers_setup():
  from mombo_jax.report import paper_setup
  assert paper_setup.shortfalls(_record(data={"num_transitions": 1_000_000})) == []
  assert paper_setup.shortfalls(dict(_record(), epochs=300)) == [
      "300,000 gradient steps (paper: 3,000,000)"]
  quick = paper_setup.shortfalls(_record(preset="quick"))
  assert quick[0] == "20,000 gradient steps (paper: 3,000,000)"
  assert "model rollouts per epoch 5,000 (paper: 50,000)" in quick
  assert "dynamics epochs cap 2 (paper: none)" in quick
  # A quick preset run to the paper's steps is still below the paper's setup.
  assert paper_setup.shortfalls(dict(_record(preset="quick"), epochs=3000, steps_per_epoch=1000))
  assert any("actor layers 32x32 (paper: 256x256)" == x
             for x in paper_setup.shortfalls(_record(preset="tiny")))
  # The mixed datasets' paper budget is 2,000 epochs.
  assert paper_setup.shortfalls(_record("hopper-random-medium-5pct")) == []
  # Datasets: fewer transitions than the recipe's full build; no recipe size, no mark.
  assert paper_setup.shortfalls(_record(data={"num_transitions": 100_000})) == [
      "dataset of 100,000 transitions (its recipe: 1,000,000)"]
  assert paper_setup.shortfalls(_record("hopper-medium-replay",
                                        data={"num_transitions": 10})) == []
  assert paper_setup.shortfalls(dict(_record(), dataset="d4rl/hopper/random-v2",
                                     data={"num_transitions": 10})) == []


def test_a_run_below_the_papers_setup_is_marked_and_never_bold(tmp_path):
  """A quick-preset run scoring above a paper-preset run of the same task: the paper-preset cell
  is bold, the quick one is marked § with a footnote (gradient steps, dataset size) and takes no
  bold or underline, in the rows or the averages; the paper's column never ranks."""
  runs = tmp_path / "runs"
  _write_run(str(runs / "paper"), "hopper-random", "mombo", [0, 1], np.full((3, 2), 20.0))
  _write_run(str(runs / "quick"), "hopper-random", "mombo", [0, 1], np.full((4, 2), 35.0),
             preset="quick", data={"num_transitions": 100_000, "fingerprint": "x"})
  result, text = _report(tmp_path, runs)
  labels = sorted(k[2] for k in result["groups"])
  paper_label = next(a for a in labels if "epochs=3000" in a)
  quick_label = next(a for a in labels if "epochs=20," in a)
  for block in (FINAL, "AULC"):
    assert _number(_cell(text, "hopper-random", paper_label, block))[2]        # bold
    quick = _cell(text, "hopper-random", quick_label, block)
    assert quick.endswith(" §") and not quick.startswith(("**", "<u>"))
    columns, cells = _md_block(text, block)
    avg = cells[("**Average score**", "")]
    assert avg[columns.index(paper_label)].startswith("**")
    assert not avg[columns.index(quick_label)].startswith("**")
    # The paper's 25.4 is above our 20.0: still not bold, and ours is.
    assert not cells[("random", "hopper")][columns.index("MOMBO (paper)")].startswith("**")
  assert (f"§ {quick_label} on hopper-random: below the paper's setup: 20,000 gradient steps "
          "(paper: 3,000,000)") in text
  assert "dataset of 100,000 transitions (its recipe: 1,000,000)" in text
  assert "| 20,000 § | 100,000 |" in text.split("## Runs")[1]
  assert r"{}^{\S}" in (tmp_path / "out" / "report.tex").read_text()


# ------------------------------------------------------------------------------ column labels

def test_labels_come_from_what_differs_over_the_whole_table(tmp_path):
  """A beta ablation on one task: the other task's run at its own setting shares the column of
  the first task's run at its own setting (their betas differ by design: 'β=default'), and the
  ablation is a column of its own."""
  runs = tmp_path / "runs"
  _write_run(str(runs / "h"), "hopper-random", "mombo", [0], np.full((3, 1), 20.0))
  _write_run(str(runs / "h05"), "hopper-random", "mombo", [0], np.full((3, 1), 10.0), beta=0.5)
  _write_run(str(runs / "w"), "walker2d-random", "mombo", [0], np.full((3, 1), 5.0))
  result, _ = _report(tmp_path, runs)
  assert sorted(result["groups"]) == [
      ("hopper", "hopper-random", "MOMBO (lcb, β=0.5)"),
      ("hopper", "hopper-random", "MOMBO (lcb, β=default)"),
      ("walker2d", "walker2d-random", "MOMBO (lcb, β=default)")]
  assert result["table"].algos == ["MOMBO (lcb, β=default)", "MOMBO (lcb, β=0.5)"]


def test_runs_of_two_budgets_on_two_tasks_are_two_columns(tmp_path):
  """A quick run on one task and a paper run on another never share a column (and its
  average), although no task has both."""
  runs = tmp_path / "runs"
  _write_run(str(runs / "h"), "hopper-random", "mombo", [0], np.full((3, 1), 20.0),
             preset="quick")
  _write_run(str(runs / "w"), "walker2d-random", "mombo", [0], np.full((3, 1), 5.0))
  result, _ = _report(tmp_path, runs)
  (h,), (w,) = ([k[2] for k in result["groups"] if k[1] == d]
                for d in ("hopper-random", "walker2d-random"))
  # (3 evaluations spread over the quick preset's 20 epochs: 3 x 6.)
  assert h != w and ", epochs=18," in h and ", epochs=3000," in w


def test_runs_of_two_settings_sources_are_told_apart_by_the_source_alone(tmp_path):
  """MOBILE from OfflineRL-Kit's and from its authors' tables (--reference): the per-task values
  each source sets (beta, dynamics epochs, ...) are their task's settings, so the labels name the
  source alone, and the other task's OfflineRL-Kit run shares its column."""
  runs = tmp_path / "runs"
  _write_run(str(runs / "kit"), "halfcheetah-medium-expert", "mobile", [0], np.full((3, 1), 9.0))
  _write_run(str(runs / "authors"), "halfcheetah-medium-expert", "mobile", [0],
             np.full((3, 1), 8.0), reference="authors")
  _write_run(str(runs / "w"), "walker2d-random", "mobile", [0], np.full((3, 1), 5.0))
  result, _ = _report(tmp_path, runs)
  assert sorted(k[2] for k in result["groups"]) == [
      "MOBILE (reference=authors)", "MOBILE (reference=offlinerl_kit)",
      "MOBILE (reference=offlinerl_kit)"]
  assert all(not g.shortfalls for g in result["groups"].values())
