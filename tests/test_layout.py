"""The package's shape: `import mombo_jax` is light and gives the public API lazily, no two
modules import each other, at the top or inside functions (a cycle hides which layer a module
belongs to; `lint-imports` keeps the layers themselves, .importlinter), and every import inside a
function says why it is not at the top of its module."""
import ast
import os
import re
import subprocess
import sys

from tests.conftest import HANG_S

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "mombo_jax")
API = ("mm_relu", "mm_linear", "mm_leaky_relu", "mc_moments", "propagate", "load_policy",
       "moment_matching_bound", "relu_moment_matching_bound",
       "load_transitions", "Transitions",
       "normalized_score", "ref_scores", "termination_fn", "model_done", "make_epoch", "fit")


def test_import_is_lazy_and_the_api_loads():
  code = ("import sys, mombo_jax\n"
          "heavy = [m for m in ('orbax', 'minari', 'gymnasium', 'jax') if m in sys.modules]\n"
          "assert not heavy, heavy\n"
          f"for name in {API!r}:\n"
          "  assert callable(getattr(mombo_jax, name)), name\n"
          "assert set(mombo_jax.__all__) == set(" + repr(API) + ")\n"
          "print('ok')\n")
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_S,
                       cwd=ROOT, env=env)
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def _modules():
  """{dotted module name: path} of every module of the package."""
  out = {}
  for top, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(top, f), ROOT)[:-3].split(os.sep)
        out[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = os.path.join(top, f)
  return out


def _imports(path, modules):
  """The package's modules that the file imports anywhere in it (functions included)."""
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name in modules}
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
      subs = {f"{node.module}.{a.name}" for a in node.names}
      found |= (subs & set(modules)) or {node.module}
  return found


def test_no_import_cycle():
  modules = _modules()
  graph = {m: _imports(p, modules) - {m, "mombo_jax"} for m, p in modules.items()}
  index, low, stack, on_stack, cycles = {}, {}, [], set(), []

  def visit(v):                       # Tarjan's strongly connected components
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph[v]:
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        cycles.append(sorted(component))

  for m in sorted(graph):
    if m not in index:
      visit(m)
  assert not cycles, f"modules that import each other: {cycles}"


def _function_imports(tree):
  """The Import / ImportFrom nodes inside a function or method body (at any depth), by line."""
  found = []

  def visit(node, in_function):
    for child in ast.iter_child_nodes(node):
      if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
        found.append(child)
      visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

  visit(tree, False)
  return sorted(found, key=lambda n: n.lineno)


def _unexplained(path):
  """'path:line: import' of each in-function import with no comment on its line or the line above;
  an import right below an explained one (blank lines between allowed) shares its comment."""
  lines = open(path).read().splitlines()
  explained, out = set(), []           # explained: end lines of the explained imports
  for node in _function_imports(ast.parse("\n".join(lines))):
    above = node.lineno - 1
    while above > 0 and not lines[above - 1].strip():
      above -= 1
    if ("#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
        or above in explained):
      explained.add(node.end_lineno)
    else:
      out.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
  return out


def test_every_import_inside_a_function_says_why():
  """An import belongs at the top of its module, except where it would load a heavy package
  (jax, flax, orbax, mujoco, gymnasium, minari, matplotlib, ...) into a module that must load
  without it, where it breaks an import cycle, where it is an optional extra, or where a test
  patches it; such an import says which in a comment (issue 37)."""
  bad = [line for path in sorted(_modules().values()) for line in _unexplained(path)]
  assert not bad, ("imports inside functions with no comment saying why they are not at the top "
                   "of the module (move them there, or add the reason on the line or above): "
                   + "; ".join(bad))


def test_the_dynamics_package_docstring_maps_every_module():
  """mombo_jax/dynamics/ holds an ensemble's life a module a step (issue 44 item 4); its package
  docstring is the map a reader starts from, so it names every module of the room."""
  room = os.path.join(PACKAGE, "dynamics")
  doc = ast.get_docstring(ast.parse(open(os.path.join(room, "__init__.py")).read())) or ""
  modules = sorted(f for f in os.listdir(room) if f.endswith(".py") and f != "__init__.py")
  assert len(modules) >= 5 and "core/dynamics.py" in doc
  assert [m for m in modules if m not in doc] == []


def test_every_package_docstring_names_every_module_of_its_room():
  """docs/architecture.md links to each room's `__init__.py` instead of listing its modules, so
  each package docstring is that map: it names every module of its folder (a module added without
  a line there fails here)."""
  rooms = sorted(d for d in os.listdir(PACKAGE)
                 if os.path.isfile(os.path.join(PACKAGE, d, "__init__.py")))
  missing = []
  for room in rooms:
    folder = os.path.join(PACKAGE, room)
    doc = ast.get_docstring(ast.parse(open(os.path.join(folder, "__init__.py")).read())) or ""
    for f in sorted(os.listdir(folder)):
      if f.endswith(".py") and f != "__init__.py" and not re.search(rf"\b{f[:-3]}\b", doc):
        missing.append(f"{room}/{f}")
  assert len(rooms) >= 10 and not missing, f"modules no package docstring names: {missing}"


def _run_trees():
  run = os.path.join(PACKAGE, "run")
  for name in sorted(os.listdir(run)):
    if name.endswith(".py"):
      yield name, ast.parse(open(os.path.join(run, name)).read())


def test_run_state_has_one_owner_one_writer_and_few_nested_functions():
  """Issue #50: metrics.csv has one writer (HostRun._write_rows: Workdir.write_rows is called in
  run/ from nowhere else), and run/ defines at most 2 functions inside functions (a closure
  hides state; pass an object with named methods)."""
  writers, nested = [], []
  for name, tree in _run_trees():
    for node in ast.walk(tree):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        nested += [f"{name}:{node.name}>{inner.name}" for inner in ast.walk(node)
                   if inner is not node
                   and isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef))]
        writers += [f"{name}:{node.name}" for call in ast.walk(node)
                    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "write_rows"]
  assert writers == ["host_run.py:_write_rows"]
  assert len(nested) <= 2, nested
