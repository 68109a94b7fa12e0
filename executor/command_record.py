"""How a run's command was configured, beyond its operative config: recorded in model_dir, read by later commands.

A training run's `operative_config.gin` holds its bindings and the gin files' `import` lines, but not where the
command found them: the `--gin_search_path` folders (which put a task's module on `sys.path`) and the `--module`
names. The chief of a training run writes them, as absolute paths, to `model_dir/command.json` at start-up (once
its checks pass); `executor export`, `executor --mode=eval` and the other commands on that model_dir read them for
a flag not given, so they work from any folder. A flag given wins over the record.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

from absl import logging

from programs.core.errors import ConfigError
from programs.core.files import write_atomically

FILE = "command.json"


@dataclasses.dataclass(frozen=True)
class CommandRecord:
  """The flags of a run's command that its files do not otherwise hold.

  Attributes:
    gin_search_paths: The `--gin_search_path` folders, absolute.
    modules: The `--module` names.
  """

  gin_search_paths: tuple[str, ...] = ()
  modules: tuple[str, ...] = ()

  def write(self, model_dir: str) -> None:
    """Writes the record to `model_dir/command.json`, whole or not at all."""
    text = json.dumps(
      {"gin_search_path": list(self.gin_search_paths), "module": list(self.modules)}, indent=1
    )
    write_atomically(os.path.join(model_dir, FILE), text + "\n")


def read_record(model_dir: str) -> CommandRecord | None:
  """The record of the run in `model_dir`; None when it has none (a run of an older version, or from Python).

  Raises:
    ConfigError: the record is unreadable or not what a run writes.
  """
  path = os.path.join(model_dir, FILE)
  if not os.path.isfile(path):
    return None
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    record = CommandRecord(tuple(data["gin_search_path"]), tuple(data["module"]))
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigError(
      f"'{path}', the record of how the run was configured, is unreadable ({type(e).__name__}: {e}): remove it "
      "and pass --gin_search_path and --module as the run had them"
    ) from None
  if not all(isinstance(v, str) for v in record.gin_search_paths + record.modules):
    raise ConfigError(f"'{path}' must hold lists of strings under 'gin_search_path' and 'module'")
  return record


def with_record(model_dir: str, gin_search_paths: Sequence[str], modules: Sequence[str]) -> CommandRecord:
  """The flags given, each one not given taken from the record of the run in `model_dir`.

  Raises:
    ConfigError: a recorded search path is no longer a folder (the message names it and the flag to pass).
  """
  record = read_record(model_dir) or CommandRecord()
  paths = tuple(gin_search_paths)
  if not paths and record.gin_search_paths:
    for folder in record.gin_search_paths:
      if not os.path.isdir(folder):
        raise ConfigError(
          f"the run in '{model_dir}' was configured with --gin_search_path '{folder}' (recorded in {FILE}), which "
          "is no longer a folder: pass --gin_search_path=DIR, the folder of the run's gin files and modules now"
        )
    paths = record.gin_search_paths
    logging.info("The run's --gin_search_path (from %s): %s", FILE, ", ".join(paths))
  names = tuple(modules)
  if not names and record.modules:
    names = record.modules
    logging.info("The run's --module (from %s): %s", FILE, ", ".join(names))
  return CommandRecord(paths, names)
