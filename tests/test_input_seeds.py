"""Unseeded randomness in a user's tf.data pipeline resumes exactly: pipelines are built under the run's seeds.

An unseeded `shuffle` reshuffles every epoch from seeds TensorFlow draws when the pipeline is built, from the
global seed and the count of random ops the process made before; a saved iterator state holds the buffer, not
those seeds. A resumed run builds more pipelines before its train input than the run it resumes did, so before
the fix its next epoch came out in another order (the keras.io structured-data model drifted after a kill -9).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import ready_programs

from programs.core.data import pipeline_seed
from programs.core.task import Task
from programs.train import TrainProgram


class UnseededShuffle(Task):
  """Ten examples shuffled the keras.io way, `shuffle(n)` with no seed; its `dataset` takes no start_example."""

  splits = ("train",)

  def build(self):
    self.model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])

  def dataset(self, split, input_context):
    ds = tf.data.Dataset.range(10).map(lambda i: {"id": i, "x": tf.cast(tf.reshape(i, [1]), tf.float32)})
    return ds.shuffle(10).repeat().batch(input_context.get_per_replica_batch_size(self.global_batch_size))

  def compute_loss(self, batch, training):
    loss = tf.reduce_mean(tf.square(self.model(batch["x"], training=training)))
    return loss, {"loss": (loss, 1.0)}, {}


def _program(tmp_path, name):
  task = UnseededShuffle(global_batch_size=4)
  train = TrainProgram(task, steps_per_loop=1)
  runtime = ready_programs(task, [train], tmp_path / name)
  return train, {**train.checkpoint_items(), **runtime.checkpoint_items()}


def _ids(train, batches):
  return [next(train.input.iterator)["id"].numpy().tolist() for _ in range(batches)]


@pytest.fixture
def global_seed():
  """As `--deterministic --seed=0` sets it; the process's seed state is put back after the test."""
  tf.random.set_seed(0)
  yield
  tf.random.set_seed(None)


def test_a_restored_unseeded_shuffle_reshuffles_later_epochs_as_the_run_it_resumes(tmp_path, global_seed):
  uninterrupted, _ = _program(tmp_path, "uninterrupted")
  uninterrupted.restored()
  expected = _ids(uninterrupted, 12)  # 4.8 epochs of 10 examples in batches of 4.
  stopped, items = _program(tmp_path, "stopped")
  stopped.restored()
  assert _ids(stopped, 5) == expected[:5]
  items["train_input"].sync(all_workers=False)  # As the checkpointer does before each save.
  path = tf.train.Checkpoint(**items).write(str(tmp_path / "ckpt"))
  for _ in range(3):  # A resumed process builds other pipelines first (probes, eval and decode inputs).
    iter(tf.data.Dataset.range(3).shuffle(3))
  resumed, items = _program(tmp_path, "resumed")
  tf.train.Checkpoint(**items).read(path).assert_existing_objects_matched()
  resumed.restored()
  assert _ids(resumed, 7) == expected[5:]


def test_pipeline_seed_fixes_the_seeds_inside_and_leaves_the_sequence_outside_as_it_was(global_seed):
  def order():
    return [int(x) for x in tf.data.Dataset.range(8).shuffle(8).repeat(3)]

  with pipeline_seed(7):
    inside = order()
  tf.random.uniform([1])  # The process goes on drawing op seeds ...
  with pipeline_seed(7):
    assert order() == inside  # ... and the scope starts over: the same seeds.
  with pipeline_seed(8):
    assert order() != inside
  tf.random.set_seed(0)
  outside = order()
  tf.random.set_seed(0)
  with pipeline_seed(7):
    order()
  assert order() == outside  # The global seed's sequence of op seeds is as if the scope never ran.


def test_runs_draw_different_input_seeds_unless_deterministic_and_a_checkpoint_carries_it(tmp_path):
  from programs.core.runtime import Runtime

  def seed(name):
    runtime = Runtime()
    runtime.build([UnseededShuffle(global_batch_size=4)])
    return runtime

  tf.random.set_seed(None)
  a, b = seed("a"), seed("b")
  assert a.input_seed.value != b.input_seed.value
  path = tf.train.Checkpoint(**a.checkpoint_items()).write(str(tmp_path / "ckpt"))
  b.resume_input_seed(path)
  assert b.input_seed.value == a.input_seed.value
  assert np.all([b.pipeline_seed("train", 0) == a.pipeline_seed("train", 0)])
  assert a.pipeline_seed("train", 0) != a.pipeline_seed("train", 1) != a.pipeline_seed("test", 0)
  tf.random.set_seed(5)
  assert seed("c").input_seed.value == 5


@pytest.mark.parametrize("global_seed_value", [None, 3])
def test_a_seeded_op_gets_the_same_seeds_inside_the_scope_as_outside(global_seed_value):
  def order():
    return [int(x) for x in tf.data.Dataset.range(8).shuffle(8, seed=11).repeat(3)]

  tf.random.set_seed(global_seed_value)
  try:
    outside = order()
    with pipeline_seed(7):
      assert order() == outside
    with pipeline_seed(8):
      assert order() == outside
  finally:
    tf.random.set_seed(None)
