"""The shell every entry point in experiments/ runs in: `_cli.run(main, define_flags)`.

It defines the program's absl flags, parses the command line itself and runs `main(argv)`;
whatever goes wrong that the user can fix ends in ONE `error:` line on stderr, no traceback:

  exit 0  done (`main` returned None or 0), or --help / --helpshort / --helpfull / --helpxml
  exit 2  the command line cannot be read: an unknown flag (absl's suggestion kept: `did you mean
          --x?`), a value a flag cannot take, whether its type refuses it or the library's check
          (`--algo=mombox`, `--seeds=x`, `--seeds=0`, `--env=nonsense`: `as_user_error`'s
          ValueErrors, `errors.InvalidValue`), a stray word, a list flag given empty (`--betas=`),
          a missing required flag or two that exclude each other (`UsageError`)
  exit 1  the library refused or failed in a way the user can fix, given the files and machine
          it found (`errors.UserError` and its other kinds; its parameters named as this
          program's flags)
  128+N   signal N stopped the run at a safe point (`errors.Interrupted`: 130 SIGINT, 143
          SIGTERM): the line says where, and the command that resumes
  other   what `main` returns: experiments.run's 3 (a seed diverged), a sweep's worst cell, ...

Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import contextlib
import difflib
import faulthandler
import re
import shlex
import signal
import sys
from typing import Callable, Mapping, Optional, Sequence

from absl import flags, logging

from mombo_jax.errors import Interrupted, InvalidValue, UserError

FLAGS = flags.FLAGS

EXIT_REFUSED = 1      # errors.UserError
EXIT_USAGE = 2        # the command line cannot be read

_HELP = {"help": "short", "helpshort": "short", "h": "short", "?": "short", "helpfull": "full",
         "helpxml": "xml"}
_BOOLEAN_WORDS = ("true", "false", "yes", "no", "0", "1")


class UsageError(UserError):
  """The command line is incomplete or contradicts itself (a required flag missing, two flags
  that exclude each other): exit 2."""


def run(main: Callable[[list], Optional[int]], define_flags: Callable[[], None], *,
        words: bool = False, flag_names: Optional[Mapping[str, str]] = None,
        resume_note: str = ""):
  """The program: sys.exit(execute(...)). See execute."""
  sys.exit(execute(main, define_flags, words=words, flag_names=flag_names,
                   resume_note=resume_note))


def execute(main: Callable[[list], Optional[int]], define_flags: Callable[[], None],
            argv: Optional[Sequence[str]] = None, *, words: bool = False,
            flag_names: Optional[Mapping[str, str]] = None, resume_note: str = "") -> int:
  """Defines the flags (define_flags), parses argv (default sys.argv) and runs main(argv left
  over); returns the exit status (module docstring).

  words: main takes the words left on the command line (experiments.report's folders, the flags
    experiments.sweep passes on after `--`); otherwise a word is refused.
  flag_names: {Python parameter or config field: flag} where they differ (e.g. num_seeds:
    seeds): a UserError's params are named as these flags.
  resume_note: what else the stop line says (what the same command keeps, resumes)."""
  argv = list(sys.argv if argv is None else argv)
  before = set(FLAGS)
  define_flags()
  own = sorted(set(FLAGS) - before)
  helping = _help_request(argv)
  if helping:
    _print_help(helping, main, own)
    return 0
  logging.use_absl_handler()
  try:
    faulthandler.enable()       # as absl's app.run: a crash in C code still shows where
  except (AttributeError, ValueError, OSError):   # stderr without a file descriptor
    pass
  try:
    left = FLAGS(argv)
  except flags.Error as e:
    return _refuse(_flag_error(e, own), EXIT_USAGE)
  line = _empty_lists(own) or (None if words else stray_words(left[1:]))
  if line:
    return _refuse(line, EXIT_USAGE)
  try:
    return int(main(left) or 0)
  except Interrupted as e:
    print(f"Stopped at {e.where}; the same command resumes"
          + (f" ({resume_note})" if resume_note else "") + ". Resume with:\n  "
          + resume_command(main, argv), file=sys.stderr, flush=True)
    return 128 + int(e.signum or signal.SIGINT)
  except KeyboardInterrupt:
    print("\ninterrupted (Ctrl-C).", file=sys.stderr, flush=True)
    return 128 + signal.SIGINT
  except UserError as e:
    return _refuse(in_flags(e, flag_names),
                   EXIT_USAGE if isinstance(e, (UsageError, InvalidValue)) else EXIT_REFUSED)


@contextlib.contextmanager
def as_user_error(*kinds, flag_names: Optional[Mapping[str, str]] = None):
  """`with as_user_error(ValueError): ...` around a library call that reads the command line's
  values (config.make_config, names.parse_name): its exceptions of those kinds are a value a flag
  cannot take (`--seeds=0`, `--env=nonsense`): one `error:` line, exit 2 (UsageError). A message
  that starts with a field (`num_seeds must be ...`) names the flag typed instead (`--seeds must
  be ...`; flag_names: {field: flag} where they differ)."""
  try:
    yield
  except UserError:
    raise
  except kinds as e:
    message = str(e)
    found = re.match(r"(\w+)(?= must\b| =)", message)
    flag = (flag_names or {}).get(found.group(1), found.group(1)) if found else None
    if flag is not None and flag in FLAGS:
      message = f"--{flag}" + message[found.end():]
    raise UsageError(message) from None


def in_flags(error: UserError, flag_names: Optional[Mapping[str, str]] = None,
             known: Optional[Sequence[str]] = None) -> str:
  """The error's message with its params (Python parameters / config fields) named as this
  program's flags: `name=True` -> --flag, `name=False` -> --noflag, `name=` -> --flag=,
  `name` in backticks -> --flag. A param that is no flag of this program (known: its flags'
  names, default the defined ones) keeps its Python name."""
  message = str(error)
  for param in getattr(error, "params", ()):
    flag = (flag_names or {}).get(param, param)
    if flag not in (FLAGS if known is None else known):
      continue
    p = re.escape(param)
    message = re.sub(rf"(?<![\w.-]){p}=True\b", f"--{flag}", message)
    message = re.sub(rf"(?<![\w.-]){p}=False\b", f"--no{flag}", message)
    message = re.sub(rf"(?<![\w.-]){p}=", f"--{flag}=", message)
    message = message.replace(f"`{param}`", f"--{flag}")
  return message


class AlgoParser(flags.ArgumentParser):
  """--algo's values: a registered algorithm's name (mombo_jax.core.algorithms: the built-ins and
  whatever was registered before the flags were defined), or MODULE:NAME, whose module is imported
  first so that its register call adds NAME. The value is the name; a bad one is a usage error
  naming the registered ones (absl: exit 2, with `did you mean`)."""

  def parse(self, argument):
    from mombo_jax.core import algorithms
    return algorithms.from_spec(str(argument))

  @property
  def enum_values(self):          # for _flag_error's `did you mean`
    from mombo_jax.core import algorithms
    return list(algorithms.names())

  def flag_type(self):
    return "string"


def define_algo(name: str, default: str, help_text: str):
  """Defines flag `name` (AlgoParser), its help listing the registered algorithms."""
  from mombo_jax.core import algorithms
  flags.DEFINE(AlgoParser(), name, default,
               f"{help_text} One of <{'|'.join(algorithms.names())}> (the registered algorithms), "
               "or MODULE:NAME for one your own module registers (mombo_jax.core.algorithms."
               "register; MODULE imported first, its folder on PYTHONPATH; docs/architecture.md, "
               "\"Add an algorithm\"); runs record the module and every reader imports it again.")


def stray_words(words: Sequence[str]) -> Optional[str]:
  """The `error:` line for words left on a command line, or None. Every option is a --flag, so
  a word is a mistake, and a silent one: absl reads `--flag false` as --flag (True) followed by
  the word "false", which this names."""
  if not words:
    return None
  hint = (" A boolean flag takes its value after '=' (--flag=false): `--flag false` sets it to "
          "True and leaves the word behind."
          if any(w.lower() in _BOOLEAN_WORDS for w in words) else "")
  return (f"unexpected argument(s) {' '.join(words)}: every option is a --flag (see "
          f"--help).{hint}")


def resume_command(main, argv: Sequence[str]) -> str:
  """`python -m experiments.<program> <the same flags>`."""
  module = sys.modules.get(main.__module__)
  spec = getattr(module, "__spec__", None)
  name = spec.name if spec is not None else main.__module__
  return " ".join([shlex.quote(sys.executable), "-m", name] + [shlex.quote(a) for a in argv[1:]])


def _refuse(line: str, code: int) -> int:
  print(f"error: {line}", file=sys.stderr, flush=True)
  return code


def _flag_error(e: flags.Error, own: Optional[Sequence[str]] = None) -> str:
  """absl's parse error in one line; its suggestions as `did you mean --x?`, the program's own
  flags only (own: their names; absl's own, --stderrthreshold and the like, are no answer)."""
  if isinstance(e, flags.UnrecognizedFlagError):
    found = re.search(r"Did you mean: (.*) \?$", str(e))
    names = [s.strip() for s in found.group(1).split(",")] if found else []
    names = [n for n in names if own is None or n in own]
    hint = f" (did you mean {' or '.join('--' + n for n in names)}?)" if names else ""
    return f"unknown flag --{e.flagname}{hint}; see --help."
  text = str(e).splitlines()[0] if str(e) else type(e).__name__
  found = re.match(r"flag --(\w+)=(.*?): value should be one of", text)
  if found and found.group(1) in FLAGS:
    enum = getattr(FLAGS[found.group(1)].parser, "enum_values", None) or []
    close = difflib.get_close_matches(found.group(2), enum, n=1)
    text += f" (did you mean --{found.group(1)}={close[0]}?)" if close else ""
  return text


def _empty_lists(own: Sequence[str]) -> Optional[str]:
  """The line for list flags given with no value (`--betas=`, which would otherwise mean "not
  given"), or None."""
  empty = [n for n in own if FLAGS[n].present and isinstance(FLAGS[n].value, list)
           and not FLAGS[n].value]
  if not empty:
    return None
  return (f"{', '.join(f'--{n}=' for n in empty)} given empty; pass at least one value "
          "(comma-separated), or leave the flag out for its default.")


def _help_request(argv: Sequence[str]) -> Optional[str]:
  for arg in argv[1:]:
    if arg == "--":
      return None
    name = arg.lstrip("-").split("=")[0]
    if arg.startswith("-") and name in _HELP:
      return _HELP[name]
  return None


def _print_help(kind: str, main, own: Sequence[str]):
  if kind == "xml":
    FLAGS.write_help_in_xml_format(sys.stdout)
    return
  if kind == "full":
    print(FLAGS.get_help())
    return
  module = sys.modules.get(main.__module__)
  print((getattr(module, "__doc__", None) or "").strip() + "\n")
  print("Flags (--helpfull: absl's too):")
  for key, defined in FLAGS.flags_by_module_dict().items():
    if any(flag.name in own for flag in defined):
      print("\n".join(line for line in FLAGS.module_help(key).splitlines()
                      if line.strip() and line.strip() != f"{key}:"))
