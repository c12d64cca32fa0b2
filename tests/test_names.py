"""Names that say what they hold (#27 item 6), read from the package's source: no two modules
define a public class of the same name (train.Cell / sweep.Cell and errors.Interrupted /
dynamics_training.Interrupted once did), and no function is called plain `train` (there were
three beside the train module: the runner's, the dynamics training's and the online SAC's; the
public one-call run is `mombo_jax.fit`, the launch `launch.train_runs`)."""
import ast
import collections
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "mombo_jax"


def _trees():
  paths = sorted(PACKAGE.rglob("*.py"))
  assert len(paths) > 10, f"no package sources under {PACKAGE}"
  for path in paths:
    yield path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text(), str(path))


def test_no_two_modules_define_a_public_class_of_the_same_name():
  where = collections.defaultdict(list)
  for module, tree in _trees():
    for node in tree.body:
      if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
        where[node.name].append(module)
  assert {name: mods for name, mods in where.items() if len(mods) > 1} == {}


def test_no_function_is_called_train():
  found = [f"{module}:{node.lineno}" for module, tree in _trees() for node in ast.walk(tree)
           if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "train"]
  assert found == []


def _identifiers(tree):
  for node in ast.walk(tree):
    for field in ("id", "attr", "arg", "name"):
      value = getattr(node, field, None)
      if isinstance(value, str):
        yield node.lineno if hasattr(node, "lineno") else 0, value


def test_one_spelling_of_penalise():
  """penalise (as normalise, optimiser): no identifier of the package spells it with a z, but the
  old keyword penalize_reward that core/algorithms.py still takes (with a DeprecationWarning)."""
  found = [f"{module}:{line} {name}" for module, tree in _trees()
           for line, name in _identifiers(tree) if "penaliz" in name.lower()
           and not (module == "core/algorithms.py" and name.lstrip("_") == "penalize_reward")]
  assert found == []
