"""Checkpoints of the whole training state in `model_dir/checkpoints`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import gin
import tensorflow as tf
from absl import logging


@gin.configurable
class Checkpointer:
  """Restores the latest checkpoint at start and saves when due.

  What is saved: the runtime's global step and every task's
  `checkpoint_items()` (model and optimizer by default).
  """

  def __init__(self, save_interval_steps: int = 1000, max_to_keep: int = 5):
    """Configures the save policy.

    Args:
      save_interval_steps: Save when at least this many steps passed since the
        last save. A save also happens at the end of every run.
      max_to_keep: Checkpoints kept; older ones are deleted.
    """
    if save_interval_steps < 1:
      raise ValueError(f"Checkpointer.save_interval_steps must be >= 1, got {save_interval_steps}")
    if max_to_keep < 1:
      raise ValueError(f"Checkpointer.max_to_keep must be >= 1, got {max_to_keep}")
    self.save_interval_steps = save_interval_steps
    self.max_to_keep = max_to_keep
    self.directory: str | None = None
    self._manager: tf.train.CheckpointManager | None = None
    self._global_step: tf.Variable | None = None

  def attach(self, model_dir: str, global_step: tf.Variable, items: Mapping[str, Any]) -> None:
    """Binds the checkpointer to the state it saves and restores."""
    self.directory = os.path.join(model_dir, "checkpoints")
    self._global_step = global_step
    checkpoint = tf.train.Checkpoint(global_step=global_step, **items)
    self._manager = tf.train.CheckpointManager(checkpoint, self.directory, max_to_keep=self.max_to_keep)
    self._last_saved_step = 0

  @property
  def latest(self) -> str | None:
    """Path prefix of the newest checkpoint, or None."""
    return self._manager.latest_checkpoint

  def restore(self) -> int | None:
    """Restores the newest checkpoint; returns its step, or None on a fresh start."""
    path = self._manager.latest_checkpoint
    if path is None:
      logging.info("No checkpoint in %s: fresh start", self.directory)
      return None
    self._manager.checkpoint.restore(path).assert_existing_objects_matched()
    step = self._last_saved_step = int(self._global_step.numpy())
    logging.info("Restored %s at step %d", path, step)
    return step

  def maybe_save(self) -> bool:
    """Saves if `save_interval_steps` passed since the last save."""
    if int(self._global_step.numpy()) - self._last_saved_step < self.save_interval_steps:
      return False
    return self.save() is not None

  def save(self) -> str | None:
    """Saves now, unless this step is already saved; returns the path written."""
    step = int(self._global_step.numpy())
    if step == self._last_saved_step and self._manager.latest_checkpoint is not None:
      return None
    path = self._manager.save(checkpoint_number=step)
    self._last_saved_step = step
    logging.info("Saved %s", path)
    return path
