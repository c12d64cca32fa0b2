"""The README's install command makes the package importable from any directory."""
import os
import subprocess
import sys

from tests.conftest import HANG_S


def test_package_and_entry_points_import_outside_the_repo(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  code = ("import mombo_jax, experiments.run, experiments.collect; "
          "from mombo_jax import mm_relu; print(mombo_jax.__file__)")
  out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=HANG_S)
  assert out.returncode == 0, (
      "mombo_jax is not importable outside the repository: install it with "
      f"`python3 -m pip install -r requirements-core.txt -e .`\n{out.stderr}")
  assert out.stdout.strip().endswith(os.path.join("mombo_jax", "__init__.py"))
