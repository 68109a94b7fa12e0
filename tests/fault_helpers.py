"""Helpers the fault-injection suite loads into executor processes through gin.

`PausingSpirals` holds an eval or decode run on the host (inside the device
loop, through a `tf.py_function`), or a decode's host post-processing, so a
test can signal the process exactly there (tests/holds.py). Its variables, data and train step are those of
`SpiralsClassifier`, so its checkpoints compare bit for bit with a plain spirals run.
"""

import gin
import tensorflow as tf
from holds import hold

from executor.tasks.spirals import SpiralsClassifier


@gin.configurable
class PausingSpirals(SpiralsClassifier):
  """Spirals whose `pause_in` program ('eval', 'decode' or 'postprocess') holds in its `pause_at_run`-th run.

  The hold (`holds.hold`) is named after the program kind, its marker in `hold_dir`; it lasts until the test
  releases it or kills the process.
  """

  def __init__(self, pause_in: str = "", pause_at_run: int = 1, hold_dir: str = "", **kwargs):
    kwargs.setdefault("name", "spirals_classifier")
    super().__init__(**kwargs)
    self.pause_in, self.pause_at_run, self.hold_dir = pause_in, pause_at_run, hold_dir
    self._runs = {"eval": 0, "decode": 0, "postprocess": 0}

  def _pause(self, kind):
    self._runs[kind] += 1  # One batch per run in the suite's config.
    if self.pause_in == kind and self._runs[kind] == self.pause_at_run:
      hold(self.hold_dir, kind)

  def _held(self, batch, kind):
    if self.pause_in != kind:
      return batch

    def pause():
      self._pause(kind)
      return tf.constant(0.0)

    zero = tf.py_function(pause, [], tf.float32)
    zero.set_shape(())
    return {**batch, "x": batch["x"] + zero}

  def eval_step(self, batch):
    return super().eval_step(self._held(batch, "eval"))

  def decode_step(self, batch):
    return super().decode_step(self._held(batch, "decode"))

  def postprocess_decode(self, per_example):
    self._pause("postprocess")
    return super().postprocess_decode(per_example)


@gin.configurable
class MisfitSpirals(SpiralsClassifier):
  """Spirals whose batches do not fit the model: `misfit` 'key' renames `x`, 'shape' adds a feature."""

  def __init__(self, misfit: str = "key", **kwargs):
    kwargs.setdefault("name", "misfit_spirals")
    super().__init__(**kwargs)
    self.misfit = misfit

  def dataset(self, split, input_context, start_example=0):
    ds = super().dataset(split, input_context, start_example)
    if self.misfit == "key":
      return ds.map(lambda b: {"features": b["x"], "y": b["y"]})
    return ds.map(lambda b: {"x": tf.concat([b["x"], b["x"][:, :1]], axis=1), "y": b["y"]})


@gin.configurable
class EndingSpirals(SpiralsClassifier):
  """Spirals whose train split ends after `train_batches` batches (0: empty)."""

  def __init__(self, train_batches: int = 0, **kwargs):
    kwargs.setdefault("name", "ending_spirals")
    super().__init__(**kwargs)
    self.train_batches = train_batches

  def dataset(self, split, input_context, start_example=0):
    ds = super().dataset(split, input_context, start_example)
    return ds.take(self.train_batches) if split == "train" else ds
