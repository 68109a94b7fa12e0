"""Structured data classification (keras.io "structured data classification from scratch" shape).

A frame-like dict of columns, its categorical columns encoded by `StringLookup`/`IntegerLookup` in a
`dataset.map`, its numeric ones normalized by `Normalization` layers adapted on the train split, a custom `Layer`
holding Dense + Dropout, `shuffle(len(df))` without a seed, Adam.
"""

import gin
import keras
import numpy as np
import tensorflow as tf
from keras import layers

NUMERIC = ["age", "trestbps", "chol", "thalach", "oldpeak"]
INT_CATEGORICAL = ["sex", "cp", "fbs", "exang"]
STRING_CATEGORICAL = ["thal"]


def heart_frame(n, seed):
  """A frame-like dict of columns and its labels, generated offline."""
  rng = np.random.default_rng(seed)
  df = {
    "age": rng.integers(29, 77, n).astype("float32"),
    "trestbps": rng.normal(130, 17, n).astype("float32"),
    "chol": rng.normal(246, 51, n).astype("float32"),
    "thalach": rng.normal(150, 23, n).astype("float32"),
    "oldpeak": rng.exponential(1.0, n).astype("float32"),
    "sex": rng.integers(0, 2, n).astype("int64"),
    "cp": rng.integers(0, 5, n).astype("int64"),
    "fbs": rng.integers(0, 2, n).astype("int64"),
    "exang": rng.integers(0, 2, n).astype("int64"),
    "thal": rng.choice(np.array(["fixed", "normal", "reversible"]), n),
  }
  score = (df["age"] - 50) / 10 + df["cp"] - 1.5 + (df["thal"] == "reversible") + rng.normal(0, 1, n)
  return df, (score > 0).astype("int64")


TRAIN = heart_frame(512, 0)
TEST = heart_frame(96, 1)

# Adapted once, on the training set, as the example does (module level).
lookups = {}
for _name in INT_CATEGORICAL:
  lookups[_name] = layers.IntegerLookup(output_mode="one_hot")
  lookups[_name].adapt(TRAIN[0][_name])
for _name in STRING_CATEGORICAL:
  lookups[_name] = layers.StringLookup(output_mode="one_hot")
  lookups[_name].adapt(TRAIN[0][_name])


def encode(features, label):
  out = {k: v for k, v in features.items() if k in NUMERIC}
  for name, lookup in lookups.items():
    out[name] = tf.reshape(lookup(features[name]), [-1])
  return out, label


def dataframe_to_dataset(df, labels):
  ds = tf.data.Dataset.from_tensor_slices((dict(df), labels))
  ds = ds.shuffle(buffer_size=len(labels))
  return ds.map(encode)


@gin.configurable
def heart_data(split):
  return dataframe_to_dataset(*(TRAIN if split == "train" else TEST))


class Block(layers.Layer):
  """A custom layer holding Dense + Dropout."""

  def __init__(self, units, rate, **kwargs):
    super().__init__(**kwargs)
    self.dense = layers.Dense(units, activation="relu")
    self.dropout = layers.Dropout(rate)

  def call(self, x, training=False):
    return self.dropout(self.dense(x), training=training)


@gin.configurable
def heart_model():
  inputs, encoded = {}, []
  for name in NUMERIC:
    inputs[name] = keras.Input(shape=(), name=name)
    norm = layers.Normalization(axis=None)
    norm.adapt(TRAIN[0][name])
    encoded.append(layers.Reshape((1,))(norm(inputs[name])))
  for name, lookup in lookups.items():
    inputs[name] = keras.Input(shape=(lookup.vocabulary_size(),), name=name)
    encoded.append(inputs[name])
  x = layers.concatenate(encoded)
  x = Block(16, 0.5)(x)
  output = layers.Dense(1, activation="sigmoid")(x)
  model = keras.Model(inputs, output)
  model.compile("adam", "binary_crossentropy", metrics=["accuracy"])
  return model
