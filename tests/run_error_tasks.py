"""Tasks that fail mid-run, loaded into executor processes through gin (`import run_error_tasks`).

`RecordSpirals` is the spirals task on indexed record files (train and test splits), with switches that make a
run fail the way a user's would: a parse asking for a feature the records do not have, an assertion in the model,
an allocation no machine has, an assertion in the decode post-processing.
"""

import os
import time

import gin
import numpy as np
import tensorflow as tf
from holds import CAP_SECS

from executor import record_dataset
from executor.tasks.spirals import SpiralsClassifier
from programs.core.records import array_parser


@gin.configurable
class RecordSpirals(SpiralsClassifier):
  """Spirals whose train and test splits are record files (`train_files`, `test_files`), and that fails on demand.

  Args:
    test_files: A glob of indexed record files of the test split (in memory when empty).
    missing_feature: The train split's parse also asks for this feature (the records have only `x` and `y`).
    max_abs_feature: The model asserts every feature's magnitude is below this.
    huge_allocation: Each train step also makes a 4 PiB tensor (more than any address space: it fails at once).
    postprocess_check: The decode post-processing asserts (with a TensorFlow op) that no label is 0.
    fail_after_step: Training asserts the global step is below this (so the step after it fails); it writes
      `marker` first.
    marker: A file the failing step writes; with `hold_first_decode`, the first decode post-processing of the
      process waits for it: it is pending when the step fails.
    hold_first_decode: See `marker`.
  """

  def __init__(
    self,
    test_files: str = "",
    missing_feature: str = "",
    max_abs_feature: float | None = None,
    huge_allocation: bool = False,
    postprocess_check: bool = False,
    fail_after_step: int | None = None,
    marker: str = "",
    hold_first_decode: bool = False,
    **kwargs,
  ):
    kwargs.setdefault("name", "record_spirals")
    super().__init__(**kwargs)
    self.test_files, self.missing_feature, self.max_abs_feature = test_files, missing_feature, max_abs_feature
    self.huge_allocation, self.postprocess_check = huge_allocation, postprocess_check
    self.fail_after_step, self.marker, self.hold_first_decode = fail_after_step, marker, hold_first_decode

  def dataset(self, split, input_context, start_example=0):
    files = {"train": self.train_files, "test": self.test_files}[split]
    if not files:
      return super().dataset(split, input_context, start_example)
    parse = array_parser(self.arrays(split))
    if split == "train" and self.missing_feature:
      parse = _asking_for(parse, self.missing_feature)
    files = sorted(tf.io.gfile.glob(files))
    train = split == "train"
    return record_dataset(
      files, parse, input_context, self.global_batch_size, train, self.seed, start_example
    )

  def compute_loss(self, batch, training):
    if training and self.fail_after_step is not None:
      step = tf.convert_to_tensor(self.optimizer.iterations)  # Updates done: the global step before this one.
      wrote = tf.py_function(self._mark_failing, [step], tf.bool)
      with tf.control_dependencies([wrote]):
        check = tf.debugging.assert_less(
          step, tf.cast(self.fail_after_step, step.dtype), message="a step past"
        )
      with tf.control_dependencies([check]):
        batch = {k: tf.identity(v) for k, v in batch.items()}
    if self.max_abs_feature is not None:
      check = tf.debugging.assert_less(
        tf.abs(batch["x"]), self.max_abs_feature, message="a feature beyond max_abs_feature"
      )
      with tf.control_dependencies([check]):
        batch = {k: tf.identity(v) for k, v in batch.items()}
    loss, metrics, per_example = super().compute_loss(batch, training)
    if self.huge_allocation:
      # A size the data decides (never constant-folded): 2^50 float32s, beyond any address space. A metric, so
      # that it is computed (a term of the loss with no gradient is pruned).
      side = tf.where(tf.reduce_max(batch["y"]) >= 0, tf.constant(2**20, tf.int64), 1)
      huge = tf.zeros(tf.stack([side, side, 1024]), tf.float32)
      metrics = {**metrics, "allocated": (tf.reduce_sum(huge[:1, :1, :1]), tf.constant(1.0))}
    return loss, metrics, per_example

  def _mark_failing(self, step):
    if int(step) >= self.fail_after_step:
      with open(self.marker, "w") as f:
        f.write(f"failing at step {int(step) + 1}\n")
    return True

  def postprocess_decode(self, per_example):
    if self.hold_first_decode:
      self.hold_first_decode = False
      # No timeout the run could race: under load the failing step may come minutes later.
      deadline = time.monotonic() + CAP_SECS
      while not os.path.exists(self.marker):
        if time.monotonic() > deadline:
          raise RuntimeError(f"held for {CAP_SECS:.0f}s: the failing step never wrote {self.marker}")
        time.sleep(0.02)
    if self.postprocess_check:
      tf.debugging.assert_none_equal(per_example["label"], np.int32(0), message="a label 0 in the decode")
    return super().postprocess_decode(per_example)


def _asking_for(parse, key):
  def parse_more(serialized):
    extra = tf.io.parse_example(serialized, {key: tf.io.FixedLenFeature([1], tf.float32)})
    return {**parse(serialized), key: extra[key]}

  return parse_more
