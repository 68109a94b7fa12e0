"""`class_weight` as `fit` takes it: checked, refused where `fit` refuses it, turned into per-example weights."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from programs.core.errors import ConfigError


def check_class_weight(class_weight: Mapping[int, float] | None) -> dict[int, float] | None:
  """`{class index: weight}` as plain ints and floats, or None; a ConfigError naming `KerasTask.class_weight`."""
  if class_weight is None:
    return None
  if not isinstance(class_weight, Mapping) or not class_weight:
    raise ConfigError(f"KerasTask.class_weight must be a dict {{class index: weight}}, got {class_weight!r}")
  for key, value in class_weight.items():
    if isinstance(key, bool) or not isinstance(key, (int, np.integer)) or key < 0:
      raise ConfigError(f"KerasTask.class_weight: class {key!r} is not a class index (an integer >= 0)")
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not np.isfinite(value):
      raise ConfigError(
        f"KerasTask.class_weight: the weight of class {key} must be a finite number, got {value!r}"
      )
  return {int(k): float(v) for k, v in class_weight.items()}


def class_sample_weights(y: tf.Tensor, class_weight: Mapping[int, float]) -> tf.Tensor:
  """Per-example weights of a batch of labels, as `fit(class_weight=...)` makes them.

  The class is the label itself (rounded), or the argmax of a one-hot or probability label (its last axis
  longer than 1); a class `class_weight` does not list weighs 1.
  """
  table = tf.constant([class_weight.get(c, 1.0) for c in range(max(class_weight) + 1)], tf.float32)
  if y.shape.rank >= 2 and y.shape[-1] != 1:
    classes = tf.argmax(y, axis=-1, output_type=tf.int32)
  else:
    labels = tf.squeeze(y, axis=-1) if y.shape.rank >= 2 else y
    classes = tf.cast(tf.round(tf.cast(labels, tf.float32)), tf.int32)
  size = int(table.shape[0])
  listed = tf.logical_and(classes >= 0, classes < size)
  return tf.where(listed, tf.gather(table, tf.clip_by_value(classes, 0, size - 1)), 1.0)


def check_class_weight_fits(spec: Any, task: str, split: str) -> None:
  """Refuses `class_weight` where `fit` refuses it: labels of several outputs, or sample weights in the data.

  Args:
    spec: The element spec of the train split's batches, `(x, y)` or `(x, y, sample_weight)`.
    task: Names the task in messages.
    split: The train split's name.
  """
  _, y, sample_weight = keras.utils.unpack_x_y_sample_weight(spec)
  where = f"{task}: class_weight"
  if y is None or tf.nest.is_nested(y):
    raise ConfigError(
      f"{where} is for a model with one output (fit refuses it too), but the examples of split "
      f"'{split}' have {'no labels' if y is None else 'several'}: give per-example weights as the "
      "third element of the examples (x, y, sample_weight), with one weight per output if they differ"
    )
  if sample_weight is not None:
    raise ConfigError(
      f"{where} and the sample weights of split '{split}' (its examples' third element) cannot both "
      "be used (fit refuses them too): multiply the class weights into the sample weights in dataset_fn"
    )
