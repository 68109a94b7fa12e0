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


def check_directories(paths: Sequence[str]) -> None:
  """Fails when one of `paths` (folders the run writes into) is no folder, or holds a folder named as a record.

  Raises:
    ConfigError: naming the path; raised before anything is written.
  """
  for path in paths:
    if os.path.lexists(path) and not os.path.isdir(path):
      raise ConfigError(f"'{path}' is a file, not a directory: the run writes into it (move it away)")
    # Decode records are files the run writes (or rewrites) there.
    for record in glob.glob(os.path.join(glob.escape(path), "decoder_out_*.jsonl")):
      if os.path.isdir(record):
        raise ConfigError(
          f"'{record}' is a directory, not a file: the run writes decode records there (move it away)"
        )


def describe_run(
  model_dir: str, variables: Sequence[tf.Variable], writer: SummaryWriter, step: int, prefix: str = ""
) -> None:
  """Writes the model analysis and the operative gin config, as files in `model_dir` and as summaries.

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
  write_atomically(os.path.join(model_dir, f"{prefix}model_analysis.txt"), text)
  write_atomically(os.path.join(model_dir, f"{prefix}operative_config.gin"), config)
  writer.scalars({"total_num_params": total}, step)
  writer.text(f"{prefix}model_analysis", f"```\n{text}```", step)
  writer.text(f"{prefix}operative_config", f"```\n{config}```", step)
  logging.info("Model analysis:\n%s", text)
