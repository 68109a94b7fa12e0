"""Pipelines that take no start_example resume from the saved tf.data iterator state, with no replay, where tf.data
can save it (on one device or several); elsewhere (a generator) they replay, with the cost in the log."""

import logging
import re
import signal

import numpy as np
import pytest
import tensorflow as tf
from conftest import ready_programs
from holds import hold_params
from test_resume import Executor, assert_same_state, checkpoint_state

STATE_KEYS = [
  f"train_input/pipelines/.ATTRIBUTES/{key}" for key in ("ITERATOR_STATES", "PER_REPLICA_BATCH", "POSITIONS")
]

ONE_DEVICE = ["Executor.task = @ShuffledSpirals()"]
REPLAY = r"so resuming at example \d+ replays \d+ batches per input pipeline \(about \d+ s"


def _run(model_dir, tmp_path, *extra):
  gin = tmp_path / "helpers.gin"
  gin.write_text("import resume_helpers\n")
  return Executor(model_dir, *extra, gin_files=[gin])


def _finish(executor):
  assert executor.finish() == 0, executor.log
  return executor.log


@pytest.mark.slow
def test_kill_9_resumes_from_the_saved_iterator_bit_exactly_with_no_replay(tmp_path):
  reference = tmp_path / "reference"
  log = _finish(_run(reference, tmp_path, *ONE_DEVICE))
  assert re.search(r"checkpoints save the input iterator's state \(\d+ bytes\)", log)
  model_dir, holds = tmp_path / "run", tmp_path / "holds"
  executor = _run(model_dir, tmp_path, *ONE_DEVICE, *hold_params(holds, "train", 70))
  executor.wait_held(holds, "train")  # Past the checkpoint of step 60.
  executor.kill()
  assert executor.returncode == -signal.SIGKILL
  log = _finish(_run(model_dir, tmp_path, *ONE_DEVICE))
  size = re.search(r"the input resumes at example (\d+) from its saved iterator state \((\d+) bytes\)", log)
  assert size and int(size.group(1)) > 0 and int(size.group(2)) > 0, log
  assert "replays" not in log
  keys = dict(tf.train.list_variables(tf.train.latest_checkpoint(str(model_dir / "checkpoints"))))
  assert sorted(k for k in keys if "pipelines" in k) == STATE_KEYS
  assert_same_state(checkpoint_state(model_dir), checkpoint_state(reference))
  # The saved iterator states read on alike (their bytes differ by what was prefetched at the save).
  resumed, uninterrupted = _batches_after(model_dir), _batches_after(reference)
  assert len(resumed) == 20 and all(np.array_equal(a, b) for a, b in zip(resumed, uninterrupted))


def _batches_after(model_dir, batches=20):
  """The x of the train batches the input iterator state of `model_dir`'s latest checkpoint reads next."""
  from resume_helpers import ShuffledSpirals

  from programs.core import input_state

  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir / "checkpoints")))
  state = reader.get_tensor("train_input/pipelines/.ATTRIBUTES/ITERATOR_STATES")[0]
  batch = int(reader.get_tensor("train_input/pipelines/.ATTRIBUTES/PER_REPLICA_BATCH"))
  iterator = iter(ShuffledSpirals(global_batch_size=batch).dataset("train", tf.distribute.InputContext()))
  input_state.restore(iterator, state)
  return [next(iterator)["x"].numpy() for _ in range(batches)]


@pytest.mark.slow
def test_a_generator_pipeline_says_why_it_cannot_be_saved_and_replays_with_its_cost(tmp_path):
  model_dir, generator = tmp_path / "run", "Executor.task = @GeneratedSpirals()"
  log = _finish(_run(model_dir, tmp_path, generator, "Executor.max_steps = 30"))
  why = r"tf.data cannot save its iterator \(PyFunc is stateful\), so a resumed run replays its input"
  assert re.search(why, log), log
  keys = dict(tf.train.list_variables(tf.train.latest_checkpoint(str(model_dir / "checkpoints"))))
  assert not [k for k in keys if "pipelines" in k]
  log = _finish(_run(model_dir, tmp_path, generator, "Executor.max_steps = 60"))
  assert re.search(REPLAY, log), log
  assert "saved iterator state" not in log


def test_a_mirrored_run_saves_its_iterator_state_and_resumes_from_it(tmp_path, mirrored, caplog):
  from resume_helpers import ShuffledSpirals

  from programs.train import TrainProgram

  def program(name):
    task = ShuffledSpirals(hidden_sizes=(8,), global_batch_size=8)
    train = TrainProgram(task, steps_per_loop=2)
    ready_programs(task, [train], tmp_path / name, mirrored)
    train.restored()
    return train

  saved = program("saved")
  saved.run()
  items = saved.checkpoint_items()
  items["train_input"].sync(all_workers=True)
  path = tf.train.Checkpoint(**items).write(str(tmp_path / "ckpt"))
  expected = [t.numpy() for t in _next_per_replica(saved)]
  resumed = program("resumed")
  with caplog.at_level(logging.INFO):
    tf.train.Checkpoint(**resumed.checkpoint_items()).read(path).assert_existing_objects_matched()
    resumed.restored()
  assert "the input resumes at example 16 from its saved iterator state" in caplog.text
  assert not re.search(REPLAY, caplog.text)
  for got, want in zip(_next_per_replica(resumed), expected):
    assert got.shape == (4, 2)
    np.testing.assert_array_equal(got.numpy(), want)


def _next_per_replica(train):
  """The x of the next step's batch of each replica, read as the train loop reads it."""
  strategy = train.runtime.strategy

  @tf.function
  def read(iterator):
    return strategy.experimental_local_results(train.runtime.per_replica(iterator)["x"])

  return read(train.input.iterator)


def test_a_pipeline_that_takes_start_example_saves_no_iterator_state(tmp_path, caplog):
  from executor.tasks.spirals import SpiralsClassifier
  from programs.train import TrainProgram

  task = SpiralsClassifier(hidden_sizes=(8,), global_batch_size=8)
  train = TrainProgram(task, steps_per_loop=2)
  with caplog.at_level(logging.INFO):
    ready_programs(task, [train], tmp_path / "run")
  assert sorted(train.checkpoint_items()) == [
    "train_global_batch_size",
    "train_input",
    "train_input_position",
    "train_steps_per_loop",
  ]
  train.restored()
  assert not hasattr(train.checkpoint_items()["train_input"], "pipelines")
  assert "iterator" not in caplog.text


def test_a_saved_state_resumes_the_same_pipeline_and_a_changed_one_or_an_old_checkpoint_replays(
  tmp_path, caplog
):
  from resume_helpers import ShuffledSpirals

  from programs.train import TrainProgram

  class Doubled(ShuffledSpirals):
    def dataset(self, split, input_context):
      return super().dataset(split, input_context).map(lambda b: {"x": b["x"] * 2.0, "y": b["y"]})

  def program(task_class, name):
    task = task_class(hidden_sizes=(8,), global_batch_size=8)
    train = TrainProgram(task, steps_per_loop=3)
    ready_programs(task, [train], tmp_path / name)
    return train

  saved = program(ShuffledSpirals, "saved")
  saved.restored()
  saved.run()
  items = saved.checkpoint_items()
  items["train_input"].sync(all_workers=True)
  path = tf.train.Checkpoint(**items).write(str(tmp_path / "ckpt"))
  del items["train_input"]  # As an earlier release wrote it: no iterator state.
  old = tf.train.Checkpoint(**items).write(str(tmp_path / "old"))
  expected = next(saved.input.iterator)["x"].numpy()
  cases = ((ShuffledSpirals, "same", path), (Doubled, "changed", path), (ShuffledSpirals, "old", old))
  with caplog.at_level(logging.INFO):
    for task_class, name, checkpoint in cases:
      train = program(task_class, name)
      tf.train.Checkpoint(**train.checkpoint_items()).read(checkpoint).assert_existing_objects_matched()
      train.restored()
      np.testing.assert_array_equal(
        next(train.input.iterator)["x"].numpy(), expected * (2.0 if name == "changed" else 1)
      )
      if name == "same":
        assert "the input resumes at example 24 from its saved iterator state" in caplog.text
        assert not re.search(REPLAY, caplog.text)
  assert "the saved input iterator state does not fit Doubled.dataset() (Failed to restore" in caplog.text
  assert len(re.findall(REPLAY, caplog.text)) == 2  # The changed pipeline and the old checkpoint.
  assert (
    "the checkpoint holds no input iterator state, so resuming at example 24 replays 3 batches" in caplog.text
  )


def test_an_asynchronous_save_writes_the_iterator_state_of_its_own_step(tmp_path, caplog):
  from resume_helpers import ShuffledSpirals

  from executor.checkpoints import Checkpointer
  from programs.train import TrainProgram

  def program(name):
    task = ShuffledSpirals(hidden_sizes=(8,), global_batch_size=8)
    train = TrainProgram(task, steps_per_loop=3)
    runtime = ready_programs(task, [train], tmp_path / name)
    checkpointer = Checkpointer(async_save=True)
    checkpointer.attach(str(tmp_path / "checkpoints"), runtime.step_counter, train.checkpoint_items())
    return train, checkpointer

  saved, checkpointer = program("saved")
  checkpointer.restore()
  saved.restored()
  for _ in range(2):  # The second save writes the copies the first one made, refreshed.
    saved.run()
    checkpointer.save()
  expected = next(saved.input.iterator)["x"].numpy()
  saved.run()  # Moves the iterator on while the write may still be going.
  checkpointer.wait()
  resumed, checkpointer = program("resumed")
  with caplog.at_level(logging.INFO):
    assert checkpointer.restore() == 6
    resumed.restored()
  assert "the input resumes at example 48 from its saved iterator state" in caplog.text
  np.testing.assert_array_equal(next(resumed.input.iterator)["x"].numpy(), expected)
