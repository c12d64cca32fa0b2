"""benchmarks/quickstart.py (README command 1 from a fresh clone, timed per phase): it runs the
README's command as written, its phases tile the run's time, and its committed record was made
with the quick preset as it is now (a changed preset needs a new record). No run here: seconds."""
import os
import re

import pytest

from benchmarks import quickstart
from mombo_jax.settings import config as config_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMAND = ("python3 -m pip install -r requirements-core.txt -e . && python3 -m experiments.run "
           "--env=hopper-random --preset=quick --seeds=2")

# The lines that bound the phases, as pip and experiments.run print them (stamps made up).
LOG = [(1.0, 0.5, "Obtaining file:///tmp/x/mombo_jax"),
       (50.0, 45.0, "Successfully installed absl-py-2.5.1 mombo_jax-0.1.0"),
       (54.0, 48.0, "MOMBO settings (--reference=authors): adinlab/MOMBO configs/gym/<task>.py"),
       (54.1, 48.1, "Dataset hopper-random is missing: building it locally with the collector "
                    "(100000 steps per recorded dataset)."),
       (80.0, 74.0, "hopper-random: 100000 transitions, 4511 episodes, episode return mean 17.5"),
       (84.0, 78.0, "hopper-random: 100000 transitions, obs dim 11, action dim 3; evaluated in "
                    "Hopper-v5 in its v5 model (hopper.xml)."),
       (84.5, 78.4, "Training 2 dynamics ensemble(s) of 7 members (200x200x200x200, ...)"),
       (120.0, 114.0,
        "Dynamics trained in 36 s; elites per seed: [[0, 1, 2, 3, 4], [0, 1, 2, 3, 4]]."),
       (136.0, 130.0, "Compiled the epoch in 11.0 s."),
       (200.0, 194.0, "epoch 10/20  250 steps/s (all seeds)  score per seed [1.9, 2.0]  "
                      "critic_loss "
                      "[1, 1]  q_mean [2, 2] (bound 355.9)  ETA 0h01m20s"),
       (297.0, 291.0, "epoch 20/20  250 steps/s (all seeds)  score per seed [11.2, 7.6]  "
                      "critic_loss [36.7, 54.5]  q_mean [31.5, 32.2] (bound 355.9)  ETA 0h00m00s"),
       (298.0, 292.0, "final normalised score 9.4 +- 1.8 (dataset's own episodes: mean 1.2), AULC "
                      "5.2 over all 2 seed(s), 0 diverged; wrote runs/hopper-random/x/s0x2"),
       (298.5, 292.2, "(exit)")]


def test_it_runs_the_readmes_command_one_as_written():
  assert quickstart.readme_command(os.path.join(ROOT, "README.md")) == COMMAND


def test_its_phases_tile_the_run_and_split_off_the_training():
  rows = {name: (wall, cpu) for name, wall, cpu, _ in quickstart.phases(LOG, steps_per_epoch=1000)}
  assert rows["install"] == (50.0, 45.0)
  assert rows["dataset (build, write, load)"] == pytest.approx((84.0 - 54.1, 78.0 - 48.1))
  assert rows["dynamics"] == pytest.approx((36.0, 36.0))
  assert rows["set-up + compile"] == pytest.approx((16.0, 16.0))
  tiles = [w for name, (w, _) in rows.items() if not name.startswith(("  ", "total"))]
  assert rows["total (the command)"] == (298.5, 292.2) and sum(tiles) == pytest.approx(298.5)
  # 20 epochs x 1000 steps x 2 seeds at 250 steps/s: 160 s of the 162 s after compiling.
  assert rows["  of it: training"][0] == pytest.approx(160.0)
  assert rows["  of it: evaluations, checkpoints"][0] == pytest.approx(2.0)
  # A line that is missing (e.g. a reworded log) is named, not silently measured as zero.
  broken = [line for line in LOG if not line[2].startswith("Dynamics trained")]
  dyn = next(r for r in quickstart.phases(broken, 1000) if r[0] == "dynamics")
  assert dyn[1] is None and "not in the log" in dyn[3]


def test_the_install_and_the_run_are_timed_apart(tmp_path):
  """README command 1's parts (split at `&&`) run as separate processes, each timed, their lines
  on one clock; a failed part ends the command, as `&&` would."""
  assert [w for w, _ in quickstart.command_parts(COMMAND)] == ["install", "run"]
  log = open(tmp_path / "log", "w")
  lines, code, spans = quickstart.run_parts(
      "echo pip install x; sleep 0.2 && echo one; echo two", str(tmp_path), dict(os.environ), log)
  assert code == 0 and [w for w, _, _ in spans] == ["install", "run"]
  texts = [text for _, _, text in lines]
  assert texts == ["pip install x", "(install done)", "one", "two", "(exit)"], texts
  walls = [wall for wall, _, _ in lines]
  assert walls == sorted(walls) and spans[0][1] >= 0.2
  assert walls[-1] == pytest.approx(spans[0][1] + spans[1][1])
  install = next(r for r in quickstart.phases(lines) if r[0] == "install")
  assert install[1] == pytest.approx(spans[0][1])
  lines, code, spans = quickstart.run_parts("echo pip install; exit 3 && echo never",
                                            str(tmp_path), dict(os.environ), log)
  assert code == 3 and len(spans) == 1 and "never" not in [t for _, _, t in lines]


def test_the_record_was_made_with_the_quick_preset_as_it_is():
  """benchmarks/quickstart.txt's budget line is config.json of the timed run: a change to
  PRESETS["quick"] must come with a new record (python3 benchmarks/quickstart.py)."""
  with open(os.path.join(ROOT, "benchmarks", "quickstart.txt")) as f:
    text = f.read()
  budget = re.search(r"^budget \(config.json\): (.*)$", text, re.M).group(1)
  recorded = dict(item.split("=", 1) for item in budget.split(", "))
  config = config_lib.make_config("hopper-random", "mombo", "quick")
  assert recorded == {k: quickstart.fmt_value(config.settings()[k]) for k in quickstart.BUDGET}
  assert re.search(r"^command \(README.md's command 1\): (.*)$", text, re.M).group(1) == COMMAND
