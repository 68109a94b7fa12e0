"""The benchmark's one workload family: an MLP classifier on generated in-memory data.

`make_model`, `make_dataset` and `loss_fn` are shared by every contender in
`bench/run.py` (the hand-written limit, Keras `fit`, and `bench_task.BenchTask`
through the executor), so they all train the same model on the same batches.
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Workload:
  """Sizes of the MLP and its data.

  Attributes:
    name: Short name, used in the table.
    features: Input width.
    hidden: Width of each of the two hidden layers.
    classes: Output classes.
    batch: Global batch size.
    examples: Examples held in memory (the train split repeats over them).
    test_batches: Batches in the finite test split (eval and decode).
  """

  name: str
  features: int
  hidden: int
  classes: int
  batch: int
  examples: int = 8192
  test_batches: int = 20


# Per-step framework overhead dominates: ~0.3 ms of compute per step on 2 cores.
SMALL = Workload("small", features=32, hidden=64, classes=10, batch=64)
# Compute dominates: ~10 ms per step on 2 cores.
MEDIUM = Workload("medium", features=128, hidden=512, classes=10, batch=256)
WORKLOADS = {w.name: w for w in (SMALL, MEDIUM)}


def _arrays(workload: Workload, split: str) -> tuple[np.ndarray, np.ndarray]:
  """Features and labels of a split: a random linear teacher labels Gaussian points."""
  rng = np.random.default_rng(0)
  teacher = rng.normal(size=(workload.features, workload.classes))
  n = workload.examples if split == "train" else workload.batch * workload.test_batches
  rng = np.random.default_rng(1 if split == "train" else 2)
  x = rng.normal(size=(n, workload.features)).astype(np.float32)
  y = np.argmax(x @ teacher, axis=-1).astype(np.int32)
  return x, y


def make_dataset(
  workload: Workload,
  split: str = "train",
  prefetch: bool = True,
  input_context: tf.distribute.InputContext | None = None,
) -> tf.data.Dataset:
  """`(x, y)` batches: `train` repeats forever, `test` has `test_batches` batches."""
  x, y = _arrays(workload, split)
  ds = tf.data.Dataset.from_tensor_slices((x, y))
  batch = workload.batch
  if input_context is not None:
    ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    batch = input_context.get_per_replica_batch_size(workload.batch)
  if split == "train":
    ds = ds.repeat()
  ds = ds.batch(batch, drop_remainder=split == "train")
  return ds.prefetch(tf.data.AUTOTUNE) if prefetch else ds


def make_model(workload: Workload) -> keras.Model:
  """Two ReLU hidden layers and a logits layer."""
  return keras.Sequential(
    [
      keras.Input((workload.features,)),
      keras.layers.Dense(workload.hidden, activation="relu", name="hidden_0"),
      keras.layers.Dense(workload.hidden, activation="relu", name="hidden_1"),
      keras.layers.Dense(workload.classes, name="logits"),
    ],
    name=f"mlp_{workload.name}",
  )


def make_optimizer() -> keras.optimizers.Optimizer:
  return keras.optimizers.Adam(1e-3)


def loss_fn(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
  """Mean sparse softmax cross-entropy of a batch."""
  return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True))
