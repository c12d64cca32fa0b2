"""The docs name only commands that exist: every `python3 -m experiments.X ...` and
`python3 -m benchmarks.X ...` (or `python3 benchmarks/x.py ...`) written in README.md, docs/*.md,
BENCHMARKS.md and benchmarks/**/README.md (fenced blocks, indented blocks, inline code) names a
module that is there, and every flag of it parses with that program's own parser: the absl flags
of experiments/*.py (define_flags, no main run), the argparse parser of a benchmark (caught as
its main builds it, before it parses). A sweep's words after `--` are checked as the sweep checks
them. README's command 2 is what .ci/run runs. No training: one subprocess imports the programs."""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import HANG_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAM = re.compile(r"\bpython3?\s+(?:-m\s+((?:experiments|benchmarks)(?:\.\w+)+)"
                     r"|((?:experiments|benchmarks)/[\w/]+\.py))(?=\s|$)")
# Where a shell line's command ends: the next command or a comment.
_END = re.compile(r"\s(?:&&|\|\||;|\||#)(?:\s|$)|;\s")
# A value written as a placeholder (`--process_id=$RANK`, `--run=<workdir>`): its name is checked,
# not its value.
_PLACEHOLDER = re.compile(r"[$<>]|\.\.\.")

# Commands that must be refused (the check would pass anything otherwise).
MADE_UP = [("experiments.run", ["--env=hopper-random", "--nosuchflag=1"]),
           ("experiments.run", ["--algo=mombox"]),
           ("experiments.nosuchprogram", []),
           ("experiments.sweep", ["--envs=hopper-random", "--out=x", "--", "--nosuchflag=1"]),
           ("benchmarks.bench_sac", ["--nosuchflag=1"]),
           ("benchmarks.nosuchbench", []),
           ("experiments.collect", ["--env=hopper-random", "--overwrite=$X", "--nosuchflag=$Y"])]


# A device record's folder says how its files were taken, with the commands of its own commit
# (benchmarks/device/records/README.md): history, not instructions for the code as it is now.
RECORDS = os.path.join("benchmarks", "device", "records") + os.sep


def doc_files():
  """README.md, docs/*.md, BENCHMARKS.md and benchmarks/**/README.md (a device record's folder
  excepted), relative to ROOT."""
  out = ["README.md", "BENCHMARKS.md"]
  out += sorted("docs/" + f for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
  for top, _, names in sorted(os.walk(os.path.join(ROOT, "benchmarks"))):
    if (os.path.relpath(top, ROOT) + os.sep).startswith(RECORDS):
      continue
    out += [os.path.relpath(os.path.join(top, n), ROOT) for n in names if n == "README.md"]
  return [p for p in out if os.path.exists(os.path.join(ROOT, p))]


def _code_regions(text):
  """[(first line number, code)] of a markdown text: fenced blocks, 4-space indented blocks and
  inline code spans (which may wrap across lines)."""
  regions, prose, fence, indented = [], [], None, None
  for n, line in enumerate(text.splitlines(), 1):
    if fence is not None:
      if line.lstrip().startswith("```"):
        regions.append(fence)
        fence = None
      else:
        fence[1].append(line)
      continue
    if line.lstrip().startswith("```"):
      fence = (n + 1, [])
      prose.append((n, ""))
    elif line.startswith("    ") and line.strip() and (indented or not prose or not prose[-1][1]):
      indented = indented or (n, [])
      indented[1].append(line)
      prose.append((n, ""))
    else:
      if indented:
        regions.append(indented)
        indented = None
      prose.append((n, line))
  if indented:
    regions.append(indented)
  regions = [(n, "\n".join(lines)) for n, lines in regions]
  # Inline spans: over the prose joined, so that a span wrapping a line is one command.
  joined = "\n".join(line for _, line in prose)
  starts = [n for n, _ in prose]
  for m in re.finditer(r"`([^`]+)`", joined):
    regions.append((starts[joined.count("\n", 0, m.start())], m.group(1).replace("\n", " ")))
  return regions


def _shell_lines(code):
  """[(index of its first line, line)] with backslash continuations joined."""
  out, start, parts = [], None, []
  for k, line in enumerate(code.splitlines()):
    start = k if start is None else start
    parts.append(line[:-1] if line.endswith("\\") else line)
    if not line.endswith("\\"):
      out.append((start, " ".join(parts)))
      start, parts = None, []
  if parts:
    out.append((start, " ".join(parts)))
  return out


def commands(path):
  """[(where, program, args)] of the commands in one markdown file: program a module
  (`experiments.run`) or a path (`benchmarks/quickstart.py`); args the words after it up to the
  end of the shell command, with the optional brackets ([--flag=v ...]) and `...` dropped."""
  with open(os.path.join(ROOT, path), encoding="utf-8") as f:
    text = f.read()
  out = []
  for first, code in _code_regions(text):
    for k, line in _shell_lines(code):
      line = line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""
      for m in PROGRAM.finditer(line):
        rest = line[m.end():]
        end = _END.search(rest)
        rest = rest[:end.start()] if end else rest
        try:
          words = shlex.split(rest)
        except ValueError as e:
          words = [f"<unreadable: {e}>"]
        words = [w.strip("[]") for w in words]
        words = [w for w in words if w and w != "..."]
        out.append((f"{path}:{first + k}", m.group(1) or m.group(2), words))
  return out


def all_commands():
  return [c for p in doc_files() for c in commands(p)]


# ---------------------------------------------------------------- checked in one subprocess


def _own_algorithm(word):
  """`--algo=MODULE:NAME` names the user's own module, which the page defines and
  tests/test_algorithms.py runs as printed: its form is checked here, a built-in parsed instead."""
  m = re.fullmatch(r"(--algos?)=([A-Za-z_][\w.]*):([A-Za-z_]\w*)", word)
  return f"{m.group(1)}=mombo" if m else word


def _absl_errors(module, args):
  """Why args do not parse with the absl flags experiments.<module> defines, or None."""
  import importlib

  from absl import flags
  FLAGS = flags.FLAGS
  program = importlib.import_module(module)
  before = set(FLAGS)
  program.define_flags()
  try:
    head, tail = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args \
        else (args, [])
    errors = []
    for word in head:
      if not word.startswith("-"):
        continue
      name = word.lstrip("-").split("=", 1)[0]
      known = name in FLAGS or (name.startswith("no") and name[2:] in FLAGS
                                and FLAGS[name[2:]].boolean)
      if not known:
        errors.append(f"--{name} is no flag of {module}")
    concrete = [_own_algorithm(w) for w in head if not _PLACEHOLDER.search(w)]
    if not errors:
      try:
        FLAGS([module] + concrete)
      except flags.Error as e:
        errors.append(str(e).splitlines()[0])
    if tail:
      if module != "experiments.sweep":
        errors.append(f"words after `--`: {module} passes nothing on")
      else:
        from mombo_jax.errors import UserError
        from mombo_jax.run.sweep import check_passthrough
        try:
          check_passthrough([w for w in tail if not _PLACEHOLDER.search(w)])
        except UserError as e:
          errors.append(f"after `--`: {e}")
    return "; ".join(errors) or None
  finally:
    for name in set(FLAGS) - before:
      delattr(FLAGS, name)
    FLAGS.unparse_flags()


class _Parser(Exception):
  def __init__(self, parser):
    super().__init__("caught")
    self.parser = parser


def _argparse_errors(module, args):
  """Why args do not parse with the argparse parser the benchmark's main builds, or None."""
  import argparse
  import contextlib
  import importlib
  import io

  program = importlib.import_module(module)
  if not hasattr(program, "main"):
    return f"{module} has no main()"

  def catch(self, *a, **k):
    raise _Parser(self)

  real = argparse.ArgumentParser.parse_args
  argparse.ArgumentParser.parse_args = catch
  try:
    program.main()
    return f"{module}'s main() built no argparse parser"
  except _Parser as got:
    parser = got.parser
  finally:
    argparse.ArgumentParser.parse_args = real
  unknown = [w.split("=", 1)[0] for w in args
             if w.startswith("-") and w.split("=", 1)[0] not in parser._option_string_actions]
  if unknown:
    return f"{', '.join(unknown)}: no flag of {module}"
  err = io.StringIO()
  try:
    with contextlib.redirect_stderr(err):
      parser.parse_args([_stand_in(parser, w) for w in args
                         if not _PLACEHOLDER.search(w) or w.startswith("--")])
  except SystemExit:
    return err.getvalue().strip().splitlines()[-1]
  return None


def _stand_in(parser, word):
  """`--flag=$X` with a value its flag takes (so a required flag still counts as given)."""
  if not (word.startswith("--") and _PLACEHOLDER.search(word) and "=" in word):
    return word
  name = word.split("=", 1)[0]
  action = parser._option_string_actions[name]
  value = (next(iter(action.choices)) if action.choices
           else "0" if action.type in (int, float) else "x")
  return f"{name}={value}"


def check(program, args):
  """Why the command `python3 -m <program> <args>` names something that is not there, or None."""
  if program.endswith(".py"):
    module = program[:-3].replace("/", ".")
  else:
    module = program
  path = os.path.join(ROOT, *module.split(".")) + ".py"
  package_main = os.path.join(ROOT, *module.split("."), "__main__.py")
  if not os.path.isfile(path) and os.path.isfile(package_main):
    # A package run with -m (benchmarks.fidelity): its __main__ module is the program.
    module, path = module + ".__main__", package_main
  if not os.path.isfile(path):
    return f"no module {module} ({os.path.relpath(path, ROOT)} does not exist)"
  if module.startswith("experiments."):
    return _absl_errors(module, args)
  return _argparse_errors(module, args)


def _own_flags(module):
  """The flags experiments.<module> defines itself (absl's own left out)."""
  import importlib

  from absl import flags
  before = set(flags.FLAGS)
  importlib.import_module(module).define_flags()
  own = sorted(set(flags.FLAGS) - before)
  for name in own:
    delattr(flags.FLAGS, name)
  return own


def _drive():
  """Reads {"commands": [[program, args], ...], "flags_of": [module, ...]} from stdin; prints
  {"errors": [error or None, ...], "flags": {module: [flag, ...]}} as JSON."""
  asked = json.load(sys.stdin)
  out = {"errors": [check(program, args) for program, args in asked["commands"]],
         "flags": {m: _own_flags(m) for m in asked["flags_of"]}}
  print("\n" + json.dumps(out))


@pytest.fixture(scope="module")
def outcomes():
  """(errors of the documented commands, errors of MADE_UP, experiments.run's flags)."""
  cases = [(p, a) for _, p, a in all_commands()] + MADE_UP
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
             JAX_PLATFORMS="cpu")
  asked = {"commands": cases, "flags_of": ["experiments.run"]}
  proc = subprocess.run([sys.executable, "-c", "from tests.test_docs import _drive; _drive()"],
                        input=json.dumps(asked), cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=HANG_S)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  n = len(cases) - len(MADE_UP)
  return got["errors"][:n], got["errors"][n:], got["flags"]["experiments.run"]


def test_the_docs_have_commands_to_check():
  found = {(where.split(":")[0], program) for where, program, _ in all_commands()}
  assert {("README.md", "experiments.run"), ("README.md", "experiments.sweep"),
          ("README.md", "experiments.import_d4rl"), ("README.md", "experiments.report"),
          ("docs/training.md", "experiments.run"), ("docs/datasets.md", "experiments.collect"),
          ("docs/analyses.md", "experiments.uncertainty"),
          ("docs/policies.md", "experiments.render"),
          ("docs/scaling.md", "experiments.train_dynamics"), ("docs/loggers.md", "experiments.run"),
          ("docs/outputs.md", "experiments.report")} <= found


def test_every_command_in_the_docs_names_a_program_and_flags_it_has(outcomes):
  results, _, _ = outcomes
  bad = [f"{where}: python3 -m {program} {' '.join(args)}\n    {error}"
         for (where, program, args), error in zip(all_commands(), results) if error]
  assert not bad, ("These documented commands name a module or flag that does not exist (or a "
                   "value the flag refuses); fix the page or the program:\n" + "\n".join(bad))


def test_made_up_flags_and_programs_are_caught(outcomes):
  _, made_up, _ = outcomes
  got = dict(zip([p + " " + " ".join(a) for p, a in MADE_UP], made_up))
  assert "--nosuchflag is no flag of experiments.run" in got[
      "experiments.run --env=hopper-random --nosuchflag=1"]
  assert "mombox" in got["experiments.run --algo=mombox"]
  assert got["experiments.nosuchprogram "].startswith("no module experiments.nosuchprogram")
  assert "--nosuchflag=1" in got[
      "experiments.sweep --envs=hopper-random --out=x -- --nosuchflag=1"]
  assert "--nosuchflag: no flag of benchmarks.bench_sac" in got[
      "benchmarks.bench_sac --nosuchflag=1"]
  assert got["benchmarks.nosuchbench "].startswith("no module benchmarks.nosuchbench")
  # A placeholder value skips the value's check, not the name's.
  assert got["experiments.collect --env=hopper-random --overwrite=$X --nosuchflag=$Y"] == (
      "--nosuchflag is no flag of experiments.collect")


def test_the_extractor_reads_wrapped_bracketed_and_chained_commands(tmp_path, monkeypatch):
  page = ("Run `python3 -m experiments.run --env=a\n--seeds=2` here.\n\n"
          "```bash\npython3 -m experiments.sweep --envs=a \\\n    [--epochs=3 ...] -- --log=x"
          "  # comment --nope\npip install x && python3 -m experiments.report out # --nope\n```\n"
          "\n    python -m experiments.export --run=<dir> --seed=2\n")
  (tmp_path / "page.md").write_text(page)
  monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
  got = [(w.split(":")[1], p, a) for w, p, a in commands("page.md")]
  assert got == [("5", "experiments.sweep", ["--envs=a", "--epochs=3", "--", "--log=x"]),
                 ("7", "experiments.report", ["out"]),
                 ("10", "experiments.export", ["--run=<dir>", "--seed=2"]),
                 ("1", "experiments.run", ["--env=a", "--seeds=2"])]


def _readme_block(number):
  """The command lines under README's `# <number>.` comment in its first bash block."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    lines = f.read().splitlines()
  start = lines.index("```bash")
  block = lines[start + 1:lines.index("```", start + 1)]
  head = next(i for i, line in enumerate(block) if line.startswith(f"# {number}."))
  out = []
  for line in block[head + 1:]:
    if line.startswith("#"):
      break
    out.append(line.strip())
  return out


def test_readme_command_two_is_what_ci_runs():
  """.ci/run runs the same test command the README gives, and its linters."""
  with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
    ci = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
  parts = [p.strip() for line in _readme_block(2) for p in line.split("&&")]
  tests = [p for p in parts if "pytest" in p]
  ci_tests = [line for line in ci if "pytest" in line and "pip" not in line]
  assert len(tests) == 1 and ci_tests == tests, (
      f"README's test command {tests} is not .ci/run's {ci_tests}: keep them one")
  # The linters: .ci/run may add options (lint-imports --no-cache), not drop one.
  missing = [p for p in parts if not any(line == p or line.startswith(p + " ") for line in ci)]
  assert not missing, f"README's command 2 runs {missing}, which .ci/run does not: keep them one"


def test_the_training_page_names_every_flag_of_experiments_run(outcomes):
  _, _, run_flags = outcomes
  with open(os.path.join(ROOT, "docs", "training.md"), encoding="utf-8") as f:
    named = set(re.findall(r"--(\w+)", f.read()))
  assert "seeds" in run_flags and "env" in run_flags
  missing = sorted(set(run_flags) - named)
  assert not missing, (f"docs/training.md does not name experiments.run's --{', --'.join(missing)}"
                       ": add each to its flags table")


# [text](target) links; a target with a scheme (http:, mailto:) is outside and not checked.
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading):
  """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces -> '-'."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path):
  with open(path, encoding="utf-8") as f:
    text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
  return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def test_every_link_between_the_pages_resolves():
  pages = ["README.md"] + [p for p in doc_files() if p.startswith("docs/")]
  bad = []
  for page in pages:
    with open(os.path.join(ROOT, page), encoding="utf-8") as f:
      text = f.read()
    for m in _LINK.finditer(text):
      target = m.group(1)
      if re.match(r"[a-z]+:", target):
        continue
      file, _, anchor = target.partition("#")
      path = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), file)) if file \
          else os.path.join(ROOT, page)
      line = text.count("\n", 0, m.start()) + 1
      if not os.path.exists(path):
        bad.append(f"{page}:{line}: {target}: no such file")
      elif anchor and path.endswith(".md") and anchor not in _anchors(path):
        bad.append(f"{page}:{line}: {target}: no heading with that anchor")
  assert not bad, "Broken links:\n" + "\n".join(bad)


def test_the_slug_is_githubs():
  assert _slug("Grids in one program: `--datasets`, `--betas`") == (
      "grids-in-one-program---datasets---betas")
  assert _slug("The report: `experiments.report`") == "the-report-experimentsreport"


def test_readme_names_every_extra_and_requirements_pin_them():
  """README: `pip install -e .` is the core, with setup.cfg's extras for the rest, and
  requirements.txt pins all of it (what CI installs)."""
  import configparser
  cfg = configparser.ConfigParser()
  cfg.read(os.path.join(ROOT, "setup.cfg"))
  extras = {k: [r.strip() for r in v.splitlines() if r.strip()]
            for k, v in cfg["options.extras_require"].items()}
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    readme = f.read()
  def pins(name):         # {package: pin} of a requirements file, its `-r` files included
    out = {}
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
      for line in (line.split("#")[0].strip() for line in f):
        if line.startswith("-r "):
          out.update(pins(line[3:].strip()))
        elif line:
          out[re.split(r"[\[=<>]", line)[0].strip().lower()] = line
    return out
  pinned, core = pins("requirements.txt"), pins("requirements-core.txt")
  assert extras and not [k for k in extras if f"`[{k}]`" not in readme]
  unpinned = [r for reqs in extras.values() for r in reqs
              if re.split(r"[\[=<>]", r)[0].strip().lower() not in pinned]
  assert not unpinned, f"requirements.txt does not pin {unpinned}, which README says it holds"
  # README command 1 installs requirements-core.txt: every install_requires of setup.cfg, pinned.
  needed = [re.split(r"[\[=<>]", r)[0].strip().lower()
            for r in cfg["options"]["install_requires"].splitlines() if r.strip()]
  assert needed and not [r for r in needed if r not in core], (needed, sorted(core))
  assert all(pinned[k] == v for k, v in core.items())
