"""The analyses of a trained run check its data as training does: a run whose dataset was rebuilt
under it (other contents, same name) is refused by experiments.uncertainty and
experiments.mm_vs_mc in one `error:` line naming the fingerprint change (trained.check_data, the
same comparison as workdir.Workdir.check_data: provenance.identity_changes)."""
import os
import shutil
import subprocess
import sys

import pytest

from mombo_jax.analysis import trained
from mombo_jax.data import provenance, transitions as transitions_lib
from mombo_jax.records.workdir import Workdir
from tests.conftest import HANG_S, minari_root_at
from tests.conftest_runs import DATASET, tiny_run  # noqa: F401  (session fixture)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def rebuilt(tiny_run, tmp_path_factory):
  """(a copy of the tiny run, a Minari root whose hopper-random was rebuilt with other contents,
  the run's recorded identity)."""
  from mombo_jax.collection import recipes
  workdir, _ = tiny_run
  recorded = Workdir(workdir).read_record()["data"]             # as experiments.run records it
  assert recorded == provenance.dataset_identity(DATASET, transitions_lib.load_transitions(DATASET))
  copy = str(tmp_path_factory.mktemp("run") / "s0x2")
  shutil.copytree(workdir, copy)
  root = tmp_path_factory.mktemp("rebuilt_minari")
  with minari_root_at(root):
    recipes.build_random(DATASET, steps=500, seed=1, log_fn=lambda *a: None)
  return copy, str(root), recorded


def _one_error_line(out):
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
  lines = [line for line in out.stderr.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
  return lines[0]


@pytest.mark.parametrize("module", ["experiments.uncertainty", "experiments.mm_vs_mc"])
def test_the_analyses_refuse_a_rebuilt_dataset(rebuilt, module, tmp_path):
  run, root, recorded = rebuilt
  flag = "--runs" if module == "experiments.uncertainty" else "--run"
  env = dict(os.environ, MINARI_DATASETS_PATH=root, PYTHONPATH=REPO)
  out = subprocess.run([sys.executable, "-m", module, f"{flag}={run}", f"--out={tmp_path}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S)
  line = _one_error_line(out)
  assert line.startswith(f"error: {run} was trained on other data than {DATASET} holds now ("), line
  assert f"fingerprint: {recorded['fingerprint']!r} -> " in line, line
  assert "num_transitions: 2000 -> 500" in line and "rebuilt or replaced" in line, line
  assert os.listdir(tmp_path) == []


def test_the_same_data_passes_and_a_run_without_a_record_is_not_checked(tiny_run):
  workdir, _ = tiny_run
  run = trained.load_run(workdir)
  transitions = trained.load_data(run)          # the data it trained on: no refusal
  other = transitions._replace(rewards=transitions.rewards + 1.0)
  with pytest.raises(ValueError, match=r"trained on other data .*\(fingerprint: '") as e:
    trained.check_data(run, other)
  assert "\n" not in str(e.value)
  run.data = None                              # a run written before runs recorded their data
  trained.check_data(run, other)
