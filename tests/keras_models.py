"""Small Keras models as users write them (keras.io style), with their data, for the KerasTask tests.

Each `*_model` builds and compiles a model; each `*_data(split)` returns a split's examples, unbatched, in a fixed
order (the tests turn shuffling off so that `fit` and the executor read the same batches). Registered with gin for
the resume tests.
"""

import os
import time

import gin
import keras
import numpy as np
import tensorflow as tf
from keras import layers

from executor.actions import Action

NUM = 512  # Examples per split: 16 batches of 32.


def _rng(split):
  return np.random.default_rng(0 if split == "train" else 1)


# ----- Two outputs: losses, loss_weights, metrics, weighted_metrics, sample weights, Dropout -----------------


@gin.configurable
def two_heads_data(split, sample_weights=True):
  rng = _rng(split)
  x = rng.normal(size=(NUM, 8)).astype("float32")
  y = {
    "kind": (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5).astype("int64"),
    "size": (x[:, :1] * 2 + rng.normal(size=(NUM, 1))).astype("float32"),
  }
  weights = rng.uniform(0.5, 2.0, NUM).astype("float32")
  return tf.data.Dataset.from_tensor_slices((x, y, weights) if sample_weights else (x, y))


@gin.configurable
def two_heads_model():
  inputs = keras.Input((8,), name="x")
  hidden = layers.Dense(16, activation="relu")(inputs)
  hidden = layers.Dropout(0.25)(hidden)
  kind = layers.Dense(3, activation="softmax", name="kind")(hidden)
  size = layers.Dense(1, name="size")(hidden)
  model = keras.Model(inputs, {"kind": kind, "size": size})
  model.compile(
    optimizer=keras.optimizers.Adam(0.01),
    loss={"kind": "sparse_categorical_crossentropy", "size": "mse"},
    loss_weights={"kind": 1.0, "size": 0.5},
    metrics={"kind": ["accuracy"], "size": ["mae"]},
    weighted_metrics={"kind": [keras.metrics.SparseCategoricalAccuracy(name="weighted_acc")]},
  )
  return model


# ----- One output, for class_weight: sparse or one-hot labels ----------------------------------------------


@gin.configurable
def classes_data(split, one_hot=False):
  rng = _rng(split)
  x = rng.normal(size=(NUM, 6)).astype("float32")
  labels = np.digitize(x[:, 0] + 0.3 * x[:, 1], [-0.8, 0.9])  # Three classes, unbalanced.
  y = np.eye(3, dtype="float32")[labels] if one_hot else labels.astype("int64")
  return tf.data.Dataset.from_tensor_slices((x, y))


@gin.configurable
def classes_model(one_hot=False):
  model = keras.Sequential(
    [keras.Input((6,)), layers.Dense(12, activation="relu"), layers.Dense(3, "softmax")]
  )
  loss = "categorical_crossentropy" if one_hot else "sparse_categorical_crossentropy"
  metric = keras.metrics.CategoricalAccuracy if one_hot else keras.metrics.SparseCategoricalAccuracy
  model.compile(keras.optimizers.SGD(0.1), loss, metrics=["accuracy"], weighted_metrics=[metric(name="wacc")])
  return model


# ----- A GAN: its own compile, train_step, two optimizers, trackers, a SeedGenerator -------------------------


class GAN(keras.Model):
  """The keras.io DCGAN's shape on 4 features: `compile(d_optimizer, g_optimizer, loss_fn)`, its own train_step."""

  def __init__(self, latent=2, **kwargs):
    super().__init__(**kwargs)
    self.latent = latent
    self.discriminator = keras.Sequential(
      [keras.Input((4,)), layers.Dense(8, activation="relu"), layers.Dense(1)], name="discriminator"
    )
    self.generator = keras.Sequential(
      [keras.Input((latent,)), layers.Dense(8, activation="relu"), layers.Dense(4)], name="generator"
    )
    self.seed_generator = keras.random.SeedGenerator(1337)
    self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
    self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

  def call(self, x):
    return self.discriminator(x)

  @property
  def metrics(self):
    return [self.d_loss_tracker, self.g_loss_tracker]

  def compile(self, d_optimizer, g_optimizer, loss_fn):
    super().compile()
    self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

  def train_step(self, real):
    n = tf.shape(real)[0]
    fake = self.generator(keras.random.normal((n, self.latent), seed=self.seed_generator))
    labels = tf.concat([tf.ones((n, 1)), tf.zeros((n, 1))], 0)
    with tf.GradientTape() as tape:
      d_loss = self.loss_fn(labels, self.discriminator(tf.concat([fake, real], 0)))
    grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
    self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
    noise = keras.random.normal((n, self.latent), seed=self.seed_generator)
    with tf.GradientTape() as tape:
      g_loss = self.loss_fn(tf.zeros((n, 1)), self.discriminator(self.generator(noise)))
    grads = tape.gradient(g_loss, self.generator.trainable_weights)
    self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
    self.d_loss_tracker.update_state(d_loss)
    self.g_loss_tracker.update_state(g_loss)
    return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


@gin.configurable
def gan_data(split):
  return tf.data.Dataset.from_tensor_slices(_rng(split).normal(1.0, 0.5, size=(NUM, 4)).astype("float32"))


@gin.configurable
def gan_model(d_optimizer=None):
  model = GAN()
  model.compile(
    d_optimizer=d_optimizer or keras.optimizers.Adam(0.003),
    g_optimizer=keras.optimizers.Adam(0.001),
    loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
  )
  return model


# ----- Its own train_step and test_step over the compiled loss, and trackers of its own ------------------------


class Regressor(keras.Model):
  """Overrides train_step and test_step as the keras.io "customizing fit" guide does, with a tracker of its own."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.hidden = layers.Dense(8, activation="relu")
    self.out = layers.Dense(1)
    self.abs_error = keras.metrics.MeanAbsoluteError(name="abs_error")

  def call(self, x):
    return self.out(self.hidden(x))

  def train_step(self, data):
    x, y = data
    with tf.GradientTape() as tape:
      y_pred = self(x, training=True)
      loss = self.compute_loss(y=y, y_pred=y_pred)
    grads = tape.gradient(loss, self.trainable_variables)
    self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
    for metric in self.metrics:
      if metric.name == "loss":
        metric.update_state(loss)
      else:
        metric.update_state(y, y_pred)
    return {m.name: m.result() for m in self.metrics}

  def test_step(self, data):
    x, y = data
    y_pred = self(x, training=False)
    self.abs_error.update_state(y, y_pred)
    return {"abs_error": self.abs_error.result()}


@gin.configurable
def regressor_data(split):
  rng = _rng(split)
  x = rng.normal(size=(NUM, 5)).astype("float32")
  y = (x @ np.arange(1, 6, dtype="float32")[:, None] / 5 + 0.1 * rng.normal(size=(NUM, 1))).astype("float32")
  return tf.data.Dataset.from_tensor_slices((x, y))


@gin.configurable
def regressor_model():
  model = Regressor()
  model.compile(keras.optimizers.Adam(0.01), loss="mse", metrics=["mse"])
  return model


# ----- Preprocessing layers adapted in model_fn ------------------------------------------------------------

_CITIES = np.array(["paris", "rome", "oslo", "lima", "kyiv", "quito"])


_TAGS = np.array(["red fast", "blue slow", "red slow old", "green", "blue fast new", "old"])


@gin.configurable
def table_data(split, cities=_CITIES):
  rng = _rng(split)
  age = rng.uniform(18, 80, NUM).astype("float32")
  city = rng.choice(cities, NUM, p=np.linspace(1, 2, len(cities)) / np.linspace(1, 2, len(cities)).sum())
  rooms = rng.integers(1, 6, NUM).astype("int64")
  tags = rng.choice(_TAGS, NUM)
  label = ((age > 45).astype("int64") + (city == cities[0]) + (rooms > 3) + np.char.find(tags, "red") + 1) > 1
  features = {"age": age, "city": city, "rooms": rooms, "tags": tags}
  return tf.data.Dataset.from_tensor_slices((features, label.astype("float32")))


@gin.configurable
def table_model(adapt_first=None, city_vocabulary=None):
  """Normalization, Discretization, StringLookup, IntegerLookup and TextVectorization adapted on the train split, as
  keras.io's structured-data examples do; `adapt_first`: adapted on that many examples only (other vocabularies,
  other bins); `city_vocabulary`: the city lookup is given this vocabulary instead."""
  features = {k: np.asarray(v) for k, v in next(iter(table_data("train").batch(NUM)))[0].items()}
  if adapt_first:
    features = {k: v[:adapt_first] for k, v in features.items()}
  inputs = {
    "age": keras.Input((), name="age"),
    "city": keras.Input((), name="city", dtype="string"),
    "rooms": keras.Input((), name="rooms", dtype="int64"),
    "tags": keras.Input((), name="tags", dtype="string"),
  }
  norm, bins = layers.Normalization(axis=None), layers.Discretization(num_bins=4, output_mode="one_hot")
  norm.adapt(features["age"])
  bins.adapt(features["age"])
  city = layers.StringLookup(vocabulary=city_vocabulary, output_mode="one_hot")
  if city_vocabulary is None:
    city.adapt(features["city"])
  rooms = layers.IntegerLookup(output_mode="one_hot")
  rooms.adapt(features["rooms"])
  tags = layers.TextVectorization(max_tokens=10, output_mode="tf_idf")
  tags.adapt(features["tags"])
  parts = [layers.Reshape((1,))(norm(inputs["age"])), bins(inputs["age"])]
  parts += [city(inputs["city"]), rooms(inputs["rooms"]), tags(inputs["tags"])]
  hidden = layers.Dense(8, activation="relu")(layers.concatenate(parts))
  model = keras.Model(inputs, layers.Dense(1, activation="sigmoid")(hidden))
  model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=["accuracy"])
  return model


# ----- Keras RNG in nested layers: Dropout, GaussianNoise, RandomFlip, SeedGenerators made in __init__ and build


class Jitter(layers.Layer):
  """Adds noise from a SeedGenerator made in `__init__` and one made in `build`, and holds a Dropout."""

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.early = keras.random.SeedGenerator(11)
    self.dropout = layers.Dropout(0.2)

  def build(self, input_shape):
    self.late = keras.random.SeedGenerator(12)
    self.noise = layers.GaussianNoise(0.1)

  def call(self, x, training=False):
    if training:
      shape = tf.shape(x)
      x = (
        x
        + 0.05 * keras.random.normal(shape, seed=self.early)
        + 0.05 * keras.random.uniform(shape, seed=self.late)
      )
    return self.noise(self.dropout(x, training=training), training=training)


class Block(layers.Layer):
  """A Dense and a Jitter: the Jitter's generators sit two levels down in the model."""

  def __init__(self, units, **kwargs):
    super().__init__(**kwargs)
    self.dense = layers.Dense(units, activation="relu")
    self.jitter = Jitter()

  def call(self, x, training=False):
    return self.jitter(self.dense(x), training=training)


@gin.configurable
def noisy_data(split):
  rng = _rng(split)
  images = rng.uniform(size=(NUM, 4, 4, 1)).astype("float32")
  labels = (images[:, :2].mean(axis=(1, 2, 3)) > images[:, 2:].mean(axis=(1, 2, 3))).astype("int64")
  return tf.data.Dataset.from_tensor_slices((images, labels))


@gin.configurable
def noisy_model():
  inputs = keras.Input((4, 4, 1))
  x = layers.RandomFlip("horizontal", seed=5)(inputs)
  x = layers.Flatten()(x)
  x = Block(8)(x)
  model = keras.Model(inputs, layers.Dense(2, activation="softmax")(x))
  model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy", metrics=["accuracy"])
  return model


# ----- A hold for the kill -9 test --------------------------------------------------------------------------


@gin.configurable
class HoldAfterStep(Action):
  """After the first train loop that reaches `step`, writes `marker` and waits (up to 120 s) to be killed.

  The test kills the process once the marker exists: at a known point, with no race against the run.
  """

  def __init__(self, step: int, marker: str):
    self.step, self.marker = step, marker

  def after_train_loop(self, result):
    if result.step < self.step or os.path.exists(self.marker):
      return
    with open(self.marker, "w") as f:
      f.write(str(result.step))
    time.sleep(120)
