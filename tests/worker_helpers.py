"""Helpers the multi-worker tests load into worker processes through gin (`--module=worker_helpers`).

`HoldingSpirals` holds one worker inside its compiled train loop, so a test can signal or kill a worker there,
mid-loop, on an event (a marker file) rather than after a delay.
"""

import json
import os
import time
from pathlib import Path

import gin
import tensorflow as tf

from executor.tasks.spirals import SpiralsClassifier


@gin.configurable
class HoldingSpirals(SpiralsClassifier):
  """Spirals whose worker `hold_worker` holds in its process's `hold_at_step`-th train step.

  Inside the step (a `tf.py_function` before the step's all-reduce), that worker writes `marker_file`, then waits
  until `release_file` exists (at most `hold_secs`); its peers wait in the step's all-reduce meanwhile. The hook adds
  0 to the features, so variables, data and steps are those of `SpiralsClassifier` and checkpoints compare bit for
  bit with a run that holds nowhere (`hold_worker = -1`, the default).
  """

  def __init__(
    self,
    hold_worker: int = -1,
    hold_at_step: int = 0,
    marker_file: str = "",
    release_file: str = "",
    hold_secs: float = 300.0,
    **kwargs,
  ):
    kwargs.setdefault("name", "spirals_classifier")
    super().__init__(**kwargs)
    self.hold_worker, self.hold_at_step, self.hold_secs = hold_worker, hold_at_step, hold_secs
    self.marker_file, self.release_file = marker_file, release_file
    self.worker = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
    self._steps = 0

  def _hook(self):
    self._steps += 1
    if self.worker == self.hold_worker and self._steps == self.hold_at_step:
      Path(self.marker_file).write_text(f"worker {self.worker} holds in step {self._steps} of its process\n")
      end = time.monotonic() + self.hold_secs
      while time.monotonic() < end and not os.path.exists(self.release_file):
        time.sleep(0.02)
    return tf.constant(0.0)

  def compute_loss(self, batch, training):
    if training:
      zero = tf.py_function(self._hook, [], tf.float32)
      zero.set_shape(())
      batch = {**batch, "x": batch["x"] + zero}
    return super().compute_loss(batch, training)
