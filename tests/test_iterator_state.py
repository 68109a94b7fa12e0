"""Pipelines that take no start_example resume from the saved tf.data iterator state, with no replay, where tf.data
can save it; elsewhere (a generator, a distributed iterator) they replay, with the cost in the log."""

import logging
import re
import signal

import pytest
import tensorflow as tf
from conftest import ready_programs
from holds import hold_params
from test_resume import Executor, assert_same_state, checkpoint_state

STATE_KEY = "train_input_iterator/state/.ATTRIBUTES/ITERATOR_STATE"

ONE_DEVICE = ["Executor.task = @ShuffledSpirals()"]
REPLAY = (
  r"takes no start_example, so resuming at example \d+ replays \d+ batches per input pipeline \(about \d+ s"
)


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
  assert [k for k in keys if "input_iterator" in k] == [STATE_KEY]
  assert_same_state(checkpoint_state(model_dir), checkpoint_state(reference))


@pytest.mark.slow
def test_a_generator_pipeline_says_why_it_cannot_be_saved_and_replays_with_its_cost(tmp_path):
  model_dir, generator = tmp_path / "run", "Executor.task = @GeneratedSpirals()"
  log = _finish(_run(model_dir, tmp_path, generator, "Executor.max_steps = 30"))
  why = r"tf.data cannot save its iterator \(PyFunc is stateful\), so a resumed run replays its input"
  assert re.search(why, log), log
  keys = dict(tf.train.list_variables(tf.train.latest_checkpoint(str(model_dir / "checkpoints"))))
  assert not [k for k in keys if "input_iterator" in k]
  log = _finish(_run(model_dir, tmp_path, generator, "Executor.max_steps = 60"))
  assert re.search(REPLAY, log), log
  assert "saved iterator state" not in log


def test_a_multi_device_iterator_says_why_it_cannot_be_saved_and_keeps_the_checkpoint_layout(
  tmp_path, mirrored, caplog
):
  from resume_helpers import ShuffledSpirals

  from programs.train import TrainProgram

  task = ShuffledSpirals(hidden_sizes=(8,), global_batch_size=8)
  train = TrainProgram(task, steps_per_loop=2)
  with caplog.at_level(logging.WARNING):
    ready_programs(task, [train], tmp_path / "run", mirrored)
  assert (
    "its iterator is a DistributedIterator, whose state tf.data cannot save, so a resumed run replays"
    in (caplog.text)
  )
  assert not [k for k in train.checkpoint_items() if "input_iterator" in k]


def test_a_pipeline_that_takes_start_example_saves_no_iterator_state(tmp_path, caplog):
  from executor.tasks.spirals import SpiralsClassifier
  from programs.train import TrainProgram

  task = SpiralsClassifier(hidden_sizes=(8,), global_batch_size=8)
  train = TrainProgram(task, steps_per_loop=2)
  with caplog.at_level(logging.INFO):
    ready_programs(task, [train], tmp_path / "run")
  assert sorted(train.checkpoint_items()) == [
    "train_global_batch_size",
    "train_input_position",
    "train_steps_per_loop",
  ]
  assert "iterator" not in caplog.text


def test_a_saved_state_resumes_the_same_pipeline_and_a_changed_one_or_an_old_checkpoint_replays(
  tmp_path, caplog
):
  import numpy as np
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
  path = tf.train.Checkpoint(**items).write(str(tmp_path / "ckpt"))
  del items["train_input_iterator"]  # As an earlier release wrote it: no iterator state.
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
