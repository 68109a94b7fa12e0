"""A task whose examples are numbered, and an action recording the numbers each train step read (the elastic
resume tests load this module into executor runs through gin)."""

import json
import os

import gin
import keras
import numpy as np
import tensorflow as tf

from executor.actions import Action
from programs.core.data import array_dataset
from programs.core.records import array_parser, record_dataset, write_array_records
from programs.core.task import Task

SOURCES = ("arrays", "records", "plain")


def numbered_examples(num_examples: int) -> dict[str, np.ndarray]:
  """Example i: id i, features that tell it apart, a target a line of them."""
  ids = np.arange(num_examples, dtype=np.int64)
  x = np.stack([np.sin(ids), np.cos(ids), (ids % 7) / 7.0], axis=1).astype(np.float32)
  y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3).astype(np.float32)
  return {"id": ids, "x": x, "y": y}


def write_numbered_records(directory: str, num_examples: int, shards: int = 4) -> str:
  """Writes the examples as indexed TFRecord shards; returns their glob."""
  write_array_records(numbered_examples(num_examples), directory, shards)
  return os.path.join(directory, "train-*.tfrecord")


@gin.configurable
class NumberedExamples(Task):
  """Linear regression over numbered examples; its train step returns each example's id as a per-example output.

  `source`: 'arrays' (`array_dataset`), 'records' (`record_dataset` over `files`) or 'plain' (a user's
  `from_tensor_slices().shard().shuffle().repeat().batch()`, which takes no start_example).
  """

  splits = ("train",)

  def __init__(
    self, source: str = "arrays", num_examples: int = 52, files: str = "", seed: int = 5, **kwargs
  ):
    kwargs.setdefault("global_batch_size", 8)
    kwargs.setdefault("optimizer_fn", lambda: keras.optimizers.Adam(0.01))
    super().__init__(**kwargs)
    if source not in SOURCES:
      raise ValueError(f"NumberedExamples.source must be one of {SOURCES}, got {source!r}")
    self.source, self.num_examples, self.files, self.seed = source, num_examples, files, seed

  def build(self):
    self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, name="linear")], name="numbered")

  def seekable(self, split=None) -> bool:
    return self.source != "plain"

  def dataset(self, split, input_context, start_example=0):
    arrays = numbered_examples(self.num_examples)
    if self.source == "arrays":
      return array_dataset(arrays, input_context, self.global_batch_size, True, self.seed, start_example)
    if self.source == "records":
      files = sorted(tf.io.gfile.glob(self.files))
      parse = array_parser(arrays)
      return record_dataset(
        files,
        parse,
        input_context,
        self.global_batch_size,
        True,
        self.seed,
        start_example,
        block_size=16,
        lanes=2,
      )
    per_replica = input_context.get_per_replica_batch_size(self.global_batch_size)
    ds = tf.data.Dataset.from_tensor_slices(arrays)
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.shuffle(16, seed=self.seed).repeat().batch(per_replica, drop_remainder=True)

  def compute_loss(self, batch, training):
    err = tf.cast(self.model(batch["x"], training=training), tf.float32) - batch["y"]
    loss = tf.reduce_mean(tf.square(err))
    return loss, {"loss": (loss, tf.cast(tf.shape(err)[0], tf.float32))}, {"id": batch["id"]}


@gin.configurable
class StepIds(Action):
  """Appends the example ids each train step read to `path` (JSON lines `{"step": s, "ids": [...]}`; the chief)."""

  def __init__(self, path: str = gin.REQUIRED):
    self.path = path
    self.is_chief = True

  def start(self, context):
    self.is_chief = context.is_chief

  def after_train_loop(self, result):
    if not self.is_chief:
      return
    ids = np.asarray(result.per_example["id"]).reshape(result.steps, -1)
    with open(self.path, "a") as f:
      for i, row in enumerate(ids):
        f.write(json.dumps({"step": result.step - result.steps + 1 + i, "ids": row.tolist()}) + "\n")


def read_step_ids(path) -> dict[int, list[int]]:
  """{step: the sorted ids it read} of a `StepIds` file."""
  steps = {}
  with open(path) as f:
    for line in f:
      record = json.loads(line)
      steps[record["step"]] = sorted(record["ids"])
  return steps
