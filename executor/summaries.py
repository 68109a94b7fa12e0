"""TensorBoard summary writing from the host, one folder per program.

Programs hand their metrics to the host as numbers, once per loop, so the
summaries are written as event protos by TensorBoard's own event-file writer
(a background thread does the file I/O and flushes every few seconds): no TensorFlow op runs per scalar,
which costs microseconds instead of the millisecond of an eager
`tf.summary.scalar`. The events are the same TF2 tensor summaries
`tf.summary.scalar` and `tf.summary.text` write, so TensorBoard, the
`EventAccumulator` and `executor report` read them alike.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter

_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None, description=None)
_TEXT_METADATA = text_metadata.create_summary_metadata(display_name=None, description=None)
_SCALAR_SHAPE = tensor_shape_pb2.TensorShapeProto()


class SummaryWriter:
  """Writes scalars and text at given steps into one TensorBoard run folder.

  A writer made with `enabled=False` (non-chief workers) writes nothing and
  creates no file.
  """

  def __init__(self, logdir: str, enabled: bool = True, flush_secs: float = 5.0):
    """Opens a new event file in `logdir` (created if missing).

    Args:
      logdir: The run folder.
      enabled: Write anything at all (False on non-chief workers).
      flush_secs: Longest time written events wait before the writer's
        thread flushes them to disk (TensorBoard reloads every 5 s), so
        programs never block on a flush; `flush` and `close` flush at once.
    """
    self.logdir = logdir
    self._writer = (
      EventFileWriter(logdir, max_queue_size=1000, flush_secs=flush_secs, filename_suffix=".v2")
      if enabled
      else None
    )

  def scalars(self, values: Mapping[str, float], step: int) -> None:
    """Writes every `name: value` as a float32 scalar at `step`, as one event."""
    if self._writer is None or not values:
      return
    self._write(
      step,
      [
        summary_pb2.Summary.Value(
          tag=name,
          metadata=_SCALAR_METADATA,
          tensor=tensor_pb2.TensorProto(
            dtype=types_pb2.DT_FLOAT, tensor_shape=_SCALAR_SHAPE, float_val=[float(value)]
          ),
        )
        for name, value in values.items()
      ],
    )

  def text(self, name: str, markdown: str, step: int) -> None:
    """Writes a markdown text summary at `step`."""
    if self._writer is None:
      return
    tensor = tensor_pb2.TensorProto(
      dtype=types_pb2.DT_STRING, tensor_shape=_SCALAR_SHAPE, string_val=[markdown.encode("utf-8")]
    )
    self._write(step, [summary_pb2.Summary.Value(tag=name, metadata=_TEXT_METADATA, tensor=tensor)])

  def _write(self, step: int, values: list[summary_pb2.Summary.Value]) -> None:
    summary = summary_pb2.Summary(value=values)
    self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

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
