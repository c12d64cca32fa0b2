"""The repository stands on its own: no text in it cites a file outside it, every
"docs/spec.md section N" it cites exists, and docs/spec.md's per-task table is references.py's."""
import os
import re
import subprocess

import pytest

from mombo_jax.settings import references
from tests.conftest import HANG_S, SLOWEST_FILES

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join(ROOT, "docs", "spec.md")

# Citations of the developers' inputs beside the checkout (written in pieces, so that this file
# does not match itself).
OUTSIDE = ("SPEC" + ".md", ".." + "/shared", "shared" + "/paper", "shared" + "/SPEC",
           "shared" + "/ARCHITECTURE", "ARCHITECTURE" + ".md")

# Recorded outputs may not cite them either (two once did: their lines were edited).
RECORDED = {}

_SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".hypothesis", ".venv", "build", "dist",
              "runs", "workdir"}


def _repo_files():
  """Paths (relative to ROOT) of the tracked and untracked-but-not-ignored files; a walk of the
  tree (build outputs and caches left out) where git or its metadata is missing."""
  try:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, timeout=HANG_S, check=True).stdout
    files = [p for p in out.decode().split("\0") if p]
    if files:
      return files
  except (OSError, subprocess.SubprocessError):
    pass
  files = []
  for top, dirs, names in os.walk(ROOT):
    dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
    files += [os.path.relpath(os.path.join(top, n), ROOT) for n in names]
  return files


def _text(path):
  """The file's text, or None for a binary or missing file."""
  try:
    with open(os.path.join(ROOT, path), "rb") as f:
      data = f.read()
  except OSError:
    return None
  if b"\0" in data:
    return None
  try:
    return data.decode("utf-8")
  except UnicodeDecodeError:
    return None


def _texts():
  return {p: t for p in _repo_files() if (t := _text(p)) is not None}


@pytest.fixture(scope="module")
def texts():
  return _texts()


def _outside_citations(path, text):
  return [f"{path}:{n}: {line.strip()[:120]}" for n, line in enumerate(text.splitlines(), 1)
          if any(s in line for s in OUTSIDE)]


def test_nothing_cites_a_file_outside_the_repo(texts):
  # the listing found the repo
  assert "README.md" in texts and "mombo_jax/settings/config.py" in texts
  hits = [h for p, t in sorted(texts.items()) if p.replace(os.sep, "/") not in RECORDED
          for h in _outside_citations(p, t)]
  assert not hits, ("These lines cite files outside the repository; cite docs/spec.md's section, "
                    "the public reference file or the paper instead:\n" + "\n".join(hits))


def test_the_recorded_exceptions_are_still_needed(texts):
  stale = [p for p in RECORDED if p in texts and not _outside_citations(p, texts[p])]
  assert not stale, f"No outside citation left in {stale}: remove them from RECORDED."


def _spec_sections():
  with open(SPEC, encoding="utf-8") as f:
    return {int(m.group(1)) for m in re.finditer(r"^## (\d+)\. ", f.read(), re.M)}


def test_every_cited_spec_section_exists(texts):
  sections = _spec_sections()
  assert sections == set(range(1, max(sections) + 1))
  cite = re.compile(r"docs/spec\.md\s+sections?\s+(\d+)((?:\s*(?:,|and)\s*\d+)*)")
  missing, cited = [], set()
  for path, text in sorted(texts.items()):
    for m in cite.finditer(text):
      nums = [int(m.group(1))] + [int(n) for n in re.findall(r"\d+", m.group(2))]
      cited.update(nums)
      line = text.count("\n", 0, m.start()) + 1
      missing += [f"{path}:{line}: section {n}" for n in nums if n not in sections]
  assert not missing, "Cited sections docs/spec.md lacks:\n" + "\n".join(missing)
  assert {3, 5, 6, 7, 9} <= cited      # the code cites it (a sanity check of the pattern)


def test_the_spec_task_table_is_references_tables():
  with open(SPEC, encoding="utf-8") as f:
    rows = [line for line in f.read().splitlines()
            if re.match(r"\| (halfcheetah|hopper|walker2d)-", line)]
  tables = (references.MOMBO_AUTHORS, references.MOBILE_OFFLINERL_KIT, references.MOBILE_AUTHORS,
            references.MOPO_OFFLINERL_KIT)
  d4rl = [t for t in references.MOMBO_AUTHORS if not t.endswith("-expert")
          or t.endswith("-medium-expert")]
  got = {}
  for row in rows:
    task, *cells = [c.strip() for c in row.strip("|").split("|")]
    got[task] = [tuple(float(v) for v in c.split("/")) for c in cells]
  assert sorted(got) == sorted(d4rl)
  for task, cells in got.items():
    want = [(t[task]["rollout_length"], t[task]["beta"]) for t in tables]
    assert cells == want, task


def test_the_readme_hard_codes_no_test_count(texts):
  """A number of tests written into the README drifts (it said 532 while the suite collected 554);
  the README names none (pytest prints the count)."""
  assert not re.findall(r"\b\d+\s+tests\b", texts["README.md"])


def test_the_files_the_suite_schedules_first_exist():
  """conftest.SLOWEST_FILES (handed to pytest-xdist first) names test files that exist: a slow file
  renamed without its entry would drop back to the end of the queue unnoticed."""
  missing = [n for n in SLOWEST_FILES
             if not os.path.exists(os.path.join(ROOT, "tests", n))]
  assert not missing, f"conftest.SLOWEST_FILES names missing files {missing}: rename or drop them"


def test_no_symbolic_link_and_no_run_output_is_in_the_repo():
  # A committed `runs` link once made README command 1 refuse its workdir in a fresh clone (it
  # pointed at another machine's finished run); links resolve only on the machine that made them.
  files = _repo_files()
  assert "README.md" in files
  links = [p for p in files if os.path.islink(os.path.join(ROOT, p))]
  assert not links, f"symbolic links in the repository (remove them, e.g. git rm --cached): {links}"
  outputs = [p for p in files if p.replace(os.sep, "/").split("/")[0] in ("runs", "workdir")]
  assert not outputs, f"run outputs in the repository (keep them out of git): {outputs[:5]}"
