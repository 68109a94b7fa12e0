"""The documentation site builds with no warning, and its API reference covers every public name."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO


def _public_names() -> list[str]:
  """`executor.__all__`, read from the source (importing the package is not needed to know what it promises)."""
  tree = ast.parse((REPO / "executor" / "__init__.py").read_text())
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
      return list(ast.literal_eval(node.value))
  raise AssertionError("executor/__init__.py has no __all__")


def test_the_api_reference_documents_every_public_name_and_no_other():
  referenced = re.findall(r"^::: executor\.(\w+)\s*$", (REPO / "docs" / "api.md").read_text(), re.M)
  public = _public_names()
  assert len(referenced) == len(set(referenced)), "a name is documented twice"
  assert sorted(set(public) - set(referenced)) == [], "public names without an entry in docs/api.md"
  assert sorted(set(referenced) - set(public)) == [], "docs/api.md documents names executor does not export"


def test_every_page_is_in_the_nav_and_the_package_docstring_points_to_the_architecture():
  nav = (REPO / "mkdocs.yml").read_text()
  pages = sorted(p.name for p in (REPO / "docs").glob("*.md"))
  assert [p for p in pages if f" {p}" not in nav] == []
  assert "docs/architecture.md" in ast.get_docstring(
    ast.parse((REPO / "executor" / "__init__.py").read_text())
  )


@pytest.mark.slow
def test_mkdocs_build_strict_has_no_warning(tmp_path):
  if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
    pytest.skip("mkdocs is not installed (pip install -e '.[docs]'; CI installs it)")
  env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
  result = subprocess.run(
    [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
  assert "WARNING" not in result.stderr, result.stderr[-5000:]
  api = (tmp_path / "site" / "api" / "index.html").read_text()
  for name in _public_names():  # Each entry rendered, with its docstring's first line.
    assert f'id="executor.{name}"' in api, name
