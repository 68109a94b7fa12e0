"""The model directory: checked before a run touches it, and the files that describe the run."""

from __future__ import annotations

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


def describe_run(model_dir: str, variables: Sequence[tf.Variable], writer: SummaryWriter, step: int) -> None:
  """Writes the model analysis and the operative gin config, as files in `model_dir` and as summaries."""
  text, total = model_analysis(variables)
  config = gin.operative_config_str()
  write_atomically(os.path.join(model_dir, "model_analysis.txt"), text)
  write_atomically(os.path.join(model_dir, "operative_config.gin"), config)
  writer.scalars({"total_num_params": total}, step)
  writer.text("model_analysis", f"```\n{text}```", step)
  writer.text("operative_config", f"```\n{config}```", step)
  logging.info("Model analysis:\n%s", text)
