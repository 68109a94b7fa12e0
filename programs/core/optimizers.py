"""Keras optimizers and learning-rate schedules, made configurable in gin.

Bind a task's optimizer as a factory, e.g.
  MyTask.optimizer_fn = @keras.optimizers.Adam
  keras.optimizers.Adam.learning_rate = 1e-3
"""

import gin
import keras

for _cls in (
  keras.optimizers.SGD,
  keras.optimizers.Adam,
  keras.optimizers.AdamW,
  keras.optimizers.Adafactor,
  keras.optimizers.RMSprop,
):
  gin.external_configurable(_cls, module="keras.optimizers")

for _cls in (
  keras.optimizers.schedules.CosineDecay,
  keras.optimizers.schedules.ExponentialDecay,
  keras.optimizers.schedules.PiecewiseConstantDecay,
  keras.optimizers.schedules.PolynomialDecay,
):
  gin.external_configurable(_cls, module="keras.optimizers.schedules")
