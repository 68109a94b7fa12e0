"""`AugmentedImages`: a bench-only task whose input map does real work (PNG decode, random crop and flip).

Used by `bench/resume.py` (with `bench/augment.gin`) to measure restart time
on a pipeline heavier than the quickstart's in-memory points: each train
example is a PNG string decoded by `tf.io.decode_png`, then cropped and
flipped with stateless random ops seeded by the example's index, so that the
data is the same on every run (exact resume needs deterministic data).
"""

from __future__ import annotations

import gin
import keras
import numpy as np
import tensorflow as tf

from programs.core.task import Task


def make_images(num_images: int, size: int, num_classes: int, seed: int) -> tuple[list[bytes], np.ndarray]:
  """PNG-encoded RGB noise images, each with a brighter band whose position is its label."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, size=num_images).astype(np.int32)
  images = rng.integers(0, 128, size=(num_images, size, size, 3), dtype=np.uint8)
  band = size // num_classes
  for image, label in zip(images, labels):
    image[label * band : (label + 1) * band] += 100
  return [tf.io.encode_png(image).numpy() for image in images], labels


@gin.configurable
class AugmentedImages(Task):
  """Classifies noise images by the position of a bright band, through a decode + augment input map.

  Splits: `train` (the images repeated forever, each pass cropped and flipped
  anew), `test` (the images center-cropped, once).
  """

  splits = ("train", "test")

  def __init__(
    self,
    num_images: int = 512,
    image_size: int = 32,
    crop_size: int = 28,
    num_classes: int = 4,
    seed: int = 1,
    **kwargs,
  ):
    """Configures the task; see `Task` for the shared arguments.

    Args:
      num_images: Distinct images held (PNG-encoded) in memory.
      image_size: Height and width of each image.
      crop_size: Height and width of the random (train) or central (test) crop.
      num_classes: Classes, hence bands.
      seed: Seed of the images and of the augmentation.
      **kwargs: `Task` arguments (name, global_batch_size, optimizer_fn, ...).
    """
    super().__init__(**kwargs)
    self.num_images, self.image_size, self.crop_size = num_images, image_size, crop_size
    self.num_classes, self.seed = num_classes, seed

  def build(self) -> None:
    self.model = keras.Sequential(
      [
        keras.Input((self.crop_size, self.crop_size, 3)),
        keras.layers.Conv2D(8, 3, strides=2, activation="relu", name="conv"),
        keras.layers.Flatten(),
        keras.layers.Dense(self.num_classes, name="logits"),
      ],
      name="augmented_images",
    )
    super().build()

  def _augment(self, index: tf.Tensor, png: tf.Tensor, label: tf.Tensor) -> dict[str, tf.Tensor]:
    seed = tf.stack([tf.constant(self.seed, tf.int64), index])
    image = tf.io.decode_png(png, channels=3)
    image = tf.image.stateless_random_crop(image, [self.crop_size, self.crop_size, 3], seed=seed)
    image = tf.image.stateless_random_flip_left_right(image, seed=seed + 1)
    return {"image": tf.image.convert_image_dtype(image, tf.float32), "label": label}

  def _center(self, png: tf.Tensor, label: tf.Tensor) -> dict[str, tf.Tensor]:
    offset = (self.image_size - self.crop_size) // 2
    image = tf.image.crop_to_bounding_box(
      tf.io.decode_png(png, channels=3), offset, offset, self.crop_size, self.crop_size
    )
    return {"image": tf.image.convert_image_dtype(image, tf.float32), "label": label}

  def dataset(
    self, split: str, input_context: tf.distribute.InputContext, start_example: int = 0
  ) -> tf.data.Dataset:
    pngs, labels = make_images(self.num_images, self.image_size, self.num_classes, self.seed)
    batch = input_context.get_per_replica_batch_size(self.global_batch_size)
    if split != "train":
      ds = tf.data.Dataset.from_tensor_slices((pngs, labels))
      ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
      return ds.map(self._center, num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(tf.data.AUTOTUNE)
    # Index-based: position k of this pipeline's stream is example (id + k * pipelines) mod n, so a resumed run
    # opens at any position in constant time (see programs/core/data.py).
    pngs, labels = tf.constant(pngs), tf.constant(labels)
    pipelines, pipeline = input_context.num_input_pipelines, input_context.input_pipeline_id

    def example(k):
      i = (pipeline + pipelines * k) % self.num_images
      return self._augment(k, pngs[i], labels[i])

    ds = tf.data.Dataset.counter(start_example).map(example, num_parallel_calls=tf.data.AUTOTUNE)
    return ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

  def compute_loss(self, batch, training):
    logits = self.model(batch["image"], training=training)
    labels = batch["label"]
    loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
    count = tf.cast(tf.shape(labels)[0], tf.float32)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
    return loss, {"loss": (loss, count), "accuracy": (tf.reduce_mean(correct), count)}, {}
