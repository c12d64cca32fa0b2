"""The report's across-task aggregates (mombo_jax.report.aggregates, rliable): point estimates
against a direct numpy computation, intervals that hold them and repeat, the probability of
improvement, the report's section and figure, and the one line asked for when rliable is missing.
Few bootstrap resamples throughout (the `reps` arguments), so that the file stays fast."""
import re
import sys

import numpy as np
import pytest

from mombo_jax.report import aggregates, writer
from tests.test_report import _write_run

REPS = 300


@pytest.fixture(scope="module")
def matrices():
  """{column: [R, T]}: 4 runs x 5 tasks, scores around 60 and 70, some above 100 (the optimality
  gap clips them), with ties (integers)."""
  rng = np.random.default_rng(1)
  a = np.round(rng.normal(60, 30, (4, 5)))
  b = np.round(rng.normal(70, 30, (4, 5)))
  a[0, 0], b[1, 2] = 130.0, 115.0
  return {"A": a, "B": b}


def _iqm(x):
  """The mean of the middle half of all R * T scores (R * T a multiple of 4)."""
  s = np.sort(x.ravel())
  n = s.size
  assert n % 4 == 0
  return s[n // 4: 3 * n // 4].mean()


def test_point_estimates_match_numpy(matrices):
  est = aggregates.interval_estimates(matrices, reps=REPS)
  assert aggregates.AGGREGATES == ("IQM", "Median", "Mean", "Optimality gap")
  for k, x in matrices.items():
    want = [_iqm(x), np.median(x.mean(axis=0)), x.mean(),
            100.0 - np.minimum(x, 100.0).mean()]
    assert est[k].shape == (3, 4)
    np.testing.assert_allclose(est[k][0], want, rtol=1e-12, atol=1e-9)
  # The gap clips scores above the expert's 100: A's 130 counts as 100.
  assert est["A"][0, 3] > 100.0 - matrices["A"].mean()


def test_intervals_hold_the_point_repeat_and_leave_the_global_rng_alone(matrices):
  np.random.seed(123)
  before = np.random.get_state()
  est = aggregates.interval_estimates(matrices, reps=REPS)
  after = np.random.get_state()
  assert after[0] == before[0] and np.array_equal(after[1], before[1]) and after[2:] == before[2:]
  for k, v in est.items():
    assert np.all(v[1] <= v[0] + 1e-9) and np.all(v[0] <= v[2] + 1e-9), k
    assert np.all(v[2] - v[1] > 0), k   # several runs that differ: a real interval
  again = aggregates.interval_estimates(matrices, reps=REPS)
  for k in est:
    np.testing.assert_array_equal(est[k], again[k])
  # A column's interval does not depend on the other columns of the report.
  alone = aggregates.interval_estimates({"B": matrices["B"]}, reps=REPS)
  np.testing.assert_array_equal(alone["B"], est["B"])
  # Another seed gives another (but close) interval: the seed reaches rliable's draws.
  other = aggregates.interval_estimates(matrices, reps=REPS, seed=1)
  assert not np.array_equal(other["A"][1:], est["A"][1:])
  # One run per task: every resample is the data, the interval is the point.
  one = aggregates.interval_estimates({"A": matrices["A"][:1]}, reps=REPS)["A"]
  np.testing.assert_array_equal(one[1], one[0])
  np.testing.assert_array_equal(one[2], one[0])


def test_probability_of_improvement(matrices):
  from rliable import metrics
  a, b = matrices["A"], matrices["B"]
  poi = aggregates.probability_of_improvement({"A": a, "A again": a.copy(), "B": b}, reps=REPS)
  assert poi[("A", "A again")][0] == pytest.approx(0.5)
  assert poi[("A again", "A")][0] == pytest.approx(0.5)
  p, lo, hi = poi[("B", "A")]
  assert p == pytest.approx(float(metrics.probability_of_improvement(b, a)), abs=1e-12)
  assert lo <= p <= hi and 0.0 <= lo and hi <= 1.0
  assert poi[("A", "B")] == pytest.approx([1 - p, 1 - hi, 1 - lo])
  # Direct: P(B > A) per task over all pairs of runs, ties half, averaged over tasks.
  direct = np.mean([np.mean((bt[:, None] > at[None, :]) + 0.5 * (bt[:, None] == at[None, :]))
                    for at, bt in zip(a.T, b.T)])
  assert p == pytest.approx(direct, abs=1e-12)
  # The bootstrap's statistic is rliable's, on matrices with ties and unequal run counts.
  rng = np.random.default_rng(3)
  for _ in range(5):
    x, y = rng.integers(0, 4, (3, 4)).astype(float), rng.integers(0, 4, (5, 4)).astype(float)
    assert aggregates._poi_fast(x, y) == pytest.approx(
        float(metrics.probability_of_improvement(x, y)), abs=1e-12)


def test_performance_profiles(matrices, tmp_path):
  taus, prof = aggregates.performance_profiles(matrices, reps=50)
  assert taus[0] <= 0.0 and taus[-1] >= 130.0 and taus.shape == (aggregates.N_TAUS,)
  for k, x in matrices.items():
    want = [(x > t).mean() for t in taus]
    np.testing.assert_allclose(prof[k][0], want)
    assert np.all(prof[k][1] <= prof[k][0] + 1e-12) and np.all(prof[k][0] <= prof[k][2] + 1e-12)
  aggregates.plot_profiles(taus, prof, str(tmp_path / "p.png"), "t")
  assert (tmp_path / "p.png").stat().st_size > 5_000


def test_bad_matrices_are_one_line_errors():
  with pytest.raises(ValueError, match="must be \\[runs, tasks\\]"):
    aggregates.interval_estimates({"A": np.ones(3)}, reps=10)
  with pytest.raises(ValueError, match="A: non-finite"):
    aggregates.interval_estimates({"A": np.array([[1.0, np.nan]])}, reps=10)
  with pytest.raises(ValueError, match="different numbers of tasks"):
    aggregates.probability_of_improvement({"A": np.ones((2, 3)), "B": np.ones((2, 2))}, reps=10)


class _Pool:
  def __init__(self, seeds, final):
    self.seeds, self.final = list(seeds), np.asarray(final, float)

  def values(self, what):
    return getattr(self, what)


def test_score_matrices_keep_complete_columns_and_equal_runs():
  groups = {
      ("hopper", "hopper-random", "MOPO"): _Pool([2, 0, 1], [12.0, 10.0, 11.0]),
      ("hopper", "hopper-medium", "MOPO"): _Pool([0, 1], [20.0, 21.0]),
      ("walker2d", "walker2d-random", "MOPO"): _Pool([5, 4], [31.0, np.nan]),
      ("hopper", "hopper-random", "MOBILE"): _Pool([0], [50.0]),
  }
  m = aggregates.score_matrices(groups)
  # The report's order: dataset type, then environment.
  assert m.tasks == [("hopper", "hopper-random"), ("walker2d", "walker2d-random"),
                     ("hopper", "hopper-medium")]
  assert list(m.scores) == ["MOPO"]
  # One finite seed on walker2d-random: one run per task, the lowest seed id elsewhere.
  np.testing.assert_array_equal(m.scores["MOPO"], [[10.0, 31.0, 20.0]])
  assert "MOBILE: left out (on 1 of the 3 tasks)" in m.notes
  assert "MOPO on walker2d-random: 1 non-finite score(s) left out" in m.notes
  assert any(n.startswith("MOPO: 1 run(s) per task") for n in m.notes)


def _runs(root):
  """Two hopper tasks: MOPO and MOMBO (elite_spread) with 3 seeds on both, MOBILE on one only.
  Returns {(dataset, label): final scores [S]}."""
  rng = np.random.default_rng(0)
  finals = {}
  for dataset in ("hopper-random", "hopper-medium"):
    for algo, label, level in (("mopo", "MOPO", 30.0), ("mombo", "MOMBO (elite_spread)", 60.0),
                               ("mobile", "MOBILE", 50.0)):
      if algo == "mobile" and dataset == "hopper-medium":
        continue
      scores = level + rng.normal(0, 10, (10, 3))   # 10 evaluations: LAST_K's
      _write_run(str(root / dataset / algo), dataset, algo, [0, 1, 2], scores,
                 target="elite_spread")
      finals[(dataset, label)] = scores[-1]
  return finals


def test_report_writes_the_section_and_the_figure(tmp_path, monkeypatch):
  monkeypatch.setattr(aggregates, "REPS", REPS)
  monkeypatch.setattr(aggregates, "PROFILE_REPS", 50)
  finals = _runs(tmp_path / "runs")
  logged = []
  result = writer.write_report([str(tmp_path / "runs")], str(tmp_path / "out"),
                               log=logged.append)
  assert not any("rliable" in line for line in logged), logged
  figure = tmp_path / "out" / aggregates.PROFILE_FILE
  assert str(figure) in result["files"] and figure.stat().st_size > 5_000
  text = (tmp_path / "out" / "report.md").read_text()
  section = text.split("## Across tasks (rliable)")[1]
  assert "rliable 1.2.0" in section and f"{REPS:,} resamples" in section
  rows = {l.split("|")[1].strip(): [c.strip() for c in l.strip("|").split("|")[1:]]
          for l in section.splitlines() if l.startswith("| ")}
  assert rows["Aggregate"] == ["MOPO", "MOMBO (elite_spread)"]
  for j, label in enumerate(rows["Aggregate"]):
    x = np.stack([finals[("hopper-random", label)], finals[("hopper-medium", label)]], axis=1)
    for name, want in (("IQM", np.mean(np.sort(x.ravel())[1:5])), ("Mean", x.mean()),
                       ("Median", np.median(x.mean(axis=0))),
                       ("Optimality gap ↓", 100 - np.minimum(x, 100).mean())):
      point, lo, hi = map(float, re.fullmatch(r"(-?[\d.]+) \[(-?[\d.]+), (-?[\d.]+)\]",
                                              rows[name][j]).groups())
      assert point == pytest.approx(want, abs=0.05 + 1e-9) and lo <= point <= hi, (label, name)
  assert rows["MOPO"][0] == "–" and re.fullmatch(r"[\d.]+ \[[\d.]+, [\d.]+\]", rows["MOPO"][1])
  assert "MOBILE: left out (on 1 of the 2 tasks)" in section
  assert f"![Performance profiles]({aggregates.PROFILE_FILE})" in section
  # The per-task tables are still there, before it.
  assert text.index("## Normalised score (final evaluation)") < text.index("## Across tasks")


def test_without_rliable_the_report_asks_for_it_in_one_line(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "rliable", None)   # `import rliable` raises ImportError
  with pytest.raises(aggregates.MissingRliable) as e:
    aggregates.require_rliable()
  assert "pip install 'mombo_jax[report]'" in str(e.value) and "\n" not in str(e.value)
  _runs(tmp_path / "runs")
  logged = []
  result = writer.write_report([str(tmp_path / "runs")], str(tmp_path / "out"),
                               log=logged.append)
  assert [line for line in logged if "rliable" in line] == [f"warning: {e.value}"]
  assert logged[0].startswith("warning: the across-task aggregates need rliable: pip install "
                              "'mombo_jax[report]'")
  text = (tmp_path / "out" / "report.md").read_text()
  assert "## Normalised score (final evaluation)" in text and "## Runs" in text
  assert f"Not computed: {e.value}." in text.split("## Across tasks (rliable)")[1]
  assert not (tmp_path / "out" / aggregates.PROFILE_FILE).exists()
  assert all("performance_profile" not in f for f in result["files"])


def test_runs_equal_as_printed_share_rank_and_bold_and_are_not_separated(tmp_path, monkeypatch):
  """Two runs whose seeds' scores differ by 1e-5 (both print 2.9 ± 1.9): one rank (1.5 each),
  both bold, no underline; rliable's probability of improvement and the profiles say the runs
  cannot separate them instead of a number; a third column with 2 runs: too few runs."""
  from tests.test_report import _md_block
  monkeypatch.setattr(aggregates, "REPS", 50)
  monkeypatch.setattr(aggregates, "PROFILE_REPS", 20)
  scores = np.array([[0.5, 2.0], [1.0, 4.8]])                 # [evaluations, seeds]
  _write_run(str(tmp_path / "runs" / "mopo"), "hopper-random", "mopo", [0, 1], scores)
  _write_run(str(tmp_path / "runs" / "mombo"), "hopper-random", "mombo", [0, 1], scores + 1e-5,
             target="elite_spread")
  writer.write_report([str(tmp_path / "runs")], str(tmp_path / "out"), log=lambda *_: None)
  text = (tmp_path / "out" / "report.md").read_text()
  header, cells = _md_block(text, "Normalised score (final evaluation)")
  ours = [j for j, h in enumerate(header) if "(paper)" not in h]
  row = next(v for k, v in cells.items() if "hopper" in k)
  assert [row[j] for j in ours] == ["**2.9 ± 1.9** [1.0, 4.8]"] * 2, row
  assert [cells[("**Average rank**", "")][j].strip("*\\") for j in ours] == ["1.5", "1.5"]
  section = text.split("## Across tasks (rliable)")[1]
  assert "*not separable* (equal as printed" in section and "0.75" not in section
  assert ("The runs cannot separate MOMBO (elite_spread) and MOPO (equal as printed with 1 "
          "decimal)") in section
  # Distinct scores, but 2 runs each: too few to separate.
  far = {"A": np.array([[1.0], [2.0]]), "B": np.array([[5.0], [6.0]])}
  assert aggregates.inseparable(far)[("A", "B")].startswith("too few runs: 2 and 2 per task")
  assert aggregates.inseparable({"A": np.zeros((3, 1)), "B": np.ones((3, 1))}) == {}
