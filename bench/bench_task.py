"""`BenchTask`: the benchmark workload (`bench_workload.py`) as an executor task."""

from __future__ import annotations

import time

import gin
import numpy as np
import tensorflow as tf
from bench_workload import WORKLOADS, loss_fn, make_dataset, make_model, make_optimizer

from programs.core.task import Task


@gin.configurable
class BenchTask(Task):
  """The benchmark workload as an executor task.

  Train and eval report only the loss (weighted by the batch size, as Keras
  does); decode returns predictions and labels. `postprocess_decode` computes
  the accuracy, keeps `num_records` records and sleeps `postprocess_sleep_secs`
  (to measure how decoding overlaps host work).
  """

  splits = ("train", "test")

  def __init__(
    self,
    workload: str = "small",
    prefetch: bool = True,
    postprocess_sleep_secs: float = 0.0,
    num_records: int = 8,
    **kwargs,
  ):
    self.workload = WORKLOADS[workload]
    kwargs.setdefault("global_batch_size", self.workload.batch)
    kwargs.setdefault("optimizer_fn", make_optimizer)
    super().__init__(**kwargs)
    self.prefetch = prefetch
    self.postprocess_sleep_secs = postprocess_sleep_secs
    self.num_records = num_records

  def build(self):
    self.model = make_model(self.workload)
    super().build()

  def dataset(self, split, input_context):
    return make_dataset(self.workload, split, self.prefetch, input_context)

  def compute_loss(self, batch, training):
    x, y = batch
    loss = loss_fn(y, self.model(x, training=training))
    return loss, {"loss": (loss, tf.cast(tf.shape(y)[0], tf.float32))}, {}

  def decode_step(self, batch):
    x, y = batch
    return {"prediction": tf.argmax(self.model(x, training=False), -1, output_type=tf.int32), "label": y}

  def postprocess_decode(self, per_example):
    if self.postprocess_sleep_secs:
      time.sleep(self.postprocess_sleep_secs)
    prediction, label = per_example["prediction"], per_example["label"]
    records = [
      {"prediction": int(p), "label": int(y)}
      for p, y in zip(prediction[: self.num_records], label[: self.num_records])
    ]
    return records, {"accuracy": float(np.mean(prediction == label)) if len(label) else float("nan")}
