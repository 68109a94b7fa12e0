"""Mixed precision (keras.io "mixed precision" guide shape): Dense layers computing in float16, the logits'
softmax in float32 (`Activation('softmax', dtype='float32')`), RMSprop; the policy is the run's
(`Runtime.precision = 'mixed_float16'` in the gin file), with its loss scaling.
"""

import gin
import keras
import numpy as np
from keras import layers


def digits(n, seed):
  """(x, y): noisy 8x8 patterns of 10 classes, flattened to 64 features."""
  patterns = np.random.default_rng(1234).uniform(size=(10, 64))
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 10, n)
  return (patterns[labels] + rng.normal(0, 0.7, (n, 64))).astype("float32"), labels.astype("int64")


@gin.configurable
def digit_data(split):
  return digits(512 if split == "train" else 128, 0 if split == "train" else 1)


@gin.configurable
def digit_mlp(num_units=32):
  inputs = keras.Input(shape=(64,), name="digits")
  x = layers.Dense(num_units, activation="relu", name="dense_1")(inputs)
  x = layers.Dense(num_units, activation="relu", name="dense_2")(x)
  x = layers.Dense(10, name="dense_logits")(x)
  outputs = layers.Activation("softmax", dtype="float32", name="predictions")(x)
  model = keras.Model(inputs=inputs, outputs=outputs)
  model.compile(
    loss="sparse_categorical_crossentropy", optimizer=keras.optimizers.RMSprop(1e-3), metrics=["accuracy"]
  )
  return model
