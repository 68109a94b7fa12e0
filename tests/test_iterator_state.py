"""Pipelines that take no start_example resume from the saved tf.data iterator state, with no replay, where tf.data
can save it; elsewhere (a generator, a distributed iterator) they replay, with the cost in the log."""

import re
import signal

import pytest
import tensorflow as tf
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
  model_dir = tmp_path / "run"
  executor = _run(
    model_dir, tmp_path, *ONE_DEVICE, "PacedLoops.seconds = 0.3", "Executor.actions = [@PacedLoops()]"
  )
  executor.wait_for(r"Saved .*ckpt-(60|90)")
  executor.kill()
  assert executor.proc.returncode == -signal.SIGKILL
  log = _finish(_run(model_dir, tmp_path, *ONE_DEVICE))
  size = re.search(r"the input resumes at example (\d+) from its saved iterator state \((\d+) bytes\)", log)
  assert size and int(size.group(1)) > 0 and int(size.group(2)) > 0, log
  assert "replays" not in log
  keys = dict(tf.train.list_variables(tf.train.latest_checkpoint(str(model_dir / "checkpoints"))))
  assert [k for k in keys if "input_iterator" in k] == [STATE_KEY]
  assert_same_state(checkpoint_state(model_dir), checkpoint_state(reference))


@pytest.mark.slow
@pytest.mark.parametrize(
  ("extra", "why"),
  [
    (["Executor.task = @GeneratedSpirals()"], r"tf.data cannot save its iterator \(PyFunc is stateful\)"),
    (
      [*ONE_DEVICE, "Runtime.strategy_fn = @mirrored_strategy", "mirrored_strategy.num_logical_cpus = 2"],
      r"its iterator is a DistributedIterator, whose state tf.data cannot save",
    ),
  ],
  ids=["generator", "mirrored"],
)
def test_an_iterator_that_cannot_be_saved_says_why_and_replays_with_its_cost(tmp_path, extra, why):
  model_dir = tmp_path / "run"
  log = _finish(_run(model_dir, tmp_path, *extra, "Executor.max_steps = 30"))
  assert re.search(why + r", so a resumed run replays its input", log), log
  keys = dict(tf.train.list_variables(tf.train.latest_checkpoint(str(model_dir / "checkpoints"))))
  assert not [k for k in keys if "input_iterator" in k]
  if "Distributed" in why:
    return  # The replay that follows is the same code as the generator's.
  log = _finish(_run(model_dir, tmp_path, *extra, "Executor.max_steps = 60"))
  assert re.search(REPLAY, log), log
  assert "saved iterator state" not in log
