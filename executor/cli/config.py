"""Gin files and bindings: resolution and parsing with errors that name the culprit."""

from __future__ import annotations

import functools
import tokenize
from collections.abc import Sequence
from pathlib import Path

import gin

from core.errors import ConfigError

# The `gin/` folder of the repository (source checkouts and editable installs)
# and the copy installed with the package.
_PACKAGE = Path(__file__).resolve().parent.parent
_SEARCH_DIRS = (
  _PACKAGE.parent / "gin",
  _PACKAGE / "gin_configs",
)


def resolve_gin_file(name: str) -> str:
  """Finds a gin file as given, else in the package's `gin/` folder.

  `gin/quickstart.gin`, `quickstart.gin` and `quickstart` all find the shipped
  quickstart.

  Raises:
    ConfigError: naming the file and every place looked in.
  """
  candidates = [Path(name)]
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


def parse_config(gin_files: Sequence[str], gin_params: Sequence[str]) -> list[str]:
  """Parses the gin files, then the bindings, and returns the files' paths.

  Raises:
    ConfigError: naming the file or binding that gin rejected and why.
  """
  paths = [resolve_gin_file(f) for f in gin_files]
  gin.clear_config()
  _add_search_paths()
  for path in paths:
    try:
      gin.parse_config_file(path, skip_unknown=False)
    except ImportError as e:
      raise ConfigError(f"gin file '{path}': cannot import {e.name or e}: {e}") from None
    except Exception as e:  # gin raises ValueError, KeyError, SyntaxError...
      raise ConfigError(f"gin file '{path}': {_gin_message(e)}") from None
  for param in gin_params:
    try:
      gin.parse_config(param)
    except Exception as e:
      raise ConfigError(f"gin binding '{param}': {_gin_message(e)}") from None
  return paths


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
  return " ".join(line.strip() for line in text.splitlines() if line.strip())
