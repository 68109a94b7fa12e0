"""The package's layers import only downward: executor.cli > executor > programs > programs.core.

Every module of the package is parsed (not imported, so nothing is hidden by an import cycle that happens to work)
and each of its imports of a first-party module is checked against the layer order. `executor.tasks` are users of
the framework: they may import anything, and no framework module may import them.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Lower number = lower layer. A module may import its own layer and any layer below it.
LAYERS = {"programs.core": 0, "programs": 1, "executor": 2, "executor.cli": 3, "executor.tasks": 4}
FIRST_PARTY = ("programs", "executor")


def layer_of(module: str) -> str:
  """The layer a dotted module name belongs to (the longest matching layer prefix)."""
  best = ""
  for layer in LAYERS:
    if (module == layer or module.startswith(layer + ".")) and len(layer) > len(best):
      best = layer
  return best


def package_modules():
  for top in FIRST_PARTY:
    for path in sorted((ROOT / top).rglob("*.py")):
      rel = path.relative_to(ROOT).with_suffix("")
      parts = list(rel.parts)
      if parts[-1] == "__init__":
        parts = parts[:-1]
      yield ".".join(parts), path


def imports_of(path: pathlib.Path):
  tree = ast.parse(path.read_text(), filename=str(path))
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for alias in node.names:
        yield node.lineno, alias.name
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      yield node.lineno, node.module
      for alias in node.names:  # `from executor import cli` imports executor.cli
        yield node.lineno, f"{node.module}.{alias.name}"


MODULES = list(package_modules())


def test_every_layer_has_modules():
  layers = {layer_of(name) for name, _ in MODULES}
  assert layers == set(LAYERS), layers


@pytest.mark.parametrize("module,path", MODULES, ids=[m for m, _ in MODULES])
def test_imports_point_down(module, path):
  own = LAYERS[layer_of(module)]
  upward = []
  for lineno, imported in imports_of(path):
    if imported.split(".")[0] not in FIRST_PARTY:
      continue
    target = layer_of(imported)
    # `from executor import cli` yields "executor.cli"; `from programs.core import Task` yields
    # "programs.core.Task" (layer programs.core).
    if LAYERS[target] > own:
      upward.append(
        f"{path.relative_to(ROOT)}:{lineno} imports {imported} (layer {target} is above {layer_of(module)})"
      )
  assert not upward, "\n".join(upward)


def test_the_check_catches_an_upward_import(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text(
    "from executor.executor import Executor\nimport programs.train\nfrom programs.core.task import Task\n"
  )
  found = [layer_of(m) for _, m in imports_of(bad)]
  assert [LAYERS[f] > LAYERS["programs.core"] for f in found] == [True, True, True, False, False]


def test_every_module_imports():
  import importlib

  for name, _ in MODULES:
    importlib.import_module(name)


MAX_MODULE_LINES = 400


def test_no_module_is_over_400_lines():
  long = [
    f"{path.relative_to(ROOT)}: {n} lines"
    for _, path in MODULES
    if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
  ]
  assert not long, "split these modules (one job each):\n" + "\n".join(long)


def module_graph(modules):
  """{module: the first-party modules it imports}, every import counted (function-level and TYPE_CHECKING too).

  `from package import submodule` is an import of the submodule only (importing a submodule of a package that is
  being imported is no circle).
  """
  names = {name for name, _ in modules}
  graph = {}
  for name, path in modules:
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
      if isinstance(node, ast.Import):
        targets.update(a.name for a in node.names if a.name in names)
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        subs = [f"{node.module}.{a.name}" for a in node.names]
        targets.update(s for s in subs if s in names)
        if node.module in names and any(s not in names for s in subs):
          targets.add(node.module)
    graph[name] = targets - {name}
  return graph


def import_circles(graph):
  """The import circles of `graph`: each a list of modules, the first repeated at the end."""
  circles, done = [], set()

  def visit(module, path):
    if module in path:
      circle = path[path.index(module) :] + [module]
      if sorted(circle[:-1]) not in [sorted(c[:-1]) for c in circles]:
        circles.append(circle)
      return
    if module in done:
      return
    for target in sorted(graph.get(module, ())):
      visit(target, path + [module])
    done.add(module)

  for module in sorted(graph):
    visit(module, [])
  return circles


def test_no_import_circles():
  circles = import_circles(module_graph(MODULES))
  assert not circles, "import circles (make the arrows point one way):\n" + "\n".join(
    " -> ".join(c) for c in circles
  )


def test_the_circle_check_catches_a_function_level_circle(tmp_path):
  (tmp_path / "a.py").write_text("import b\n")
  (tmp_path / "b.py").write_text("def f():\n  from a import x\n")
  graph = module_graph([("a", tmp_path / "a.py"), ("b", tmp_path / "b.py")])
  assert import_circles(graph) == [["a", "b", "a"]]
