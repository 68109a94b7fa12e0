"""Host counters: integers the host owns and knows without a device read, saved in checkpoints as themselves."""

from __future__ import annotations

import tensorflow as tf

# The attribute name a tf.Variable saves its value under: a counter's checkpoint key is a variable's.
VALUE = "VARIABLE_VALUE"


class HostCounter(tf.__internal__.tracking.Trackable):
  """An integer the host owns and knows without a device read, saved in checkpoints as itself.

  Schedule cycles, loops done and the host's copy of the global step are host counters: reading or setting `value`
  runs no op, and a checkpoint saves (and restores) the value, synchronously or asynchronously, under the same key a
  `tf.Variable` would have (`<name>/.ATTRIBUTES/VARIABLE_VALUE`). What a checkpoint reads is a host-memory
  variable (an asynchronous save copies it in a traced function, which cannot read a Python int): `sync` brings it
  up to date, and the checkpointer calls it on every counter it saves, just before each save. With `variable`, a
  restore also assigns that device variable (the global step, which the train loop advances on device and reports
  back).
  """

  def __init__(self, variable: tf.Variable | None = None, value: int = 0):
    self.variable = variable
    with tf.init_scope(), tf.device("/cpu:0"):
      self._saved = tf.Variable(value, dtype=tf.int64, trainable=False)
    self._value = self._synced = value

  @property
  def value(self) -> int:
    """The count."""
    return self._value

  @value.setter
  def value(self, value: int) -> None:
    self._value = value

  def sync(self) -> None:
    """Makes the host-memory variable a checkpoint reads hold `value` (one op, only when it changed)."""
    if self._synced != self._value:
      self._saved.assign(self._value)
      self._synced = self._value

  def _serialize_to_tensors(self):
    return {VALUE: self._saved.read_value()}

  def _restore_from_tensors(self, restored_tensors):
    tensor = restored_tensors[VALUE]
    self._saved.assign(tensor)
    self._value = self._synced = int(tensor.numpy())
    if self.variable is not None:
      return self.variable.assign(self._value)
    return tf.no_op()

  def _copy_trackable_to_cpu(self, object_map):
    # The host-memory variable's copy: made once, then refreshed in place at each asynchronous save.
    self._saved._copy_trackable_to_cpu(object_map)
    object_map[self] = object_map[self._saved]
