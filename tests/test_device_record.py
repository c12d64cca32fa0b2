"""The device record (benchmarks/device, issues #36, #43) cannot rot: each plan fits one call,
sized up front from the newest record's rates, `prepare --smoke` makes a kit and `--check` says
what is missing and which plan the newest record lacks, `record --smoke` runs each plan's parts at
tiny sizes on the CPU (part e on an earlier call's --work) and writes at most 7 files, and a budget
too small for the later parts plans without them and names them. The speed plan's smoke, which
needs no kit, is tests/test_device_speed.py: a file of its own, so that the test suite's workers
run the two smokes side by side."""
import json
import os
import re

import pytest

from benchmarks.device import kit as kit_lib, record, sizing
from tests.conftest import HANG_S
from tests.device_record_helpers import files_ok, run_module

ROOT = kit_lib.ROOT




def test_each_plan_fits_one_8_minute_call_sized_before_it_starts():
  for name, parts in sizing.PLANS.items():
    plans = sizing.plan_parts(name, 480)
    assert list(plans) == list(parts) and not any(p.skip for p in plans.values()), plans
    # The 8-minute record on one H100 (the issue): the caps, setup included, end within it.
    assert sizing.SETUP_S + sum(p.cap_s for p in plans.values()) <= 8 * 60 + 1e-6
    # Each plan returns at most 7 files (the device returns 8).
    assert sum(len(record.FILES[p]) for p in parts) + 1 <= record.MAX_FILES - 1
  d = sizing.plan_parts("learning", 480)["d"]
  # Four launches since issue #49 (the lowrank MOMBO beside the three, its epoch estimated
  # pessimistically from its FLOPs) and part m's 75 s (issue #48's mixed cell): 40 epochs at
  # 480 s, short of the 100 of three launches without m.
  assert d.epochs >= 40 and d.epochs % sizing.EVAL_EVERY == 0
  assert sizing.d_fixed_s() + sizing.MIN_EPOCHS * sizing.D_EPOCH_S3 <= d.cap_s   # three: 100
  # The epochs come from the newest record's rates: part d's cap holds them at its measured rate.
  assert sizing.d_fixed_s() + d.epochs * sizing.D_EPOCH_S <= d.cap_s


def test_the_rates_are_the_newest_record_s():
  """sizing's constants are what records/2026-11-27-h100's record.json files say."""
  folder = os.path.join(ROOT, sizing.RECORD)
  abc = json.load(open(os.path.join(folder, "record_abc.json")))
  d = json.load(open(os.path.join(folder, "record_d.json")))
  for algo, by_cells in sizing.EPOCH_S.items():
    for cells, seconds in by_cells.items():
      assert abc["rates"]["epoch_s"][algo][str(cells)] == pytest.approx(seconds, abs=1e-4)
  assert max(s for a in abc["rates"]["compile_s"].values() for s in a.values()) == pytest.approx(
      sizing.COMPILE_S, abs=0.05)
  assert d["rates"]["d_epoch_s_side_by_side"] == pytest.approx(sizing.D_EPOCH_S3, abs=0.005)
  assert abc["parts"]["b"]["wall_s"] == sizing.B_S
  # The projection the docs quote: the D4RL table from the measured 16-cell epochs.
  at16 = {a: sizing.epoch_s(a, 16) for a in sizing.ALGOS}
  assert sizing.table_hours(at16, 16) == pytest.approx(
      3000 * 3 * sum(abc["rates"]["epoch_s"][a]["16"] for a in sizing.ALGOS) / 3600)
  # Not measured: MOPO's 1-cell epoch from MOMBO's 1/16 ratio; 48 cells three times 16.
  assert sizing.epoch_s("mopo", 1) == pytest.approx(0.6986 * 0.2594 / 1.0988)
  assert sizing.epoch_s("mobile", 48) == pytest.approx(3 * 1.8308)
  assert sizing.epoch_s("mombo", 4) == pytest.approx(0.2594 + (1.0988 - 0.2594) * 3 / 15)


def test_a_small_budget_plans_fewer_parts_naming_why_never_the_earlier():
  # The smoke's 20 s hold part a only; the others are named, with the reason, before any runs.
  smoke = sizing.plan_parts("speed", 20, smoke=True)
  assert smoke["a"].skip is None and all("floor" in smoke[p].skip for p in "bcv")
  plans = sizing.plan_parts("speed", 150)
  assert plans["a"].skip is None and plans["b"].skip is None
  assert plans["c"].skip and "floor" in plans["c"].skip
  assert sum(p.cap_s for p in plans.values()) <= 150 - sizing.SETUP_S
  learning = sizing.plan_parts("learning", 250)
  assert learning["d"].skip is None and learning["d"].epochs < sizing.MIN_EPOCHS  # shrunk, kept


def test_prepare_check_names_the_plans_the_2026_11_27_record_lacks():
  from benchmarks.device import prepare
  folder = os.path.join(ROOT, sizing.RECORD)
  lacking = dict(prepare.lacking_plans(folder))
  assert list(lacking) == ["speed", "learning"]
  assert set(lacking["speed"]) == {"c", "v"} and "c_profile.md missing" in lacking["speed"]["c"]
  assert set(lacking["learning"]) == {"d", "e", "m"} and "by hand" in lacking["learning"]["e"]
  assert prepare.newest_record() == folder or os.path.basename(prepare.newest_record()) > \
      os.path.basename(folder)


def test_part_e_runs_on_an_earlier_call_s_d_runs(tmp_path):
  assert "run part d first" in record._cannot_run("e", str(tmp_path))
  kit_lib.write_rates(str(tmp_path), "d", {"d_root": str(tmp_path / "learning"),
                                          "d_dataset": "hopper-random"})
  assert record._cannot_run("e", str(tmp_path)) is None


def test_the_learning_table_is_taken_at_the_epoch_all_three_reached():
  from benchmarks.device import learning
  rows = lambda last, seeds=(0, 1): [dict(epoch=e, seed=s) for e in range(10, last + 1, 10)  # noqa
                                     for s in seeds]
  # MOMBO 210, MOBILE 160 (its seed 1 only to 150), MOPO 230: the 2026-11-27 launches.
  got = {"mombo": rows(210), "mobile": rows(160, (0,)) + rows(150, (1,)), "mopo": rows(230)}
  assert learning.common_epoch(got, [0, 1]) == 150
  assert learning.common_epoch(dict(got, mopo=[]), [0, 1]) == 0


def test_part_d_s_dataset_is_the_paper_s_largest_mombo_lead_that_prepare_can_build():
  from benchmarks.device import learning, prepare
  assert learning.choose() == prepare.DATASET == "hopper-medium-replay"
  # The margins the docstring quotes, from the paper's Table 1 (mombo_jax.report.paper_results).
  assert learning.margin("hopper-medium-replay") == pytest.approx(1.12, abs=0.005)
  assert learning.margin("walker2d-medium") == pytest.approx(2.94, abs=0.005)
  assert learning.margin("halfcheetah-random", "final") == pytest.approx(1.54, abs=0.005)
  assert max(learning.margin(d, "final") for d in learning.CANDIDATES) < 0


def test_record_files_are_few_and_plainly_named():
  names = [n for v in record.FILES.values() for n in v] + [record.RECORD]
  assert len(names) == len(set(names))
  assert all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names)


def test_lean_smoke_is_refused_without_smoke(tmp_path, capsys):
  with pytest.raises(SystemExit):
    record.main([f"--out={tmp_path / 'out'}", "--lean_smoke"])
  assert "--lean_smoke trims the smoke record: pass it with --smoke." in capsys.readouterr().err
  assert not (tmp_path / "out").exists()             # refused before any work


@pytest.fixture(scope="module")
def smoke_kit(tmp_path_factory):
  kit = tmp_path_factory.mktemp("kit")
  done = run_module("benchmarks.device.prepare", "--smoke", "--no_wheels", "--plan=learning",
                    f"--kit={kit}", timeout=HANG_S)
  assert done.returncode == 0, done.stdout + done.stderr
  assert "[prepare] ready" in done.stdout
  assert re.search(r'^run: command=".*benchmarks\.device\.record --out=\$OUT .*timeout_s=540$',
                   done.stdout, re.M), done.stdout
  return str(kit)


def test_prepare_check_names_what_is_missing(tmp_path, smoke_kit):
  empty = run_module("benchmarks.device.prepare", "--check", "--plan=learning", f"--kit={tmp_path}",
                     timeout=HANG_S)
  assert empty.returncode == 1
  assert "missing: the wheel of mujoco" in empty.stdout
  assert "missing: the dataset hopper-medium-replay" in empty.stdout
  ready = run_module("benchmarks.device.prepare", "--check", "--smoke", "--no_wheels",
                     "--plan=learning", f"--kit={smoke_kit}", timeout=HANG_S)
  assert ready.returncode == 0, ready.stdout
  manifest = kit_lib.read_manifest(smoke_kit)
  assert manifest["dataset"] == "hopper-random" and manifest["transitions"] == 2000




@pytest.mark.slow
def test_the_learning_plan_s_smoke_and_part_e_on_its_work(smoke_kit, tmp_path):
  """Part d in one call, part e in a second on the first's --work (the 2026-11-27 record's part e
  was refused there); part a runs in the speed smoke."""
  out, work = tmp_path / "out", tmp_path / "work"
  done = run_module("benchmarks.device.record", f"--out={out}", "--smoke", "--plan=learning",
                    "--parts=d", f"--kit={smoke_kit}", f"--work={work}", timeout=HANG_S)
  assert done.returncode == 0, done.stdout + done.stderr
  rec = files_ok(out)
  assert {p: r["status"] for p, r in rec["parts"].items()} == {"d": "ok"}   # a: the speed smoke's
  assert rec["skipped"] == {p: "not asked for (--parts)" for p in "aem"}
  assert rec["rates"]["d_epochs"] == rec["rates"]["d_epochs_asked"] == 2
  learning = (out / "d_learning.md").read_text()
  assert re.search(r"^\| MOPO \| 2 \(2: 2 evaluations\) \|.*"
                   r"\| 31\.7 \+- 0\.1 \| 28\.6 \+- 1\.4 \|$", learning, re.M), learning
  # (ours beside the paper's Table 1)
  assert "normalised score at epoch 2," in learning
  assert (out / "d_curves.png").stat().st_size > 0
  again = run_module("benchmarks.device.record", f"--out={out}", "--smoke", "--plan=learning",
                     "--parts=em", f"--kit={smoke_kit}", f"--work={work}", timeout=HANG_S)
  assert again.returncode == 0, again.stdout + again.stderr
  rec = files_ok(out)
  assert rec["parts"]["e"]["status"] == "ok", rec
  assert "Accuracy" in (out / "e_uncertainty.md").read_text()
  # Part m: the mixed settings' epochs side by side on d's dynamics, a rate and no score.
  assert rec["parts"]["m"]["status"] == "ok", rec
  mixed = (out / "m_mixed.md").read_text()
  assert "dynamics of part d" in mixed and "side by side: " in mixed, mixed
  assert rec["rates"]["m_epochs"] == 2 and rec["rates"]["m_epoch_s_side_by_side"] > 0
  print(f"learning smoke: {rec['wall_s']} s (part e)")
