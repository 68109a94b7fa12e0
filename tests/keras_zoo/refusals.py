"""What users of the zoo's models also write, which `KerasTask` cannot run as `fit` does (the refusal tests)."""

import gin
import keras
import numpy as np
import tensorflow as tf

from keras_zoo import imbalanced, timeseries


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
