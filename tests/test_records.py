"""The run's records (mombo_jax.records: a run's folder, config.json, metrics.csv, summary.json,
finding runs) and the report that reads them import no JAX, flax or Orbax: a fresh interpreter
imports every report and records module, writes two runs through the records' writers, writes
the report over them, and has loaded none of the three."""
import os
import subprocess
import sys

from tests.conftest import HANG_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("jax", "flax", "orbax")


def _fresh(code: str) -> str:
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S,
                       cwd=ROOT, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def test_the_records_and_the_report_import_no_jax():
  modules = sorted("mombo_jax." + d + "." + f[:-3] for d in ("records", "report")
                   for f in os.listdir(os.path.join(ROOT, "mombo_jax", d))
                   if f.endswith(".py") and f != "__init__.py")
  assert "mombo_jax.records.workdir" in modules and "mombo_jax.report.results" in modules
  code = (f"import importlib, sys\n"
          f"for m in {modules!r}:\n"
          f"  importlib.import_module(m)\n"
          f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
  assert _fresh(code).strip() == "[]"


def test_a_report_is_written_without_importing_jax(tmp_path):
  """Reading runs (config.json, metrics.csv, summary.json) and writing report.md loads no JAX."""
  code = (
      "import sys\n"
      "import numpy as np\n"
      "from tests.test_report import _write_run\n"
      "from mombo_jax.report import writer\n"
      f"root = {str(tmp_path)!r}\n"
      "scores = np.linspace(10.0, 20.0, 12)[:, None] + np.zeros((1, 2))\n"
      "_write_run(root + '/a/mombo', 'hopper-random', 'mombo', [0, 1], scores)\n"
      "_write_run(root + '/a/mopo', 'hopper-random', 'mopo', [0, 1], scores)\n"
      "writer.write_report([root + '/a'], root + '/out', log=lambda *a: None)\n"
      f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
  assert _fresh(code).strip().splitlines()[-1] == "[]"
  assert (tmp_path / "out" / "report.md").read_text().count("MOMBO (lcb)") >= 1
