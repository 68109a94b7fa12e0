"""Imbalanced classification (keras.io "imbalanced classification: credit card fraud detection" shape).

Features normalized with the train split's mean and std in numpy, a Dense/Dropout stack with a sigmoid,
confusion-matrix metrics, and `class_weight` from the class counts (bound in the gin file as
`KerasTask.class_weight = @fraud_class_weight()`), with keras.io's `ModelCheckpoint` callback.
"""

import gin
import keras
import numpy as np
from keras import layers

NUM_FEATURES = 12


def transactions(n, seed):
  """(features, targets): about 4% frauds, which differ from the rest in a few features."""
  rng = np.random.default_rng(seed)
  targets = (rng.uniform(size=n) < 0.04).astype("int64")
  features = rng.normal(0, 1, (n, NUM_FEATURES))
  features[:, :3] += targets[:, None] * rng.normal(1.5, 0.5, (n, 3))
  features[:, 5] *= 100  # An amount, on another scale.
  return features.astype("float32"), targets[:, None]


TRAIN = transactions(1024, 0)
TEST = transactions(256, 1)
MEAN, STD = TRAIN[0].mean(axis=0), TRAIN[0].std(axis=0)


@gin.configurable
def fraud_data(split):
  features, targets = TRAIN if split == "train" else TEST
  return (features - MEAN) / STD, targets


@gin.configurable
def fraud_class_weight():
  counts = np.bincount(TRAIN[1][:, 0])
  return {0: 1.0 / counts[0], 1: 1.0 / counts[1]}


@gin.configurable
def fraud_model():
  model = keras.Sequential(
    [
      keras.Input(shape=(NUM_FEATURES,), name="features"),
      layers.Dense(32, activation="relu"),
      layers.Dense(32, activation="relu"),
      layers.Dropout(0.3),
      layers.Dense(1, activation="sigmoid", name="fraud"),
    ]
  )
  metrics = [
    keras.metrics.FalseNegatives(name="fn"),
    keras.metrics.FalsePositives(name="fp"),
    keras.metrics.TrueNegatives(name="tn"),
    keras.metrics.TruePositives(name="tp"),
    keras.metrics.Precision(name="precision"),
    keras.metrics.Recall(name="recall"),
  ]
  model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=metrics)
  return model
