"""Helpers the resume tests load into executor subprocesses through gin."""

import sys
import time

import gin
import keras
import tensorflow as tf

from executor.actions import Action
from executor.checkpoints import Checkpointer


@gin.configurable
class PausingCheckpointer(Checkpointer):
  """Pauses inside the write of one checkpoint, after its files are complete and
  before the latest-checkpoint pointer moves, so a test can kill it there."""

  def __init__(self, pause_at_step: int = -1, **kwargs):
    super().__init__(**kwargs)
    self.pause_at_step = pause_at_step

  def _save_options(self):
    options = super()._save_options()

    def pause(save_path):
      if save_path.endswith(f"-{self.pause_at_step}"):
        print(f"PAUSED_IN_SAVE {save_path}", file=sys.stderr, flush=True)
        time.sleep(60)

    return tf.train.CheckpointOptions(enable_async=options.enable_async, experimental_write_callbacks=[pause])


@gin.configurable
class PacedLoops(Action):
  """Sleeps after every train loop, so that a run outlasts a kill drawn at a random delay after a log line.

  Host-side only: the run's state (weights, counters, checkpoints) is the same as without it.
  """

  def __init__(self, seconds: float = 0.3):
    self.seconds = seconds

  def after_train_loop(self, result):
    time.sleep(self.seconds)


@gin.configurable
class RsqrtDecay(keras.optimizers.schedules.LearningRateSchedule):
  """A user's own schedule (Keras has no rsqrt decay): linear warmup to `peak`, then `peak * sqrt(warmup / step)`."""

  def __init__(self, peak: float = 0.01, warmup_steps: int = 4):
    self.peak, self.warmup_steps = peak, warmup_steps

  def __call__(self, step):
    ratio = (tf.cast(step, tf.float32) + 1.0) / self.warmup_steps
    return self.peak * tf.minimum(ratio, tf.math.rsqrt(ratio))

  def get_config(self):
    return {"peak": self.peak, "warmup_steps": self.warmup_steps}


def _spirals():
  from executor.tasks.spirals import SpiralsClassifier

  return SpiralsClassifier


@gin.configurable
class ShuffledSpirals(_spirals()):
  """Spirals read the plain tf.data way, `from_tensor_slices().shuffle().batch()`: its `dataset` takes no
  `start_example`, so it resumes from the saved iterator state."""

  def dataset(self, split, input_context):
    per_replica = input_context.get_per_replica_batch_size(self.global_batch_size)
    ds = tf.data.Dataset.from_tensor_slices(self.arrays(split))
    if split == "train":
      ds = ds.shuffle(512, seed=self.seed).repeat()
    return ds.batch(per_replica, drop_remainder=split == "train")


@gin.configurable
class GeneratedSpirals(_spirals()):
  """Spirals from a Python generator: tf.data cannot save its iterator, so it resumes by replay."""

  def dataset(self, split, input_context):
    per_replica = input_context.get_per_replica_batch_size(self.global_batch_size)
    arrays = self.arrays(split)

    def points():
      while True:
        yield from zip(arrays["x"], arrays["y"])
        if split != "train":
          return

    spec = (tf.TensorSpec([2], arrays["x"].dtype), tf.TensorSpec([], arrays["y"].dtype))
    ds = tf.data.Dataset.from_generator(points, output_signature=spec)
    return ds.map(lambda x, y: {"x": x, "y": y}).batch(per_replica, drop_remainder=split == "train")
