"""experiments/_cli.py: every entry point runs in one shell, which turns a command line it cannot
read into ONE `error:` line (exit 2, absl's suggestion kept), a library UserError into one line in
the program's flags (exit 1), a stop into the resume command (128 + the signal), and answers
--help with exit 0. All cases run in one subprocess (each entry point's flags defined, parsed and
removed again), so the entry points' imports are paid once."""
import json
import os
import subprocess
import sys

import pytest

from mombo_jax.errors import Interrupted, UserError
from tests.conftest import HANG_S

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = ["collect", "describe", "export", "import_d4rl", "mm_vs_mc", "render", "report", "run",
            "sweep", "train_dynamics", "uncertainty"]


# Mains of a toy program (this module): what a library raises, the shell turns into its line.
def _define_toy():
  from absl import flags
  flags.DEFINE_integer("seeds", 1, "Seeds.")


def _raise_user_error(argv):
  raise UserError("num_seeds=0 must be >= 1; or pass `num_seeds` a multiple of 2.",
                  params=("num_seeds",))


def _raise_interrupted(argv):
  raise Interrupted(15, "epoch 3")


def _raise_keyboard_interrupt(argv):
  raise KeyboardInterrupt


def _drive():
  """Runs the cases read from stdin ([[program, args], ...]; program: an entry point's name or
  toy:<main>) in this process; prints [{code, stdout, stderr}, ...] as JSON."""
  import contextlib
  import importlib
  import io

  from absl import flags

  from experiments import _cli
  results = []
  for program, args in json.load(sys.stdin):
    if program.startswith("toy:"):
      main, define, names = globals()[program[4:]], _define_toy, {"num_seeds": "seeds"}
    else:
      module = importlib.import_module(f"experiments.{program}")
      main, define, names = module.main, module.define_flags, getattr(module, "FLAG_NAMES", None)
    before = set(flags.FLAGS)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        code = _cli.execute(main, define, [program] + args, flag_names=names)
      except SystemExit as e:       # not the shell's way: the test says so
        code = f"SystemExit({e.code!r})"
    for name in set(flags.FLAGS) - before:
      delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()
    results.append({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
  print(json.dumps(results))


# The programs with a required flag, and a command line that gives the others but one.
REQUIRED = {"collect": (), "describe": (), "export": (), "import_d4rl": ("--env=hopper-random",),
            "mm_vs_mc": (), "render": ("--run=x",), "report": (), "sweep": ("--out=x",),
            "train_dynamics": (), "uncertainty": ()}

CASES = ([(p, ["--nosuchflag"]) for p in PROGRAMS]
         + [(p, ["--help"]) for p in PROGRAMS]
         + [(p, ["stray"]) for p in PROGRAMS if p not in ("report", "sweep")]
         + [("run", ["--sed=1"]), ("run", ["--algo=mombox"]), ("train_dynamics", ["--seeds=x"]),
            ("run", ["--betas="]), ("sweep", ["--envs=hopper-random", "--out=/x", "stray"]),
            ("run", ["--matmul_precision=highest"]),
            ("run", ["--allow_epochs_change", "false"]),
            ("train_dynamics", ["--env=hopper-random", "--seeds=0"]), ("run", ["--epochs=-1"]),
            ("run", ["--seeds=0"]), ("run", ["--algo=tests.test_cli:nope"]),
            ("run", ["--env=nonsense"]), ("run", ["--env=hoper-medium"]),
            ("collect", ["--stp=1"]), ("collect", ["--env=hopper-random", "--steps=-5"])]
         + [(p, []) for p in REQUIRED]
         + [(p, list(a)) for p, a in REQUIRED.items() if a] + [
            ("toy:_raise_user_error", []), ("toy:_raise_interrupted", ["--seeds=4"]),
            ("toy:_raise_keyboard_interrupt", [])])


@pytest.fixture(scope="module")
def outcomes():
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
             JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", "from tests.test_cli import _drive; _drive()"],
                        input=json.dumps(CASES), cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=HANG_S)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return {(p, tuple(a)): r for (p, a), r in zip(CASES, json.loads(proc.stdout))}


def _one_line(result):
  lines = [line for line in result["stderr"].splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), result["stderr"]
  assert "Traceback" not in result["stderr"] and "FATAL" not in result["stderr"]
  return lines[0]


@pytest.mark.parametrize("program", PROGRAMS)
def test_an_unknown_flag_is_one_line_and_exit_2(outcomes, program):
  result = outcomes[(program, ("--nosuchflag",))]
  assert result["code"] == 2
  assert _one_line(result).startswith("error: unknown flag --nosuchflag")


def test_absl_suggestion_is_kept_and_a_bad_enum_is_one_line(outcomes):
  result = outcomes[("run", ("--sed=1",))]
  assert result["code"] == 2
  assert "(did you mean --seed or --seeds" in _one_line(result)
  result = outcomes[("run", ("--algo=mombox",))]
  assert result["code"] == 2
  line = _one_line(result)
  assert "--algo=mombox" in line and "mombo|mobile|mopo" in line
  assert line.endswith("(did you mean --algo=mombo?)")
  result = outcomes[("train_dynamics", ("--seeds=x",))]
  assert result["code"] == 2 and "--seeds=x" in _one_line(result)
  result = outcomes[("run", ("--matmul_precision=highest",))]     # JAX's name, not the setting's
  assert result["code"] == 2 and "float32|tensorfloat32" in _one_line(result)


@pytest.mark.parametrize("program", PROGRAMS)
def test_help_exits_0_with_the_program_and_its_flags(outcomes, program):
  result = outcomes[(program, ("--help",))]
  assert result["code"] == 0 and result["stderr"] == ""
  assert f"python -m experiments.{program}" in result["stdout"]
  assert "Flags" in result["stdout"] and "  --" in result["stdout"]


@pytest.mark.parametrize("program", [p for p in PROGRAMS if p not in ("report", "sweep")])
def test_a_stray_word_is_refused_in_one_line(outcomes, program):
  result = outcomes[(program, ("stray",))]
  assert result["code"] == 2
  assert _one_line(result).startswith("error: unexpected argument(s) stray: every option is a "
                                      "--flag")


def test_sweep_words_empty_lists_and_the_boolean_trap(outcomes):
  result = outcomes[("sweep", ("--envs=hopper-random", "--out=/x", "stray"))]
  assert result["code"] == 2 and "unexpected argument(s) stray" in _one_line(result)
  result = outcomes[("run", ("--betas=",))]
  assert result["code"] == 2 and _one_line(result).startswith("error: --betas= given empty")
  result = outcomes[("run", ("--allow_epochs_change", "false"))]
  assert result["code"] == 2 and "--flag=false" in _one_line(result)


def test_a_library_user_error_is_one_line_in_the_programs_flags(outcomes):
  # The library speaks Python (pretrain.DynamicsJob(seeds=0)); the program names its flag.
  from mombo_jax.dynamics import pretrain
  with pytest.raises(UserError) as e:
    pretrain.train_dynamics(pretrain.DynamicsJob(env="hopper-random", seeds=0))
  assert str(e.value) == "`seeds` must be >= 1, got 0." and "--" not in str(e.value)
  # A value no call could take is the command line's mistake: exit 2 (docs/training.md).
  result = outcomes[("train_dynamics", ("--env=hopper-random", "--seeds=0"))]
  assert result["code"] == 2 and _one_line(result) == "error: --seeds must be >= 1, got 0."
  # config.make_config's ValueError naming the field (experiments.run: _cli.as_user_error).
  result = outcomes[("run", ("--epochs=-1",))]
  assert result["code"] == 2 and "epochs must be a positive integer" in _one_line(result)
  # A config field whose flag has another name: the flag typed (num_seeds: --seeds).
  result = outcomes[("run", ("--seeds=0",))]
  assert result["code"] == 2
  assert _one_line(result) == "error: --seeds must be a positive integer, got 0."
  # --algo=MODULE:NAME: the module imported; a name it does not register is a usage error.
  result = outcomes[("run", ("--algo=tests.test_cli:nope",))]
  assert result["code"] == 2 and "registers no algorithm 'nope'" in _one_line(result)
  # A parameter whose flag has another name (num_seeds: --seeds); a plain UserError: exit 1.
  result = outcomes[("toy:_raise_user_error", ())]
  assert result["code"] == 1
  assert _one_line(result) == ("error: --seeds=0 must be >= 1; or pass --seeds a multiple of 2.")


def test_an_unknown_dataset_name_lists_the_valid_ones_readably(outcomes):
  """The 39 valid names as their two patterns (they read as one 1,100-character line), and the
  closest name to a typo."""
  line = _one_line(outcomes[("run", ("--env=nonsense",))])
  assert outcomes[("run", ("--env=nonsense",))]["code"] == 2 and len(line) < 450, line
  assert "<env> one of halfcheetah|hopper|walker2d" in line and "Did you mean" not in line
  assert "random|medium|medium-replay|medium-expert|expert" in line
  assert "<env>-random-<medium|expert>-<1|5|10|50>pct" in line
  line = _one_line(outcomes[("run", ("--env=hoper-medium",))])
  assert "Did you mean hopper-medium?" in line


def test_a_stop_prints_the_resume_command_and_exits_128_plus_the_signal(outcomes):
  result = outcomes[("toy:_raise_interrupted", ("--seeds=4",))]
  assert result["code"] == 143 and "Traceback" not in result["stderr"]
  lines = result["stderr"].splitlines()
  assert lines[0] == "Stopped at epoch 3; the same command resumes. Resume with:"
  assert lines[1].strip().endswith("-m tests.test_cli --seeds=4")
  result = outcomes[("toy:_raise_keyboard_interrupt", ())]
  assert result["code"] == 130 and "Traceback" not in result["stderr"]


# Raises still naming a flag, in modules other work rewrites now (config's two hints, the
# dynamics training's resume refusal): listed so that no new one appears.
_KNOWN_FLAG_RAISES = {("config.py", "--dataset"), ("config.py", "--schedule_epochs"),
                      ("config.py", "--epochs"),
                      ("dynamics_training.py", "--dynamics_dir")}


def test_no_library_raise_names_a_flag():
  """Library errors speak Python: no `raise` message under mombo_jax/ names a --flag, except in
  a command it prints to run (`python -m experiments...`, experiments.run's flags)."""
  import ast
  import re
  found = set()
  for name in sorted(os.listdir(os.path.join(REPO, "mombo_jax"))):
    if not name.endswith(".py"):
      continue
    with open(os.path.join(REPO, "mombo_jax", name)) as f:
      tree = ast.parse(f.read())
    for node in ast.walk(tree):
      if isinstance(node, ast.Raise) and node.exc is not None:
        text = "".join(c.value for c in ast.walk(node.exc)
                       if isinstance(c, ast.Constant) and isinstance(c.value, str))
        if "python -m" in text or "experiments." in text:
          continue
        found |= {(name, flag) for flag in re.findall(r"(?<![\w-])--[a-z]\w*", text)}
  assert found <= _KNOWN_FLAG_RAISES, sorted(found - _KNOWN_FLAG_RAISES)


@pytest.mark.parametrize("program, args", [(p, ()) for p in REQUIRED]
                         + [(p, a) for p, a in REQUIRED.items() if a])
def test_a_missing_required_flag_is_exit_2_in_every_program(outcomes, program, args):
  result = outcomes[(program, tuple(args))]
  assert result["code"] == 2, result
  assert "required" in _one_line(result) or "pass " in _one_line(result)


def test_every_value_is_checked_before_any_data_and_absl_flags_are_no_suggestion(outcomes):
  # collect skips a dataset that exists: a bad value is refused before it looks.
  result = outcomes[("collect", ("--env=hopper-random", "--steps=-5"))]
  assert result["code"] == 2 and _one_line(result) == "error: --steps must be >= 1, got -5."
  result = outcomes[("collect", ("--stp=1",))]
  assert result["code"] == 2 and "--steps" in _one_line(result)
  assert "stderrthreshold" not in _one_line(result)
  assert "stderrthreshold" not in _one_line(outcomes[("run", ("--sed=1",))])
