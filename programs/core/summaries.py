"""TensorBoard summary writing from the host, one folder per program.

Programs hand their metrics to the host as numbers, once per loop, so the
summaries are written as event protos straight into a TFRecord event file:
no TensorFlow op runs per scalar (microseconds, instead of the millisecond
of an eager `tf.summary.scalar`), and the record checksums are computed in
C++ by `tf.io.TFRecordWriter` (TensorBoard's own Python writer computes them
in Python, holding the interpreter lock for ~0.1 us per byte). A thread
flushes every few seconds, so programs never block on the disk. The events
are the same TF2 tensor summaries `tf.summary.scalar` and `tf.summary.text`
write, so TensorBoard, the `EventAccumulator` and `executor report` read
them alike.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import threading
import time
from collections.abc import Mapping

import tensorflow as tf
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2
from tensorboard.plugins.scalar import metadata as scalar_metadata
from tensorboard.plugins.text import metadata as text_metadata

_SCALAR_METADATA = scalar_metadata.create_summary_metadata(display_name=None, description=None)
_TEXT_METADATA = text_metadata.create_summary_metadata(display_name=None, description=None)
_SCALAR_SHAPE = tensor_shape_pb2.TensorShapeProto()
# Tells apart the event files of writers opened in the same second by one process.
_file_ids = itertools.count()
_EVENT_FILE_TIME = re.compile(r"^events\.out\.tfevents\.(\d+)\.")


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
    self._records: tf.io.TFRecordWriter | None = None
    if not enabled:
      return
    tf.io.gfile.makedirs(logdir)
    # TensorBoard reads a folder's event files in name order, and a restart's purge (see `restart`) only
    # removes events read before it: a new file must sort after every existing one, even when a restarted
    # process opens it in the same second as the killed one did.
    stamp = max(int(time.time()), _newest_stamp(logdir) + 1)
    name = f"events.out.tfevents.{stamp:010d}.{socket.gethostname()}.{os.getpid()}.{next(_file_ids)}.v2"
    self._records = tf.io.TFRecordWriter(os.path.join(logdir, name))
    self._lock = threading.Lock()
    self._dirty = False
    self._closing = threading.Event()
    self._add(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
    self.flush()
    self._flusher = threading.Thread(
      target=self._flush_every, args=(flush_secs,), name=f"summaries {logdir}", daemon=True
    )
    self._flusher.start()

  def scalars(self, values: Mapping[str, float], step: int) -> None:
    """Writes every `name: value` as a float32 scalar at `step`, as one event."""
    if self._records is None or not values:
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
    if self._records is None:
      return
    tensor = tensor_pb2.TensorProto(
      dtype=types_pb2.DT_STRING, tensor_shape=_SCALAR_SHAPE, string_val=[markdown.encode("utf-8")]
    )
    self._write(step, [summary_pb2.Summary.Value(tag=name, metadata=_TEXT_METADATA, tensor=tensor)])

  def restart(self, step: int) -> None:
    """Starts a session that continues from `step` (a restored checkpoint's step; -1: from nothing).

    Writes a `SessionLog.START` event at `step + 1`, as TF1 supervisors did: TensorBoard's loaders
    (`purge_orphaned_data`, on by default) then drop every event of a step after `step` read before it,
    that is, what a killed run wrote after its last checkpoint, so each step shows the resumed run's value
    once. TensorBoard takes the first START of a folder for the run's start, so every session writes one.
    """
    if self._records is None:
      return
    log = event_pb2.SessionLog(status=event_pb2.SessionLog.START)
    self._add(event_pb2.Event(wall_time=time.time(), step=int(step) + 1, session_log=log))

  def _write(self, step: int, values: list[summary_pb2.Summary.Value]) -> None:
    summary = summary_pb2.Summary(value=values)
    self._add(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

  def _add(self, event: event_pb2.Event) -> None:
    record = event.SerializeToString()
    with self._lock:
      self._records.write(record)
      self._dirty = True

  def _flush_every(self, secs: float) -> None:
    while not self._closing.wait(secs):
      self.flush()

  def flush(self) -> None:
    """Makes everything written so far visible on disk."""
    if self._records is None:
      return
    with self._lock:
      if self._dirty and self._records is not None:
        self._records.flush()
        self._dirty = False

  def close(self) -> None:
    """Flushes and releases the event file."""
    if self._records is None:
      return
    self._closing.set()
    self._flusher.join()
    with self._lock:
      self._records.close()
      self._records = None


def _newest_stamp(logdir: str) -> int:
  """The largest time stamp in the names of `logdir`'s event files (0 when none)."""
  stamps = [_EVENT_FILE_TIME.match(name) for name in tf.io.gfile.listdir(logdir)]
  return max((int(m.group(1)) for m in stamps if m), default=0)


def program_logdir(model_dir: str, name: str) -> str:
  """The summary folder of the program called `name`."""
  return os.path.join(model_dir, name)
