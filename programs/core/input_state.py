"""The train input's state in checkpoints: what read it, and its iterators' states, resumed with no replay.

A pipeline whose `dataset()` takes no `start_example` cannot be opened at a position; tf.data can instead save its
iterator (shuffle buffers, seeds, counts) when every op in it can be saved and the iterator is a plain
`tf.data.Iterator`. The train input reads each worker's input pipeline with one (`Runtime.worker_dataset`), so
each checkpoint holds the state of every pipeline, gathered from the workers at each save (`PipelineStates`), and
what read them: the replicas, workers and stream pipelines of the run (`ReadBy`). A restore on the same pipelines
and per-replica batch puts each worker's iterator back; on others the input falls back (`TrainInput`).

Both are children of one checkpoint item (`SavedInput`), attached after the restore: a checkpoint written without
them (by an earlier release, or by a run that could not save its iterators) restores cleanly.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf

from programs.core.op_errors import op_message

_FAIL = tf.data.experimental.ExternalStatePolicy.FAIL.value
# `<item>/pipelines/.ATTRIBUTES/<key>`: one entry per input pipeline (its iterator state as a serialized tensor,
# the input position it belongs to), and the per-replica batch of the run that saved them.
_STATES, _POSITIONS, _BATCH = "ITERATOR_STATES", "POSITIONS", "PER_REPLICA_BATCH"
# `<item>/read_by/.ATTRIBUTES/<key>`.
_REPLICAS, _WORKERS, _STREAMS = "REPLICAS", "WORKERS", "STREAM_PIPELINES"


def serialize(iterator: Any) -> bytes:
  """The state of a `tf.data.Iterator`, as bytes; fails when an op in its pipeline cannot be saved."""
  state = tf.raw_ops.SerializeIterator(
    resource_handle=iterator._iterator_resource,  # noqa: SLF001
    external_state_policy=_FAIL,
  )
  return tf.io.serialize_tensor(state).numpy()


def restore(iterator: Any, state: bytes) -> None:
  """Puts `iterator` where `state` (from `serialize`) says."""
  variant = tf.io.parse_tensor(state, tf.variant)
  tf.raw_ops.DeserializeIterator(resource_handle=iterator._iterator_resource, serialized=variant)  # noqa: SLF001


def unsaveable(iterator: Any) -> str | None:
  """Why `iterator`'s state cannot be saved in a checkpoint, or None when it can (tried once, on its state now)."""
  if not isinstance(iterator, tf.data.Iterator) or not hasattr(iterator, "_iterator_resource"):
    return f"its iterator is a {type(iterator).__name__}, whose state tf.data cannot save"
  try:
    serialize(iterator)
  except tf.errors.OpError as e:
    return f"tf.data cannot save its iterator ({op_message(e)})"
  return None


class Saved(NamedTuple):
  """The pipelines' states a checkpoint held: one per input pipeline, and the per-replica batch they were read in."""

  states: list[bytes]
  positions: list[int]
  per_replica_batch: int


class PipelineStates(tf.__internal__.tracking.Trackable):
  """Every input pipeline's iterator state, brought up to date before each save (`sync`).

  Each worker serializes its own pipeline's iterator; a save gathers them from every worker, so the chief's
  checkpoint holds them all, with the checkpoint's own step: no checkpoint pairs with another step's state. A
  copy written on the chief alone (`Checkpointer.write_copy`) holds the others' states of the last save, with
  the positions they belong to, which a restore checks.

  Attributes:
    pending: What a restore read, until the train input applies it.
    on_first_save: Called once with the state's size in bytes at the first `sync`, if set.

  Args:
    iterator_fn: This worker's current iterator (it is replaced when the input is reset).
    position_fn: The input position (examples over all replicas) the iterator is at.
    per_replica_batch: Examples of one replica's batch.
    pipelines: Input pipelines (one per worker).
    pipeline: This worker's.
    all_workers: Every worker's bytes from each worker's (`Runtime.all_workers`); every worker calls it together.
  """

  def __init__(
    self,
    iterator_fn: Callable[[], Any],
    position_fn: Callable[[], int],
    per_replica_batch: int,
    pipelines: int,
    pipeline: int,
    all_workers: Callable[[bytes], list[bytes]],
  ):
    self._iterator_fn, self._position_fn, self._all_workers = iterator_fn, position_fn, all_workers
    self._pipeline = pipeline
    with tf.init_scope(), tf.device("/cpu:0"):
      self._variables = {
        _STATES: tf.Variable([b""] * pipelines, trainable=False),
        _POSITIONS: tf.Variable([-1] * pipelines, dtype=tf.int64, trainable=False),
        _BATCH: tf.Variable(per_replica_batch, dtype=tf.int64, trainable=False),
      }
    self.pending: Saved | None = None
    self.on_first_save: Callable[[int], None] | None = None

  def sync(self, all_workers: bool) -> None:
    """Serializes this worker's iterator for the next save; with `all_workers`, gathers every worker's too."""
    state, position = serialize(self._iterator_fn()), self._position_fn()
    if self.on_first_save is not None:
      self.on_first_save(len(state))
      self.on_first_save = None
    states = [bytes(s) for s in self._variables[_STATES].numpy()]
    positions = [int(p) for p in self._variables[_POSITIONS].numpy()]
    if all_workers and len(states) > 1:
      gathered = self._all_workers(struct.pack("<q", position) + state)
      positions = [struct.unpack("<q", data[:8])[0] for data in gathered]
      states = [data[8:] for data in gathered]
    else:
      states[self._pipeline], positions[self._pipeline] = state, position
    self._variables[_STATES].assign(states)
    self._variables[_POSITIONS].assign(positions)

  def _serialize_to_tensors(self):
    return {key: v.read_value() for key, v in self._variables.items()}

  def _restore_from_tensors(self, restored_tensors):
    self.pending = Saved(
      [bytes(s) for s in restored_tensors[_STATES].numpy()],
      [int(p) for p in restored_tensors[_POSITIONS].numpy()],
      int(restored_tensors[_BATCH].numpy()),
    )
    return tf.no_op()

  def _copy_trackable_to_cpu(self, object_map):
    # An asynchronous save writes copies of the host variables, made once and refreshed at each save.
    for v in self._variables.values():
      v._copy_trackable_to_cpu(object_map)  # noqa: SLF001
    object_map[self] = _Copies({key: object_map[v] for key, v in self._variables.items()})


class _Copies(tf.__internal__.tracking.Trackable):
  """The copies of `PipelineStates`' variables an asynchronous save writes."""

  def __init__(self, variables: dict[str, tf.Variable]):
    self._variables = variables

  def _serialize_to_tensors(self):
    return {key: v.read_value() for key, v in self._variables.items()}


class ReadBy(tf.__internal__.tracking.Trackable):
  """What reads the train input: the run's replicas, workers and stream pipelines, saved, never restored over.

  Attributes:
    restored: `(replicas, workers, stream pipelines)` of the run a restore read, or None.

  Args:
    replicas: Replicas of this run, over all workers.
    workers: Workers (input pipelines) of this run.
    stream_pipelines: Input pipelines of the run that started the stream (`StreamInputContext`).
  """

  def __init__(self, replicas: int, workers: int, stream_pipelines: int):
    self.replicas, self.workers, self.stream_pipelines = replicas, workers, stream_pipelines
    self.restored: tuple[int, int, int] | None = None

  def _serialize_to_tensors(self):
    values = {_REPLICAS: self.replicas, _WORKERS: self.workers, _STREAMS: self.stream_pipelines}
    return {key: tf.constant(value, tf.int64) for key, value in values.items()}

  def _restore_from_tensors(self, restored_tensors):
    self.restored = tuple(int(restored_tensors[key].numpy()) for key in (_REPLICAS, _WORKERS, _STREAMS))
    return tf.no_op()

  def _copy_trackable_to_cpu(self, object_map):
    object_map[self] = self  # Constants of the run: nothing to copy.


class SavedInput(tf.__internal__.tracking.AutoTrackable):
  """The train input's checkpoint item.

  Its children, `read_by` (a `ReadBy`) and `pipelines` (`PipelineStates`), are attached after the restore. The
  checkpointer calls `sync` before each save.
  """

  def sync(self, all_workers: bool) -> None:
    """Brings the pipelines' states up to date (with `all_workers`, gathered from every worker: every one calls)."""
    states = getattr(self, "pipelines", None)
    if states is not None:
      states.sync(all_workers)
