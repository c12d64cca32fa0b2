"""The run's records (mombo_jax.records: a run's folder, config.json, metrics.csv, summary.json,
finding runs) and the report that reads them import no JAX, flax or Orbax: a fresh interpreter
imports every report and records module, writes two runs through the records' writers, writes
the report over them, and has loaded none of the three. The records load no module of the core
but its JAX-free algorithm registry, and import none anywhere in their files, functions included
(.importlinter's records-without-jax contract): a run's checkpoints live in run/run_state.py."""
import configparser
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


def test_the_records_load_no_core_module_but_the_algorithm_registry():
  modules = sorted("mombo_jax.records." + f[:-3]
                   for f in os.listdir(os.path.join(ROOT, "mombo_jax", "records"))
                   if f.endswith(".py") and f != "__init__.py")
  code = (f"import importlib, sys\n"
          f"for m in {modules!r}:\n"
          f"  importlib.import_module(m)\n"
          f"print(sorted(m for m in sys.modules if m.split('.')[0] in ('optax', 'chex')\n"
          f"             or m.startswith('mombo_jax.core.') or m.startswith('mombo_jax.env.')))\n")
  assert _fresh(code).strip() == "['mombo_jax.core.algorithms']"


def test_an_import_contract_keeps_jax_out_of_the_records_functions_too():
  """What a fresh interpreter cannot see (an import inside a function, run only when called) the
  import linter does: its contract on mombo_jax.records forbids JAX and the core (but the
  registry) at any depth of the records' files."""
  linter = configparser.ConfigParser()
  linter.read(os.path.join(ROOT, ".importlinter"))
  contract = linter["importlinter:contract:records-without-jax"]
  assert contract["type"] == "forbidden"
  assert contract["source_modules"].split() == ["mombo_jax.records"]
  forbidden = set(contract["forbidden_modules"].split())
  assert {"jax", "flax", "orbax", "mombo_jax.core", "mombo_jax.storage.checkpoint"} <= forbidden
  ignored = [line.strip() for line in contract["ignore_imports"].splitlines()
             if line.strip() and not line.strip().startswith("#")]
  assert ignored == ["mombo_jax.records.workdir -> mombo_jax.core.algorithms"]


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
