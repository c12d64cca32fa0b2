"""experiments.report / mombo_jax.report: the table rule (bold, underline, ranks) on fixed tables,
including the paper's own Table 1, and the writer end to end on run folders written in the real
on-disk format by mombo_jax.outputs' writers."""
import dataclasses
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from mombo_jax import config as config_lib, outputs, report

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
  b, u = report.mark_row(means, stds)
  assert np.flatnonzero(b).tolist() == bold
  assert np.flatnonzero(u).tolist() == under


def test_ranks_with_ties_and_missing_cells():
  np.testing.assert_array_equal(report.ranks([5.0, 5.0, 4.0]), [1.5, 1.5, 3.0])
  np.testing.assert_array_equal(report.ranks([1.0, 2.0, 2.0, 2.0]), [4.0, 2.0, 2.0, 2.0])
  r = report.ranks([NAN, 3.0, 2.0])
  assert np.isnan(r[0]) and r[1:].tolist() == [1.0, 2.0]
  # Average over the rows where the algorithm has a value.
  table = [[1.0, 2.0, 3.0], [3.0, 2.0, NAN], [2.0, 2.0, 1.0]]
  np.testing.assert_allclose(report.average_ranks(table), [(3 + 1 + 1.5) / 3,
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
    b, u = report.mark_row(means[i], stds[i])
    assert np.flatnonzero(b).tolist() == [bold[i]], i
    assert np.flatnonzero(u).tolist() == under[i], i
  np.testing.assert_allclose(report.average_ranks(means), avg_rank, rtol=1e-12)


# ---------------------------------------------------------------------- synthetic run folders

def _write_run(path, env, algo, seeds, scores, target="lcb", diverged=()):
  """A run workdir exactly as experiments.run leaves it: config.json (the config's fields plus
  the dataset), metrics.csv (one row per seed per evaluation) and summary.json, through the
  writers in mombo_jax.outputs. scores [T, S]."""
  os.makedirs(path, exist_ok=True)
  config = config_lib.make_config(env, algo, preset="tiny", target=target, seed=seeds[0],
                                  num_seeds=len(seeds), epochs=len(scores), eval_every=1)
  outputs.write_json(os.path.join(path, "config.json"),
                     dict(dataclasses.asdict(config), dataset=env))
  rows = [dict(epoch=t + 1, step=(t + 1) * config.steps_per_epoch, seed=int(s),
               return_mean=float(10 * scores[t][i]), normalized_score=float(scores[t][i]),
               diverged=float(int(s) in diverged), critic_loss=1.0)
          for t in range(len(scores)) for i, s in enumerate(seeds)]
  outputs.write_rows(os.path.join(path, "metrics.csv"), rows)
  bad = [{"seed": int(s), "epoch": 1, "quantity": "params"} for s in diverged]
  outputs.write_json(os.path.join(path, "summary.json"), outputs.summarise(rows, seeds, bad))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """Two hopper tasks x three algorithms (+ a MOMBO elite_spread column on one task), one group
  split over two launches, one diverged seed, one unfinished run folder and one walker2d run.
  Returns (root, {(dataset, label): healthy per-seed scores [T, S]})."""
  root = tmp_path_factory.mktemp("runs")
  rng = np.random.default_rng(0)
  truth = {}

  def add(sub, env, algo, seeds, label, target="lcb", diverged=(), level=50.0):
    scores = level + rng.normal(0, 5, (4, len(seeds))) + np.arange(4)[:, None] * 3
    _write_run(str(root / sub), env, algo, seeds, scores, target, diverged)
    keep = [i for i, s in enumerate(seeds) if s not in diverged]
    old = truth.get((env, label))
    truth[(env, label)] = scores[:, keep] if old is None else np.hstack([old, scores[:, keep]])

  add("hopper-random/mombo/s0x2", "hopper-random", "mombo", [0, 1], "MOMBO", level=60)
  add("hopper-random/mombo/s2x2", "hopper-random", "mombo", [2, 3], "MOMBO", level=60)
  add("hopper-random/mobile/s0x3", "hopper-random", "mobile", [0, 1, 2], "MOBILE", diverged=(1,),
      level=55)
  add("hopper-random/mopo/s0x2", "hopper-random", "mopo", [0, 1], "MOPO", level=30)
  add("hopper-medium/mombo/s0x2", "hopper-medium", "mombo", [0, 1], "MOMBO", level=70)
  add("hopper-medium/mombo-es/s0x2", "hopper-medium", "mombo", [0, 1], "MOMBO (elite_spread)",
      target="elite_spread", level=72)
  add("hopper-medium/mobile/s0x2", "hopper-medium", "mobile", [0, 1], "MOBILE", level=71)
  add("hopper-medium/mopo/s0x2", "hopper-medium", "mopo", [0, 1], "MOPO", level=40)
  add("walker2d-random/mombo/s0x2", "walker2d-random", "mombo", [0, 1], "MOMBO", level=20)
  # An unfinished run: config.json and metrics.csv, no summary.json yet.
  unfinished = root / "hopper-random" / "mopo" / "s9x1"
  _write_run(str(unfinished), "hopper-random", "mopo", [9], np.zeros((2, 1)))
  os.remove(unfinished / "summary.json")
  return root, truth, str(unfinished)


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
  """'**61.2 ± 3.4**' / '<u>61.2 ± 3.4</u>' / '61.2 ± 3.4' -> (61.2, 3.4, bold, underlined)."""
  m = re.search(r"(-?[\d.]+) ± (-?[\d.]+)", cell)
  return float(m.group(1)), float(m.group(2)), cell.startswith("**"), cell.startswith("<u>")


@pytest.mark.slow
def test_report_numbers_match_a_direct_computation(runs, tmp_path):
  root, truth, unfinished = runs
  logged = []
  result = report.write_report([str(root)], str(tmp_path), log=logged.append)
  # The unfinished run is skipped with a warning that names it and what it lacks.
  assert any(unfinished in w and "summary.json" in w for w in logged), logged
  assert len(result["runs"]) == 9
  text = (tmp_path / "report.md").read_text()
  blocks = {"Normalised score (final)": lambda s: s[-1], "AULC": lambda s: s.mean(axis=0)}
  for name, metric in blocks.items():
    algos, cells = _md_block(text, name)
    assert algos == ["MOPO", "MOBILE", "MOMBO", "MOMBO (elite_spread)"]
    means = {}
    for (dataset, label), scores in truth.items():
      per_seed = metric(scores)
      env, _, dtype = dataset.partition("-")
      mean, std, _, _ = _number(cells[(dtype, env)][algos.index(label)])
      # The table prints one decimal: the tolerance is half a unit of it (plus float slack).
      assert abs(mean - per_seed.mean()) <= 0.05 + 1e-9, (name, dataset, label)
      assert abs(std - per_seed.std()) <= 0.05 + 1e-9, (name, dataset, label)
      means[(dataset, label)] = per_seed.mean()
    # Bold / underline / ranks as the rule gives them on the true numbers.
    for dataset in ("hopper-random", "hopper-medium"):
      m = np.array([means.get((dataset, a), NAN) for a in algos])
      s = np.array([metric(truth[(dataset, a)]).std() if (dataset, a) in truth else NAN
                    for a in algos])
      bold, under = report.mark_row(m, s)
      row = cells[(dataset.partition("-")[2], "hopper")]
      for j, cell in enumerate(row):
        if np.isnan(m[j]):
          assert cell == report.MISSING
        else:
          assert _number(cell)[2:] == (bool(bold[j]), bool(under[j])), (dataset, algos[j])
    # Average score over all three tasks. Only MOMBO ran on every task (walker2d-random has MOMBO
    # alone, hopper-medium has MOMBO (elite_spread) besides): the other averages are marked * and
    # may not take the bold from a column that covers every task.
    avg = cells[("**Average score**", "")]
    for j, a in enumerate(algos):
      vals = [means[(d, a)] for d in ("hopper-random", "hopper-medium", "walker2d-random")
              if (d, a) in means]
      assert float(avg[j].strip("*\\")) == pytest.approx(np.mean(vals), abs=0.05 + 1e-9)
    assert ["\\*" in c for c in avg] == [True, True, False, True]
    assert [c.startswith("**") for c in avg] == [False, False, True, False]
    # The hopper-random type average (MOPO, MOBILE, MOMBO there; MOMBO (elite_spread) not) and
    # the average rank, recomputed: ranks per task among the algorithms present.
    tasks = ("hopper-random", "hopper-medium", "walker2d-random")
    table = np.array([[means.get((d, a), NAN) for a in algos] for d in tasks])
    want = report.average_ranks(table)
    got = [float(c.strip("*\\")) for c in cells[("**Average rank**", "")]]
    np.testing.assert_allclose(got, want, atol=0.05 + 1e-9)
    np.testing.assert_allclose(want, [np.mean([report.ranks(r)[j] for r in table
                                               if not np.isnan(r[j])]) for j in range(4)])
  # The pooled MOMBO hopper-random group holds seeds 0-3 of two launches; MOBILE lost seed 1.
  groups = result["groups"]
  assert sorted(groups[("hopper", "hopper-random", "MOMBO")].seeds) == [0, 1, 2, 3]
  assert groups[("hopper", "hopper-random", "MOBILE")].seeds == [0, 2]
  for env in ("hopper", "walker2d"):
    assert (tmp_path / f"curves_{env}.png").stat().st_size > 10_000
  tex = (tmp_path / "report.tex").read_text()
  assert tex.count(r"\bf ") >= 4 and r"\begin{tabular}" in tex and "Average Ranking" in tex


@pytest.mark.slow
def test_cli_writes_into_the_first_folder_and_warns(runs, tmp_path):
  root, _, unfinished = runs
  out = subprocess.run([sys.executable, "-m", "experiments.report", str(root)],
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert f"warning: skipping {unfinished}" in out.stderr
  assert (root / "report.md").exists() and (root / "curves_hopper.png").exists()
  empty = tmp_path / "empty"
  empty.mkdir()
  out = subprocess.run([sys.executable, "-m", "experiments.report", str(empty), str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
  assert out.returncode != 0 and "Traceback" not in out.stderr
  assert f"No runs found under {empty}, {tmp_path}" in out.stderr


def test_missing_folder_and_no_runs_are_clear_errors(tmp_path):
  with pytest.raises(report.ReportError, match="nowhere.*is not a folder"):
    report.write_report([str(tmp_path / "nowhere")])
  (tmp_path / "half").mkdir()
  (tmp_path / "half" / "config.json").write_text("{}")
  logged = []
  with pytest.raises(report.ReportError, match=f"No runs found under {tmp_path}.*skipped"):
    report.write_report([str(tmp_path)], log=logged.append)
  assert logged == [f"warning: skipping {tmp_path / 'half'}: missing metrics.csv, summary.json "
                    "(unfinished run?)"]
