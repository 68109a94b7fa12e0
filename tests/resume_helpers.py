"""Helpers the resume tests load into executor subprocesses through gin."""

import time

import gin
import keras
import tensorflow as tf
from holds import hold

from executor.actions import Action
from executor.checkpoints import Checkpointer


@gin.configurable
class PausingCheckpointer(Checkpointer):
  """Holds (`holds.hold`, markers in `hold_dir`) where a test kills a run around a checkpoint.

  `pause_at_step`: inside the write of that step's checkpoint, after its files are complete and before the
  latest-checkpoint pointer moves (hold `in_write`; with `async_save`, in the background writer). `saved_at_step`:
  in the main thread, once the first save of a step >= it returned (hold `saved`; an asynchronous one may still be
  writing).
  """

  def __init__(self, pause_at_step: int = -1, saved_at_step: int = -1, hold_dir: str = "", **kwargs):
    super().__init__(**kwargs)
    self.pause_at_step, self.saved_at_step, self.hold_dir = pause_at_step, saved_at_step, hold_dir
    self._saved_held = False

  def save(self):
    path = super().save()
    if path is not None and 0 <= self.saved_at_step <= int(path.rsplit("-", 1)[1]) and not self._saved_held:
      self._saved_held = True
      hold(self.hold_dir, "saved")
    return path

  def _save_options(self):
    options = super()._save_options()

    def pause(save_path):
      if save_path.endswith(f"-{self.pause_at_step}"):
        hold(self.hold_dir, "in_write")

    return tf.train.CheckpointOptions(enable_async=options.enable_async, experimental_write_callbacks=[pause])


@gin.configurable
class HoldAt(Action):
  """Holds a training run, in its main thread, at one moment, until the test releases or kills it (tests/holds.py).

  `where` is 'start' (after the restore, before the first cycle, whatever `step`), 'train' (after the first train loop that ends
  at a step >= `step`), 'cycle' (after the first cycle that ends at a step >= `step`: its evals and decodes ran)
  or 'decoded' (the same, once the decodes' host post-processing has written their records). Host-side only: the
  run's state is that of a run without it. The marker, in `folder`, is named `name` (default: `where`; `{pid}` in it
  becomes the process id, for several processes holding at once).
  """

  def __init__(self, folder: str = gin.REQUIRED, where: str = "train", step: int = 0, name: str = ""):
    if where not in ("start", "train", "cycle", "decoded"):
      raise ValueError(f"HoldAt.where must be 'start', 'train', 'cycle' or 'decoded', got {where!r}")
    self.folder, self.where, self.step, self.name = folder, where, step, name or where
    self._held = False

  def _hold(self, where: str, step: int) -> None:
    if where == self.where and step >= self.step and not self._held:
      self._held = True
      hold(self.folder, self.name)

  def start(self, context):
    self._hold("start", self.step)

  def after_train_loop(self, result):
    self._hold("train", result.step)

  def __call__(self, cycle):
    self._hold("cycle", cycle.step)
    if self.where == "decoded" and cycle.step >= self.step and not self._held:
      for program in cycle.programs.values():
        program.wait()
      self._hold("decoded", cycle.step)
    return None


@gin.configurable
class PacedLoops(Action):
  """Sleeps after every train loop, so that a kill drawn at a random delay after a hold lands mid-run more often
  than at the run's end.

  Host-side only: the run's state (weights, counters, checkpoints) is the same as without it.
  """

  def __init__(self, seconds: float = 0.3):
    self.seconds = seconds

  def after_train_loop(self, result):
    time.sleep(self.seconds)


def hold_the_lock(model_dir: str, holds: str) -> None:
  """Takes `model_dir`'s lock as a run does, then holds (hold `locked`) until killed."""
  from executor.lock import ModelDirLock

  ModelDirLock(model_dir).acquire()
  hold(holds, "locked")


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
