"""Time series forecasting (keras.io "timeseries weather forecasting" shape).

Windows of a multivariate series from `keras.utils.timeseries_dataset_from_array` (unbatched:
`batch_size=None`, as `KerasTask` batches), an LSTM, Adam with a learning-rate schedule; the keras.io
callbacks (`EarlyStopping` and `ModelCheckpoint` on `val_loss`) are bound in the gin file.
"""

import gin
import keras
import numpy as np
from keras import layers

SEQUENCE_LENGTH = 12
DELAY = 3  # Predict feature 0, this many steps after a window's end.


def weather(n, seed):
  """(n, 3) float32 series: two noisy seasonal signals and one that follows the first with a lag."""
  rng = np.random.default_rng(seed)
  t = np.arange(n)
  temperature = np.sin(2 * np.pi * t / 24) + 0.3 * np.sin(2 * np.pi * t / 97) + rng.normal(0, 0.1, n)
  pressure = np.cos(2 * np.pi * t / 50) + rng.normal(0, 0.1, n)
  humidity = np.roll(temperature, 5) * 0.5 + rng.normal(0, 0.1, n)
  series = np.stack([temperature, pressure, humidity], axis=1).astype("float32")
  return (series - series.mean(0)) / series.std(0)


@gin.configurable
def weather_windows(split):
  series = weather(600 if split == "train" else 160, 0 if split == "train" else 1)
  return keras.utils.timeseries_dataset_from_array(
    series[:-DELAY],
    series[SEQUENCE_LENGTH + DELAY - 1 :, :1],
    sequence_length=SEQUENCE_LENGTH,
    batch_size=None,
  )


@gin.configurable
def weather_lstm(learning_rate=0.01):
  inputs = keras.Input(shape=(SEQUENCE_LENGTH, 3), name="window")
  lstm_out = layers.LSTM(16)(inputs)
  outputs = layers.Dense(1, name="temperature")(lstm_out)
  model = keras.Model(inputs=inputs, outputs=outputs)
  schedule = keras.optimizers.schedules.ExponentialDecay(learning_rate, decay_steps=10, decay_rate=0.8)
  model.compile(optimizer=keras.optimizers.Adam(learning_rate=schedule), loss="mse", metrics=["mae"])
  return model
