"""A GAN (keras.io "DCGAN" shape, tiny): a subclassed `Model` with its own `compile(d_optimizer, g_optimizer,
loss_fn)` and `train_step`, two optimizers, loss trackers and a `SeedGenerator` for the latent vectors.

The data are unlabelled 8x8 images (only `x`, as `image_dataset_from_directory(label_mode=None)` gives them).
keras.io's GAN has no `call`; this one scores images with its discriminator, so that it can be evaluated and
served (`GANNoCall` is keras.io's exact shape, for the refusal test).
"""

import gin
import keras
import numpy as np
import tensorflow as tf
from keras import layers

LATENT_DIM = 8


def blobs(n, seed):
  """8x8 grey images of a bright square at a random place, generated offline."""
  rng = np.random.default_rng(seed)
  images = rng.uniform(0, 0.2, (n, 8, 8, 1)).astype("float32")
  for image, (row, col) in zip(images, rng.integers(0, 5, (n, 2))):
    image[row : row + 3, col : col + 3] += 0.8
  return images


@gin.configurable
def blob_images(split):
  return tf.data.Dataset.from_tensor_slices(
    blobs(256 if split == "train" else 64, 0 if split == "train" else 1)
  )


def discriminator():
  return keras.Sequential(
    [
      keras.Input(shape=(8, 8, 1)),
      layers.Conv2D(8, 3, strides=2, padding="same"),
      layers.LeakyReLU(negative_slope=0.2),
      layers.Flatten(),
      layers.Dropout(0.2),
      layers.Dense(1),
    ],
    name="discriminator",
  )


def generator():
  return keras.Sequential(
    [
      keras.Input(shape=(LATENT_DIM,)),
      layers.Dense(4 * 4 * 8),
      layers.LeakyReLU(negative_slope=0.2),
      layers.Reshape((4, 4, 8)),
      layers.Conv2DTranspose(8, 3, strides=2, padding="same"),
      layers.LeakyReLU(negative_slope=0.2),
      layers.Conv2D(1, 3, padding="same", activation="sigmoid"),
    ],
    name="generator",
  )


class GANNoCall(keras.Model):
  """keras.io's DCGAN, as written there: no `call`."""

  def __init__(self, discriminator, generator, latent_dim):
    super().__init__()
    self.discriminator = discriminator
    self.generator = generator
    self.latent_dim = latent_dim
    self.seed_generator = keras.random.SeedGenerator(1337)

  def compile(self, d_optimizer, g_optimizer, loss_fn):
    super().compile()
    self.d_optimizer = d_optimizer
    self.g_optimizer = g_optimizer
    self.loss_fn = loss_fn
    self.d_loss_metric = keras.metrics.Mean(name="d_loss")
    self.g_loss_metric = keras.metrics.Mean(name="g_loss")

  @property
  def metrics(self):
    return [self.d_loss_metric, self.g_loss_metric]

  def train_step(self, real_images):
    # Sample random points in the latent space and decode them to fake images.
    batch_size = tf.shape(real_images)[0]
    random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
    generated_images = self.generator(random_latent_vectors)
    combined_images = tf.concat([generated_images, real_images], axis=0)
    labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
    labels += 0.05 * keras.random.uniform(
      tf.shape(labels), seed=self.seed_generator
    )  # keras.io's label noise.
    with tf.GradientTape() as tape:
      predictions = self.discriminator(combined_images, training=True)
      d_loss = self.loss_fn(labels, predictions)
    grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
    self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
    # Train the generator (without updating the discriminator's weights).
    random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
    misleading_labels = tf.zeros((batch_size, 1))
    with tf.GradientTape() as tape:
      predictions = self.discriminator(self.generator(random_latent_vectors), training=True)
      g_loss = self.loss_fn(misleading_labels, predictions)
    grads = tape.gradient(g_loss, self.generator.trainable_weights)
    self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
    self.d_loss_metric.update_state(d_loss)
    self.g_loss_metric.update_state(g_loss)
    return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}


class GAN(GANNoCall):
  """The same, scoring images with its discriminator (so that it evaluates and serves)."""

  def call(self, images, training=False):
    return self.discriminator(images, training=training)

  def test_step(self, real_images):
    batch_size = tf.shape(real_images)[0]
    real_loss = self.loss_fn(tf.zeros((batch_size, 1)), self(real_images))
    self.d_loss_metric.update_state(real_loss)
    return {"d_loss": self.d_loss_metric.result()}


def _compiled(gan):
  gan.compile(
    d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
    g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
    loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
  )
  return gan


@gin.configurable
def blob_gan():
  return _compiled(GAN(discriminator(), generator(), LATENT_DIM))


@gin.configurable
def blob_gan_without_call():
  return _compiled(GANNoCall(discriminator(), generator(), LATENT_DIM))
