"""Gin files and bindings: resolution and parsing with errors that name the culprit."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import sys
import tokenize
from collections.abc import Sequence
from pathlib import Path

import gin

from executor.cli.suggest import with_suggestion
from executor.command_record import FILE as RECORD_FILE
from executor.command_record import CommandRecord, with_record
from programs.core.errors import ConfigError

# The `gin/` folder of the repository (source checkouts and editable installs)
# and the copy installed with the package.
_PACKAGE = Path(__file__).resolve().parent.parent
_SEARCH_DIRS = (
  _PACKAGE.parent / "gin",
  _PACKAGE / "gin_configs",
)


def resolve_gin_file(name: str, search_paths: Sequence[str] = ()) -> str:
  """Finds a gin file as given, else in the `search_paths` folders, else in the package's `gin/` folder.

  `gin/quickstart.gin`, `quickstart.gin` and `quickstart` all find the shipped
  quickstart.

  Raises:
    ConfigError: naming the file and every place looked in.
  """
  candidates = [Path(name)]
  for folder in search_paths:
    candidates.append(Path(folder) / name)
    if Path(name).suffix != ".gin":
      candidates.append(Path(folder) / f"{name}.gin")
  stem = Path(name)
  if stem.parts and stem.parts[0] == "gin":
    stem = Path(*stem.parts[1:])
  for folder in _SEARCH_DIRS:
    candidates.append(folder / stem)
    if stem.suffix != ".gin":
      candidates.append(folder / f"{stem}.gin")
  for path in candidates:
    if path.is_file():
      return str(path)
  looked = ", ".join(dict.fromkeys(str(p) for p in candidates))
  raise ConfigError(f"gin file '{name}' not found (looked in: {looked})")


def parse_config(
  gin_files: Sequence[str],
  gin_params: Sequence[str],
  search_paths: Sequence[str] = (),
  modules: Sequence[str] = (),
) -> list[str]:
  """Imports the modules, parses the gin files, then the bindings, and returns the files' paths.

  Args:
    gin_files: Gin files, applied in order (see `resolve_gin_file`).
    gin_params: Bindings applied after the files.
    search_paths: Folders searched for the gin files, for their `include`s and, put on `sys.path`, for the
      modules that `modules` and the files' `import` lines name: a task in its own folder, outside the package.
    modules: Python modules imported before the files are parsed (they register the task's configurables).

  Raises:
    ConfigError: naming the folder, module, file or binding at fault and why.
  """
  folders = [_search_folder(f) for f in search_paths]
  paths = [resolve_gin_file(f, folders) for f in gin_files]
  gin.clear_config()
  _add_user_search_paths(folders)
  _add_search_paths()
  for module in modules:
    _import_module(module, folders)
  for path in paths:
    try:
      gin.parse_config_file(path, skip_unknown=False)
    except ImportError as e:
      statement = _IMPORT_LINE.search(str(e))
      moved = _moved(statement.group(1)) if statement else None
      if moved:
        raise ConfigError(f"gin file '{path}': {moved}") from None
      what = statement.group(1) if statement else e.name or "a module"
      raise ConfigError(
        f"gin file '{path}': cannot import {what}: {_first_line(e)}{_where_modules(folders)}"
      ) from None
    except Exception as e:  # gin raises ValueError, KeyError, SyntaxError...
      raise ConfigError(f"gin file '{path}': {_gin_message(e)}") from None
  for param in gin_params:
    try:
      gin.parse_config(param)
    except Exception as e:
      raise ConfigError(f"gin binding '{param}': {_gin_message(e)}") from None
  return paths


def parse_run_config(
  run_dir: str,
  gin_files: Sequence[str],
  gin_params: Sequence[str],
  search_paths: Sequence[str] = (),
  modules: Sequence[str] = (),
  operative: bool = False,
) -> CommandRecord:
  """`parse_config` of a command on a run's model_dir, where the flags not given are the run's.

  The search paths and modules not given are those the run recorded (`executor/command_record.py`); with
  `operative` and no gin file, the config is the run's `operative_config.gin`.

  Args:
    run_dir: The model_dir of the run (of the training run, for a continuous evaluation).
    gin_files: Gin files, applied in order.
    gin_params: Bindings applied after the files.
    search_paths: `--gin_search_path`; the run's when empty.
    modules: `--module`; the run's when empty.
    operative: Without gin files, parse the run's `operative_config.gin`.

  Returns:
    The search paths (absolute) and modules used: what a training run records.

  Raises:
    ConfigError: naming what is at fault; a recorded folder that is gone names the flag to pass.
  """
  used = with_record(run_dir, search_paths, modules)
  if operative and not gin_files:
    path = os.path.join(run_dir, "operative_config.gin")
    if not os.path.exists(path):
      raise ConfigError(f"model_dir '{run_dir}' has no operative_config.gin: give the run's --gin_file")
    gin_files = [path]
  try:
    parse_config(gin_files, gin_params, used.gin_search_paths, used.modules)
  except ConfigError as e:
    if (used.gin_search_paths, used.modules) == (tuple(search_paths), tuple(modules)):
      raise
    raise ConfigError(
      f"{e} (with the run's --gin_search_path and --module, recorded in '{os.path.join(run_dir, RECORD_FILE)}': "
      "pass them to use others)"
    ) from None
  return CommandRecord(tuple(_search_folder(f) for f in used.gin_search_paths), used.modules)


def _search_folder(folder: str) -> str:
  path = Path(folder).expanduser()
  if not path.is_dir():
    raise ConfigError(f"--gin_search_path '{folder}' is not a folder")
  return str(path.resolve())


_ADDED: set[str] = set()


def _add_user_search_paths(folders: Sequence[str]) -> None:
  """Puts each folder on gin's search path and on `sys.path`, in front, once per process."""
  for folder in reversed(folders):
    if folder in _ADDED:
      continue
    _ADDED.add(folder)
    gin.add_config_file_search_path(folder)
    sys.path.insert(0, folder)


# Gin re-raises a failed import with the statement on the message's last line.
_IMPORT_LINE = re.compile(r"^\s*import\s+([\w.]+)\s*$", re.M)
# Modules of the layout before 0.2, when the bottom layer and the example tasks were top-level packages.
_OLD_LAYOUT = {"core": "programs.core", "tasks": "executor.tasks"}


def _moved(module: str) -> str | None:
  """What to say of an import of a module that moved out of the old layout (`tasks.spirals`, `core`), or None.

  Only a module that exists at its new path counts: a user's own `tasks.mine` that is not found is a plain error.
  """
  top, _, rest = module.partition(".")
  if top not in _OLD_LAYOUT:
    return None
  new = f"{_OLD_LAYOUT[top]}.{rest}" if rest else _OLD_LAYOUT[top]
  try:
    if importlib.util.find_spec(new) is None:
      return None
  except ImportError:
    return None
  return f"'import {module}' names the old path of a module that moved: import {new} instead" + (
    " (in Python: from executor import Task, Runtime, ...)" if top == "core" else ""
  )


def _first_line(error: Exception) -> str:
  return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _import_module(name: str, folders: Sequence[str]) -> None:
  try:
    importlib.import_module(name)
  except ImportError as e:
    moved = _moved(name)
    if moved:
      raise ConfigError(f"--module '{name}': {moved}") from None
    raise ConfigError(f"--module '{name}' cannot be imported: {e}{_where_modules(folders)}") from None
  except Exception as e:  # The module itself raised: name the module and the error.
    raise ConfigError(f"--module '{name}': importing it raised {type(e).__name__}: {e}") from None


def _where_modules(folders: Sequence[str]) -> str:
  if folders:
    return f" (modules are looked up on sys.path, which starts with the --gin_search_path folders {', '.join(folders)})"
  return " (modules are looked up on sys.path: put a task's folder there with --gin_search_path=DIR)"


@functools.cache
def _add_search_paths() -> None:
  """Lets `include 'spirals.gin'` in a user's file find the shipped configs (once per process)."""
  for folder in _SEARCH_DIRS:
    if folder.is_dir():
      gin.add_config_file_search_path(str(folder))


def _gin_message(error: Exception) -> str:
  if isinstance(error, UnicodeDecodeError):
    position = f"byte 0x{error.object[error.start]:02x} at offset {error.start}"
    return f"not a text file ({position} is not {error.encoding.upper()})"
  if isinstance(error, tokenize.TokenError):  # A bracket or a string left open to the end.
    message, (line, _) = error.args
    return f"syntax error at line {line}: {message} (a bracket or a quote is not closed)"
  if type(error) is SyntaxError and error.lineno:
    return f"syntax error at line {error.lineno}: {error.msg}"
  text = str(error).strip()
  if isinstance(error, KeyError) and text.startswith("'") and text.endswith("'"):
    text = text[1:-1]
  return with_suggestion(" ".join(line.strip() for line in text.splitlines() if line.strip()))
