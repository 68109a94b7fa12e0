"""A small conv net with augmentation layers inside the model (keras.io "image classification from scratch"
shape): `RandomFlip`, `RandomRotation` and `RandomZoom` in a `data_augmentation` Sequential, then rescaling,
convolutions, pooling, Dropout and a softmax. The examples are numpy arrays.
"""

import gin
import keras
import numpy as np
from keras import layers

NUM_CLASSES = 3
SIZE = 12


def shapes(n, seed):
  """(images, labels): noisy 12x12 RGB images of a horizontal bar, a vertical bar or a cross, values 0-255."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, NUM_CLASSES, n)
  images = rng.uniform(0, 60, (n, SIZE, SIZE, 3))
  for image, label, (a, b) in zip(images, labels, rng.integers(3, SIZE - 3, (n, 2))):
    if label in (0, 2):
      image[a - 1 : a + 1, 2:-2] += 180
    if label in (1, 2):
      image[2:-2, b - 1 : b + 1] += 180
  return images.astype("float32"), labels.astype("int64")


@gin.configurable
def shape_images(split):
  return shapes(384 if split == "train" else 96, 0 if split == "train" else 1)


@gin.configurable
def shape_classifier():
  data_augmentation = keras.Sequential(
    [layers.RandomFlip("horizontal"), layers.RandomRotation(0.1), layers.RandomZoom(0.1)],
    name="data_augmentation",
  )
  inputs = keras.Input(shape=(SIZE, SIZE, 3), name="image")
  x = data_augmentation(inputs)
  x = layers.Rescaling(1.0 / 255)(x)
  x = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
  x = layers.MaxPooling2D()(x)
  x = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
  x = layers.GlobalAveragePooling2D()(x)
  x = layers.Dropout(0.25)(x)
  outputs = layers.Dense(NUM_CLASSES, activation="softmax", name="label")(x)
  model = keras.Model(inputs, outputs)
  model.compile(
    optimizer=keras.optimizers.Adam(3e-3),
    loss="sparse_categorical_crossentropy",
    metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top2")],
  )
  return model
