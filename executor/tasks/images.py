"""An image classifier: a small residual CNN on scikit-learn's bundled handwritten digits.

The data ships with scikit-learn (no download; the `images` extra:
`pip install 'tf-executor[images]'`): 1797 grey 8x8 images of the digits
0-9, pixel values 0..16. A seeded permutation holds out a fixed fraction for
the `test` split.

Augmentation runs on device, inside the train step: each training image is
zero-padded by `crop_padding` pixels and cropped back to 8x8 at a random
offset (a random translation), and optionally flipped left-right (off by
default: a mirrored digit is another glyph). The offsets come from a
`tf.random.Generator` the task owns and checkpoints, so they differ per image
and per step and a resumed run draws the same ones. Static shapes throughout,
so `TrainProgram.jit_compile=True` works.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import gin
import keras
import numpy as np
import tensorflow as tf

from executor import ConfigError, Task, array_dataset

NUM_CLASSES = 10
IMAGE_SIZE = 8


def _sklearn_datasets(owner: str):
  try:
    import sklearn.datasets
  except ImportError as e:
    raise ConfigError(
      f"{owner} needs scikit-learn for its digits data, the 'images' extra: pip install 'tf-executor[images]' "
      f"(or pip install 'scikit-learn>=1.3'); importing it failed: {e}"
    ) from None
  return sklearn.datasets


def load_digits_split(held_out_fraction: float, seed: int, owner: str = "DigitsClassifier"):
  """The digits as ((train images, labels, indices), (test images, labels, indices)).

  Images are float32 [n, 8, 8, 1] scaled to [0, 1]; labels and indices
  (into scikit-learn's order) int32 [n]. The split is a permutation seeded
  by `seed`: the same on every machine.
  """
  digits = _sklearn_datasets(owner).load_digits()
  images = (digits.images.astype(np.float32) / 16.0)[..., None]
  labels = digits.target.astype(np.int32)
  order = np.random.default_rng(seed).permutation(len(labels)).astype(np.int32)
  num_test = int(round(held_out_fraction * len(labels)))
  test, train = np.sort(order[:num_test]), order[num_test:]
  return (images[train], labels[train], train), (images[test], labels[test], test)


def crop(images: tf.Tensor, offsets: tf.Tensor, padding: int) -> tf.Tensor:
  """Each image [h, w, c] zero-padded by `padding` and cropped back to [h, w] at its (row, column) offset.

  Args:
    images: float [b, h, w, c].
    offsets: int32 [b, 2], each in [0, 2 * padding].
    padding: Pixels of zero padding on every side.
  """
  height, width = images.shape[1], images.shape[2]
  padded = tf.pad(images, [[0, 0], [padding, padding], [padding, padding], [0, 0]])
  rows = offsets[:, :1] + tf.range(height)[None, :]
  cols = offsets[:, 1:] + tf.range(width)[None, :]
  out = tf.gather(padded, rows, axis=1, batch_dims=1)
  return tf.gather(out, cols, axis=2, batch_dims=1)


class ResidualBlock(keras.layers.Layer):
  """Pre-activation residual block: x + conv(relu(conv(relu(x)))), both 3x3, same width."""

  def __init__(self, width: int, **kwargs):
    """Creates the two convolutions of `width` channels."""
    super().__init__(**kwargs)
    self.conv1 = keras.layers.Conv2D(width, 3, padding="same", name="conv1")
    self.conv2 = keras.layers.Conv2D(width, 3, padding="same", name="conv2")

  def build(self, input_shape):
    self.conv1.build(input_shape)
    self.conv2.build(input_shape)
    self.built = True

  def call(self, x):
    return x + self.conv2(tf.nn.relu(self.conv1(tf.nn.relu(x))))


def residual_cnn(widths: Sequence[int], blocks_per_stage: int, name: str = "resnet") -> keras.Model:
  """Stem conv, then per stage (the first at full resolution, the next ones at stride 2) residual blocks."""
  inputs = keras.Input((IMAGE_SIZE, IMAGE_SIZE, 1))
  x = keras.layers.Conv2D(widths[0], 3, padding="same", name="stem")(inputs)
  for stage, width in enumerate(widths):
    if stage:
      x = keras.layers.Conv2D(width, 3, strides=2, padding="same", name=f"down_{stage}")(
        keras.layers.ReLU()(x)
      )
    for block in range(blocks_per_stage):
      x = ResidualBlock(width, name=f"stage_{stage}_block_{block}")(x)
  x = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(x))
  return keras.Model(inputs, keras.layers.Dense(NUM_CLASSES, name="logits")(x), name=name)


@gin.configurable
class DigitsClassifier(Task):
  """Classifies scikit-learn's 8x8 digits with a residual CNN.

  Splits: `train` (shuffled, forever, augmented on device), `test` (the
  held-out images). Metrics: `loss`, `accuracy`. The train step's
  per-example outputs hold each image's `crop_offset`; decoding writes the
  top-k classes of each test image with their probabilities.
  """

  splits = ("train", "test")
  serving_inputs = ("image",)  # What an export's serving_default takes: the model's inputs, no label.

  def __init__(
    self,
    widths: Sequence[int] = (32, 64),
    blocks_per_stage: int = 1,
    crop_padding: int = 1,
    flip: bool = False,
    held_out_fraction: float = 0.2,
    top_k: int = 3,
    seed: int = 1,
    **kwargs,
  ):
    """Configures the task; see `Task` for the shared arguments.

    Args:
      widths: Channels of each stage (every stage after the first halves the resolution).
      blocks_per_stage: Residual blocks per stage.
      crop_padding: Pixels of padding of the random crop (0: no translation).
      flip: Also flip training images left-right at random (off: digits are not mirror-symmetric).
      held_out_fraction: Fraction of the images in `test`.
      top_k: Classes per image that decoding writes.
      seed: Seed of the split, the shuffle and the augmentation generator.
      **kwargs: The `Task` arguments (`name`, `global_batch_size`, `optimizer_fn`, ...).

    Raises:
      ConfigError: scikit-learn is missing, or a bad size.
    """
    super().__init__(**kwargs)
    cls = type(self).__name__
    _sklearn_datasets(cls)
    if not widths or blocks_per_stage < 0 or crop_padding < 0:
      raise ConfigError(
        f"{cls}: widths must be non-empty, blocks_per_stage and crop_padding >= 0, got {widths}, "
        f"{blocks_per_stage}, {crop_padding}"
      )
    if not 0 < held_out_fraction < 1:
      raise ConfigError(f"{cls}.held_out_fraction must be in (0, 1), got {held_out_fraction}")
    if not 1 <= top_k <= NUM_CLASSES:
      raise ConfigError(f"{cls}.top_k must be in 1..{NUM_CLASSES}, got {top_k}")
    self.widths, self.blocks_per_stage = tuple(widths), blocks_per_stage
    self.crop_padding, self.flip = crop_padding, flip
    self.held_out_fraction, self.top_k, self.seed = held_out_fraction, top_k, seed
    self.generator: tf.random.Generator | None = None
    self._data = None

  def build(self) -> None:
    self.model = residual_cnn(self.widths, self.blocks_per_stage)
    # The augmentation generator: created here (under the strategy scope) and checkpointed.
    self.generator = tf.random.Generator.from_seed(self.seed)
    super().build()

  def checkpoint_items(self) -> dict[str, Any]:
    items = super().checkpoint_items()
    if self.generator is not None:
      items["augment_generator"] = self.generator
    return items

  def data(self):
    """((train images, labels, indices), (test images, labels, indices)), loaded once."""
    if self._data is None:
      self._data = load_digits_split(self.held_out_fraction, self.seed, type(self).__name__)
    return self._data

  def dataset(
    self, split: str, input_context: tf.distribute.InputContext, start_example: int = 0
  ) -> tf.data.Dataset:
    train = split == "train"
    images, labels, index = self.data()[0 if train else 1]
    arrays = {"image": images, "label": labels, "index": index}
    # Shuffled per epoch and resumable at any example in constant time (executor.array_dataset).
    return array_dataset(arrays, input_context, self.global_batch_size, train, self.seed, start_example)

  # ----- Device -----

  def augment(self, images: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Random crop (and flip, if `flip`) of each image, from the task's generator; returns (images, offsets)."""
    batch = tf.shape(images)[0]
    offsets = self.generator.uniform([batch, 2], 0, 2 * self.crop_padding + 1, dtype=tf.int32)
    images = crop(images, offsets, self.crop_padding) if self.crop_padding else images
    if self.flip:
      flipped = self.generator.uniform([batch], 0, 2, dtype=tf.int32) > 0
      images = tf.where(flipped[:, None, None, None], tf.reverse(images, axis=[2]), images)
    return images, offsets

  def compute_loss(self, batch, training):
    images, per_example = batch["image"], {}
    if training:
      images, offsets = self.augment(images)
      per_example["crop_offset"] = offsets
    logits = tf.cast(self.model(images, training=training), tf.float32)
    labels = batch["label"]
    loss_per_image = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    count = tf.cast(tf.shape(labels)[0], tf.float32)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
    loss = tf.math.divide_no_nan(tf.reduce_sum(loss_per_image), count)
    metrics = {
      "loss": (loss, count),
      "accuracy": (tf.math.divide_no_nan(tf.reduce_sum(correct), count), count),
    }
    return loss, metrics, per_example

  def decode_step(self, batch):
    probabilities = tf.nn.softmax(tf.cast(self.model(batch["image"], training=False), tf.float32))
    top = tf.math.top_k(probabilities, self.top_k)
    return {
      "index": batch["index"],
      "label": batch["label"],
      "classes": top.indices,
      "probabilities": top.values,
    }

  # ----- Host -----

  def postprocess_decode(
    self, per_example: Mapping[str, np.ndarray]
  ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One record per image: its index, label and top-k (class, probability); accuracy and top-k accuracy."""
    records = []
    for index, label, classes, probs in zip(
      per_example["index"], per_example["label"], per_example["classes"], per_example["probabilities"]
    ):
      records.append(
        {
          "index": int(index),
          "label": int(label),
          "top_k": [{"class": int(c), "probability": round(float(p), 5)} for c, p in zip(classes, probs)],
          "correct": bool(classes[0] == label),
        }
      )
    if not records:
      return records, {}
    labels, classes = per_example["label"], per_example["classes"]
    return records, {
      "accuracy": float(np.mean(classes[:, 0] == labels)),
      f"top_{self.top_k}_accuracy": float(np.mean(np.any(classes == labels[:, None], axis=1))),
    }
