"""What the device record's two smoke files share: running one of its programs as the device would
(`python -m`, the checkout first on the path) and checking the files a run left for the device
tool to return."""
import json
import os
import re
import subprocess
import sys

from benchmarks.device import kit as kit_lib, record

ROOT = kit_lib.ROOT


def run_module(*args, **kw):
  """`python -m <args>` from the checkout, its output captured."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
  return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=ROOT,
                        env=env, **kw)


def files_ok(out):
  """The record folder `out` holds no more files than come back (one left for the log) with names
  the tool returns; its record.json, read."""
  files = sorted(os.listdir(out))
  assert len(files) <= record.MAX_FILES - 1
  assert all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in files)
  return json.loads((out / record.RECORD).read_text())
