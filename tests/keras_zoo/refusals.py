"""What users of the zoo's models also write, which `KerasTask` cannot run as `fit` does (the refusal tests)."""

import gin
import keras
import numpy as np
import tensorflow as tf

from keras_zoo import gan, imbalanced, timeseries


@gin.configurable
def batched_weather_windows(split):
  """The windows as keras.io makes them for `fit`: batched by `timeseries_dataset_from_array`."""
  series = timeseries.weather(600 if split == "train" else 160, 0 if split == "train" else 1)
  return keras.utils.timeseries_dataset_from_array(
    series[: -timeseries.DELAY],
    series[timeseries.SEQUENCE_LENGTH + timeseries.DELAY - 1 :, :1],
    sequence_length=timeseries.SEQUENCE_LENGTH,
    batch_size=256,
  )


@gin.configurable
def halve_every_epoch(epoch, lr):
  """A `LearningRateScheduler` function of the epoch, as keras.io writes them."""
  return lr if epoch < 1 else lr * 0.5


@gin.configurable
def weighted_fraud_data(split):
  """The fraud examples with a sample weight each (recent transactions count more)."""
  features, targets = imbalanced.fraud_data(split)
  weights = np.linspace(0.5, 1.5, len(targets)).astype("float32")
  return tf.data.Dataset.from_tensor_slices((features, targets, weights))


@gin.configurable
def heart_model_compiled_for_speed():
  """The structured model compiled as a user tuning `fit`'s speed compiles it."""
  from keras_zoo import structured

  model = structured.heart_model()
  model.compile("adam", "binary_crossentropy", metrics=["accuracy"], steps_per_execution=32, jit_compile=True)
  return model


class TFRandomGAN(gan.GAN):
  """keras.io's TF2-era DCGAN: the label noise of its `train_step` from an unseeded `tf.random.uniform`, a
  stateful op whose position in its random stream no checkpoint holds."""

  def train_step(self, real_images):
    batch_size = tf.shape(real_images)[0]
    noise = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
    combined_images = tf.concat([self.generator(noise), real_images], axis=0)
    labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
    labels += 0.05 * tf.random.uniform(tf.shape(labels))
    with tf.GradientTape() as tape:
      d_loss = self.loss_fn(labels, self.discriminator(combined_images, training=True))
    grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
    self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
    self.d_loss_metric.update_state(d_loss)
    return {"d_loss": self.d_loss_metric.result()}


@gin.configurable
def tf_random_gan():
  return gan._compiled(TFRandomGAN(gan.discriminator(), gan.generator(), gan.LATENT_DIM))
