"""A Keras example for `KerasTask`: a compiled MLP tells apart noisy 8x8 "digits" (synthetic, no download).

Each of the 10 classes is a fixed random 8x8 pattern; an example is its class's pattern plus Gaussian noise.
The model is compiled as a Keras user would, with a loss, metrics (accuracy, and AUC, a stateful metric) and an
optimizer; `gin/keras_digits.gin` runs it with train, eval and decode programs and no step code.
"""

from __future__ import annotations

import gin
import keras
import numpy as np

NUM_CLASSES = 10


def make_digits(num_examples: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(images float32 [n, 64], one-hot labels float32 [n, 10]); the class patterns are the same for any seed."""
  patterns = np.random.default_rng(1234).uniform(0.0, 1.0, size=(NUM_CLASSES, 64))
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, NUM_CLASSES, size=num_examples)
  images = patterns[labels] + rng.normal(scale=noise, size=(num_examples, 64))
  return images.astype(np.float32), np.eye(NUM_CLASSES, dtype=np.float32)[labels]


@gin.configurable
def digits_data(split: str, num_train: int = 4000, num_test: int = 1000, noise: float = 1.0):
  """The examples of `split` ('train' or 'test') as a tuple of arrays, for `KerasTask.dataset_fn`."""
  if split == "train":
    return make_digits(num_train, noise, seed=1)
  return make_digits(num_test, noise, seed=2)


@gin.configurable
def digits_mlp(hidden_size: int = 64, learning_rate: float = 1e-3) -> keras.Model:
  """An MLP compiled with categorical cross-entropy, accuracy and AUC, and Adam."""
  model = keras.Sequential(
    [
      keras.Input((64,)),
      keras.layers.Dense(hidden_size, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-4)),
      keras.layers.Dense(NUM_CLASSES, activation="softmax"),
    ],
    name="digits_mlp",
  )
  model.compile(
    optimizer=keras.optimizers.Adam(learning_rate),
    loss="categorical_crossentropy",
    metrics=["accuracy", keras.metrics.AUC(name="auc")],
  )
  return model
