"""An exponential moving average of weights, updated by the train loop's tail."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import tensorflow as tf


class WeightAverage(tf.Module):
  """Shadow copies of variables that follow them as `s = decay * s + (1 - decay) * v`.

  Created under the strategy scope (so shadows are mirrored like their
  variables); `update` runs once per train loop inside the compiled train
  function; `averaged` swaps the averages in for an evaluation.
  """

  def __init__(self, variables: Sequence[tf.Variable], decay: float):
    """Creates the shadows, initialised to the variables' current values.

    Args:
      variables: The variables to average (the trainable ones).
      decay: Weight of the old average at each update, in [0, 1).
    """
    super().__init__(name="ema")
    if not 0.0 <= decay < 1.0:
      raise ValueError(f"EMA decay must be in [0, 1), got {decay}")
    self.decay = decay
    self._variables = list(variables)
    self.shadows = [
      tf.Variable(tf.convert_to_tensor(v), trainable=False, name=f"ema_{i}")
      for i, v in enumerate(self._variables)
    ]
    self._swap_fn = tf.function(self._swap)

  def update(self) -> None:
    """One averaging step (called in cross-replica context, inside the train loop)."""
    for shadow, v in zip(self.shadows, self._variables):
      shadow.assign(self.decay * shadow + (1.0 - self.decay) * tf.convert_to_tensor(v))

  def _swap(self) -> None:
    for shadow, v in zip(self.shadows, self._variables):
      value = tf.convert_to_tensor(v)
      v.assign(tf.convert_to_tensor(shadow))
      shadow.assign(value)

  @contextlib.contextmanager
  def averaged(self) -> Iterator[None]:
    """Within the block the variables hold their averages; restored after, even on error."""
    self._swap_fn()
    try:
      yield
    finally:
      self._swap_fn()
