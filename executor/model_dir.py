"""The model directory: checked before a run touches it, and the files that describe the run."""

from __future__ import annotations

import glob
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

import gin
import tensorflow as tf
from absl import logging

from programs.core.analysis import model_analysis
from programs.core.errors import ConfigError
from programs.core.files import write_atomically
from programs.core.summaries import SummaryWriter


def check_model_dir(model_dir: str) -> None:
  """Fails when `model_dir` cannot hold a run (a file, or not writable).

  Raises:
    ConfigError: naming the path.
  """
  if not model_dir:
    raise ConfigError("--model_dir is required")
  path = Path(model_dir)
  existing = path.parent
  while not os.path.isdir(existing) and existing != existing.parent:  # isdir is False on a too-long name
    existing = existing.parent
  longest = os.pathconf(existing, "PC_NAME_MAX")
  for part in path.parts:
    if len(os.fsencode(part)) > longest:
      raise ConfigError(
        f"model_dir '{model_dir}': the name '{part[:40]}...' is {len(os.fsencode(part))} bytes long; the file "
        f"system allows {longest}"
      )
  if path.exists() and not path.is_dir():
    raise ConfigError(f"model_dir '{model_dir}' is a file, not a directory")
  existing = path
  while not existing.exists():
    existing = existing.parent
  if not existing.is_dir():
    raise ConfigError(f"model_dir '{model_dir}': '{existing}' is a file, not a directory")
  try:
    # A real write: permission bits do not tell root, read-only mounts or quotas.
    with tempfile.TemporaryFile(dir=existing):
      pass
  except OSError as e:
    raise ConfigError(f"model_dir '{model_dir}' is not writable ('{existing}': {e.strerror})") from None


def check_directories(paths: Sequence[str], files: Sequence[str] = ()) -> None:
  """Fails when a folder the run writes into is no folder or a link, or a file it writes is no file or a link.

  A link is refused: what the run rotates or rewrites there would land (or be deleted) outside model_dir.

  Args:
    paths: Folders the run writes into (each may not exist yet).
    files: Files the run writes or appends to (each may not exist yet).

  Raises:
    ConfigError: naming the path; raised before anything is written.
  """
  for path in paths:
    if os.path.islink(path):
      raise ConfigError(
        f"'{path}' is a symlink (to '{os.readlink(path)}'): the run writes and deletes in it, so it must be a "
        "real folder of model_dir (move the link away)"
      )
    if os.path.lexists(path) and not os.path.isdir(path):
      raise ConfigError(f"'{path}' is a file, not a directory: the run writes into it (move it away)")
    # Decode records are files the run writes (or rewrites) there.
    for record in glob.glob(os.path.join(glob.escape(path), "decoder_out_*.jsonl")):
      if os.path.isdir(record):
        raise ConfigError(
          f"'{record}' is a directory, not a file: the run writes decode records there (move it away)"
        )
  for path in files:
    if os.path.islink(path):
      raise ConfigError(
        f"'{path}' is a symlink (to '{os.readlink(path)}'): the run writes this file (move it away)"
      )
    if os.path.lexists(path) and not os.path.isfile(path):
      raise ConfigError(f"'{path}' is a directory, not a file: the run writes this file (move it away)")


def describe_run(
  model_dir: str, variables: Sequence[tf.Variable], writer: SummaryWriter, step: int, prefix: str = ""
) -> None:
  """Writes the model analysis and the operative gin config, as files in `model_dir` and as summaries.

  Bindings that differ from the previous run's operative config (a resume with another learning rate,
  batch size, ...) are logged once, in one line, before it is replaced.

  Args:
    model_dir: The run's directory.
    variables: The model's variables.
    writer: The executor's summary writer.
    step: The step of the summaries.
    prefix: Put before the names of the files and summaries: an evaluation ('eval_') writes its own beside the
      training run's, never over them.
  """
  text, total = model_analysis(variables)
  config = gin.operative_config_str()
  previous = os.path.join(model_dir, f"{prefix}operative_config.gin")
  if os.path.exists(previous):
    with open(previous) as f:
      changes = config_changes(f.read(), config)
    if changes:
      logging.warning(
        "The configuration changed since the previous run in this model_dir; the new values run (a checkpoint "
        "restores state, not configuration): %s",
        "; ".join(changes),
      )
  write_atomically(os.path.join(model_dir, f"{prefix}model_analysis.txt"), text)
  write_atomically(previous, config)
  writer.scalars({"total_num_params": total}, step)
  writer.text(f"{prefix}model_analysis", f"```\n{text}```", step)
  writer.text(f"{prefix}operative_config", f"```\n{config}```", step)
  logging.info("Model analysis:\n%s", text)


def config_changes(previous: str, current: str) -> list[str]:
  """`binding: old -> new` for every binding that differs between two operative gin configs."""
  before, after = _bindings(previous), _bindings(current)
  return [
    f"{key}: {before.get(key, '(default)')} -> {after.get(key, '(default)')}"
    for key in sorted(before.keys() | after.keys())
    if before.get(key) != after.get(key)
  ]


def _bindings(config: str) -> dict[str, str]:
  """{`scope/configurable.parameter`: value text} of an operative gin config (values on several lines joined)."""
  bindings, key = {}, None
  for line in config.splitlines():
    if not line.strip() or line.lstrip().startswith("#"):
      continue
    if line[0].isspace() and key is not None:
      bindings[key] += " " + line.strip()
    elif " = " in line:
      key, value = (part.strip() for part in line.split(" = ", 1))
      bindings[key] = value
    else:
      key = None  # An import.
  return bindings
