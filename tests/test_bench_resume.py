"""bench/resume.py sets a restart position by rewriting a checkpoint: the rewrite must restore as the original."""

import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO

sys.path.append(str(REPO / "bench"))

from resume import input_position, set_position  # noqa: E402

from programs.core.optimizers import OptimizerState  # noqa: E402


def _state():
  """Objects laid out as the executor checkpoints them: counters, optimizer, model variables."""
  weights = tf.Variable(np.arange(6, dtype=np.float32).reshape(2, 3), name="w")
  optimizer = keras.optimizers.Adam(1e-3)
  optimizer.build([weights])
  counters = {name: tf.Variable(0, dtype=tf.int64) for name in ("global_step", "train_input_position")}
  cycle = tf.Variable(0, dtype=tf.int64)
  checkpoint = tf.train.Checkpoint(
    optimizer=OptimizerState(optimizer), variables={"w": weights}, schedule_cycle=cycle, **counters
  )
  return checkpoint, weights, optimizer, counters, cycle


def test_set_position_rewrites_only_the_counters(tmp_path):
  checkpoint, weights, optimizer, counters, cycle = _state()
  optimizer.apply([tf.ones_like(weights)], [weights])
  for variable in counters.values():
    variable.assign(250)
  cycle.assign(3)
  tf.train.CheckpointManager(checkpoint, str(tmp_path / "checkpoints"), max_to_keep=1).save(
    checkpoint_number=250
  )
  saved_weights, saved_slots = weights.numpy(), [v.numpy() for v in optimizer.variables]

  keys = set_position(str(tmp_path / "checkpoints"), 10**6)

  assert sorted(k.split("/.ATTRIBUTES/")[0] for k in keys) == [
    "global_step",
    "optimizer/iteration",
    "train_input_position",
  ]
  fresh, fresh_weights, fresh_optimizer, fresh_counters, fresh_cycle = _state()
  fresh.restore(tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))).assert_existing_objects_matched()
  assert {k: int(v.numpy()) for k, v in fresh_counters.items()} == {
    "global_step": 10**6,
    "train_input_position": 10**6,
  }
  assert int(fresh_optimizer.iterations.numpy()) == 10**6
  assert int(fresh_cycle.numpy()) == 3
  np.testing.assert_array_equal(fresh_weights.numpy(), saved_weights)
  for restored, saved in zip(fresh_optimizer.variables[2:], saved_slots[2:]):  # Past iterations and lr.
    np.testing.assert_array_equal(restored.numpy(), saved)
  assert input_position(str(tmp_path)) == 10**6


def test_set_position_needs_an_input_position(tmp_path):
  step = tf.Variable(5, dtype=tf.int64)
  tf.train.CheckpointManager(tf.train.Checkpoint(global_step=step), str(tmp_path), max_to_keep=1).save()
  with pytest.raises(ValueError, match="has no \\*_input_position counter"):
    set_position(str(tmp_path), 10)
  with pytest.raises(ValueError, match="no checkpoint in"):
    set_position(str(tmp_path / "empty"), 10)


def test_set_position_sets_the_saved_iterator_states_with_the_position_they_belong_to(tmp_path):
  from programs.core.input_state import PipelineStates, SavedInput, restore, serialize

  iterator = iter(tf.data.Dataset.range(100).batch(4))
  saved_input = SavedInput()
  saved_input.pipelines = PipelineStates(lambda: iterator, lambda: 0, 4, 2, 0, lambda data: [data, data])
  saved_input.sync(all_workers=True)
  counters = {name: tf.Variable(0, dtype=tf.int64) for name in ("global_step", "train_input_position")}
  checkpoint = tf.train.Checkpoint(train_input=saved_input, **counters)
  tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=1).save(checkpoint_number=1)
  later = iter(tf.data.Dataset.range(100).batch(4))
  for _ in range(5):
    next(later)
  set_position(str(tmp_path), 5, [serialize(later), b"other"])

  restored = SavedInput()
  restored.pipelines = PipelineStates(lambda: None, lambda: 0, 4, 2, 0, lambda data: [data])
  tf.train.Checkpoint(train_input=restored).read(tf.train.latest_checkpoint(str(tmp_path))).expect_partial()
  states, positions, batch = restored.pipelines.pending
  assert positions == [5, 5] and batch == 4 and states[1] == b"other"
  fresh = iter(tf.data.Dataset.range(100).batch(4))
  restore(fresh, states[0])
  assert next(fresh).numpy().tolist() == [20, 21, 22, 23]
