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
