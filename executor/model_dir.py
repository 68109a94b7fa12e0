"""The model directory: checked before a run touches it."""

from __future__ import annotations

import tempfile
from pathlib import Path

from core.errors import ConfigError


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
