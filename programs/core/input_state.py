"""The train input iterator's state in checkpoints: resuming with no replay where tf.data can save it.

A pipeline whose `dataset()` takes no `start_example` cannot be opened at a position; tf.data can instead save its
iterator (shuffle buffers, seeds, counts) when every op in it can be saved and the iterator is a plain
`tf.data.Iterator` (one device). `IteratorState` saves that state with each checkpoint and hands it back on restore.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from programs.core.op_errors import op_message

# The attribute the state is saved under: `<item>/state/.ATTRIBUTES/ITERATOR_STATE`.
_KEY = "ITERATOR_STATE"
_FAIL = tf.data.experimental.ExternalStatePolicy.FAIL.value


def serialize(iterator: Any) -> tf.Tensor:
  """The state of a `tf.data.Iterator` (a variant tensor); fails when an op in its pipeline cannot be saved."""
  return tf.raw_ops.SerializeIterator(
    resource_handle=iterator._iterator_resource,  # noqa: SLF001
    external_state_policy=_FAIL,
  )


def restore(iterator: Any, state: tf.Tensor) -> None:
  """Puts `iterator` where `state` (from `serialize`) says."""
  tf.raw_ops.DeserializeIterator(resource_handle=iterator._iterator_resource, serialized=state)  # noqa: SLF001


def size_bytes(state: tf.Tensor) -> int:
  """Bytes of a saved iterator state (as serialized tensors)."""
  return sum(int(tf.strings.length(tf.io.serialize_tensor(part))) for part in tf.unstack(state))


def unsaveable(iterator: Any) -> str | None:
  """Why `iterator`'s state cannot be saved in a checkpoint, or None when it can (tried once, on its state now)."""
  if not isinstance(iterator, tf.data.Iterator) or not hasattr(iterator, "_iterator_resource"):
    return f"its iterator is a {type(iterator).__name__}, whose state tf.data cannot save"
  try:
    serialize(iterator)
  except tf.errors.OpError as e:
    return f"tf.data cannot save its iterator ({op_message(e)})"
  return None


class IteratorState(tf.__internal__.tracking.Trackable):
  """Saves the current train iterator's state; a restore keeps it in `pending` for the program to apply.

  Attributes:
    pending: The state a restore read, until the program applies it.
    on_first_save: Called once with the state's size in bytes at the next (eager) save, if set.

  Args:
    iterator_fn: Returns the program's current iterator (it is replaced when the input is reset).
  """

  def __init__(self, iterator_fn: Callable[[], Any]):
    self._iterator_fn = iterator_fn
    self.pending: tf.Tensor | None = None
    self.on_first_save: Callable[[int], None] | None = None

  def _serialize_to_tensors(self):
    return {_KEY: self._state()}

  def _state(self) -> tf.Tensor:
    state = serialize(self._iterator_fn())
    if self.on_first_save is not None and tf.executing_eagerly():
      self.on_first_save(size_bytes(state))
      self.on_first_save = None
    return state

  def _restore_from_tensors(self, restored_tensors):
    self.pending = restored_tensors[_KEY]
    return tf.no_op()

  def _copy_trackable_to_cpu(self, object_map):
    # An asynchronous save writes a copy of the iterator, made once and set to the current state at each save (the
    # iterator a reset makes reads the same pipeline, so its state fits the copy).
    if self not in object_map:
      object_map[self] = _Copy(iter(self._iterator_fn()._dataset))  # noqa: SLF001
    restore(object_map[self].iterator, self._state())


class _Copy(tf.__internal__.tracking.Trackable):
  """The copy of the train iterator an asynchronous save writes."""

  def __init__(self, iterator: Any):
    self.iterator = iterator

  def _serialize_to_tensors(self):
    return {_KEY: serialize(self.iterator)}


class InputCheckpoint(tf.__internal__.tracking.AutoTrackable):
  """The checkpoint item holding an `IteratorState` as its child `state`, attached only after the restore.

  A checkpoint written before the iterator state was saved (or by a run that could not save it) restores cleanly:
  the item itself holds nothing, and the state attached later finds nothing to restore.
  """
