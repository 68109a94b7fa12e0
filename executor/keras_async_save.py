"""Asynchronous checkpoints of Keras 3 variables: a fix for their copy to host memory.

TensorFlow's asynchronous checkpoint copies every variable to host memory
before each save, in a `tf.function` (`AsyncCheckpointHelper._copy_to_cpu`),
by calling `_copy_trackable_to_cpu(object_map)` on each trackable. A Keras 3
variable (TensorFlow backend) does so by creating a new `tf.Variable` every
time. At the first save this runs eagerly and works; at the second it runs
inside the `tf.function`, whose variable creation on a later call is
refused ("tf.function only supports singleton tf.Variables created on the
first call"), so every asynchronous save after the first failed.

The fix maps the Keras variable to the host copy of the `tf.Variable` it
wraps, which TensorFlow creates once and then refreshes in place at each
save: the same values, and no variable created after the first save.
"""

from __future__ import annotations

import functools


@functools.cache
def install() -> None:
  """Replaces the Keras variable's copy to host memory (once per process)."""
  try:
    from keras.src.backend.tensorflow.core import Variable
  except ImportError:  # Another Keras layout: nothing to fix here.
    return

  def _copy_trackable_to_cpu(self, object_map):
    self.value._copy_trackable_to_cpu(object_map)  # Creates the host copy once, then assigns it.
    object_map[self] = object_map[self.value]

  Variable._copy_trackable_to_cpu = _copy_trackable_to_cpu
