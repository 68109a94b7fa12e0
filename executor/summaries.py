"""TensorBoard summary writing from the host, one folder per program."""

from __future__ import annotations

import os
from collections.abc import Mapping

import tensorflow as tf


class SummaryWriter:
  """Writes scalars and text at given steps into one TensorBoard run folder.

  A writer made with `enabled=False` (non-chief workers) writes nothing.
  """

  def __init__(self, logdir: str, enabled: bool = True):
    self.logdir = logdir
    self._writer = tf.summary.create_file_writer(logdir) if enabled else None

  def scalars(self, values: Mapping[str, float], step: int) -> None:
    """Writes every `name: value` as a scalar at `step`."""
    if self._writer is None:
      return
    with self._writer.as_default(step=step):
      for name, value in values.items():
        tf.summary.scalar(name, float(value))

  def text(self, name: str, markdown: str, step: int) -> None:
    """Writes a markdown text summary at `step`."""
    if self._writer is None:
      return
    with self._writer.as_default(step=step):
      tf.summary.text(name, markdown)

  def flush(self) -> None:
    """Makes everything written so far visible on disk."""
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    """Flushes and releases the event file."""
    if self._writer is not None:
      self._writer.close()
      self._writer = None


def program_logdir(model_dir: str, name: str) -> str:
  """The summary folder of the program called `name`."""
  return os.path.join(model_dir, name)
