"""Exact resume with real processes killed and restarted, and the checkpoint policy around it."""

import itertools
import os
import re
import shutil
import signal
import types
from pathlib import Path

import faults_util
import numpy as np
import pytest
import tensorflow as tf
from conftest import read_scalars
from holds import hold_params, release, wait_held

from executor.checkpoints import Checkpointer, NonFiniteCheckpointError
from executor.cli.main import run
from executor.lock import ModelDirLock
from programs.core.errors import ConfigError

MAX_STEPS = 240
CONFIG = [
  "SpiralsClassifier.hidden_sizes = (256, 256)",
  "SpiralsClassifier.dropout = 0.1",
  "SpiralsClassifier.global_batch_size = 128",
  "TrainProgram.steps_per_loop = 10",
  "SimpleProgramSchedule.train_executions_per_eval = 3",
  "EvalProgram.num_batches = 2",
  "DecodeProgram.num_batches = 1",
  f"Executor.max_steps = {MAX_STEPS}",
  "Checkpointer.save_interval_steps = 30",
]


class Executor(faults_util.Executor):
  """An `executor` process on this module's config (forked from the suite's fork server: tests/faults_util.py),
  its log beside `model_dir`."""

  _logs = itertools.count()

  def __init__(self, model_dir, *extra, gin_files=()):
    model_dir = Path(model_dir)
    args = ["--gin_file=gin/spirals.gin", "--deterministic", f"--model_dir={model_dir}"]
    args += [f"--gin_file={f}" for f in gin_files]
    args += [f"--gin_param={p}" for p in [*CONFIG, *extra]]
    super().__init__(args, model_dir.parent / f"{model_dir.name}.{next(self._logs)}.log")


def checkpoint_state(model_dir):
  """{key: value} of the latest checkpoint (all but the save counter and saved input iterator states, whose bytes
  hold what was prefetched at the save: `test_iterator_state` compares what they read)."""
  path = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
  reader = tf.train.load_checkpoint(path)
  keys = [
    k
    for k, _ in tf.train.list_variables(path)
    if "save_counter" not in k and k != "_CHECKPOINTABLE_OBJECT_GRAPH" and "ITERATOR_STATES" not in k
  ]
  return path, {k: reader.get_tensor(k) for k in keys}


def assert_same_state(a, b):
  path_a, state_a = a
  path_b, state_b = b
  assert os.path.basename(path_a) == os.path.basename(path_b) == f"ckpt-{MAX_STEPS}"
  assert state_a.keys() == state_b.keys()
  for key in state_a:
    assert np.array_equal(state_a[key], state_b[key]), f"{key} differs"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("reference") / "run"
  executor = Executor(model_dir)
  assert executor.finish() == 0, executor.log
  state = checkpoint_state(model_dir)
  assert any(k.startswith("variables/mlp/hidden_0") or "hidden_0" in k for k in state[1])
  return state


@pytest.mark.slow
def test_kill_9_at_several_points_resumes_bit_exactly(tmp_path, reference):
  model_dir = tmp_path / "run"
  for step, saved in ((40, 30), (130, 120)):
    holds = tmp_path / f"holds{step}"
    executor = Executor(model_dir, *hold_params(holds, "train", step))
    executor.wait_held(holds, "train")  # After the train loop of `step`.
    executor.kill()
    assert executor.returncode == -signal.SIGKILL
    latest = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
    assert latest is not None and int(latest.rsplit("-", 1)[1]) == saved
  executor = Executor(model_dir)
  assert executor.finish() == 0, executor.log
  assert re.search(r"Restored .*ckpt-\d+ at step \d+", executor.log)
  assert_same_state(checkpoint_state(model_dir), reference)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_kill_9_resumes_bit_exactly_in_mixed_precision(tmp_path, precision):
  # A short growth interval makes the float16 loss scale move before the kill: every 7th step doubles it to 2^16,
  # which overflows, so the next halves it and is skipped. The kill lands between two of those.
  extra = [f"Runtime.precision = '{precision}'", "Runtime.loss_scale_growth_steps = 6"]
  if precision == "mixed_float16":
    # float16 matrix products are emulated on CPU (20x bfloat16's time at the default width): a narrower model.
    extra += ["SpiralsClassifier.hidden_sizes = (32, 32)"]
  reference = Executor(tmp_path / "reference", *extra)
  assert reference.finish() == 0, reference.log
  model_dir, holds = tmp_path / "run", tmp_path / "holds"
  executor = Executor(model_dir, *extra, *hold_params(holds, "train", 130))
  executor.wait_held(holds, "train")
  executor.kill()
  latest = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
  assert latest is not None and int(latest.rsplit("-", 1)[1]) == 120
  executor = Executor(model_dir, *extra)
  assert executor.finish() == 0, executor.log
  assert re.search(r"Restored .*ckpt-\d+ at step \d+", executor.log)
  resumed, expected = checkpoint_state(model_dir), checkpoint_state(tmp_path / "reference")
  assert_same_state(resumed, expected)
  scale_keys = [k for k in expected[1] if "dynamic_scale" in k]
  if precision == "mixed_float16":
    assert len(scale_keys) == 1  # Saved, so compared bit for bit with every other tensor above.
    scales = [v for _, v in read_scalars(model_dir / "train")["loss_scale"]]
    assert set(scales) == {2.0**15, 2.0**16}, scales
  else:
    assert not scale_keys and "loss_scale" not in read_scalars(model_dir / "train")


@pytest.mark.slow
def test_kill_during_a_checkpoint_write_keeps_the_previous_one(tmp_path, reference):
  model_dir, holds = tmp_path / "run", tmp_path / "holds"
  pausing = tmp_path / "pausing.gin"
  pausing.write_text(
    "import resume_helpers\n"
    "Executor.checkpointer = @PausingCheckpointer()\n"
    "PausingCheckpointer.save_interval_steps = 30\n"
    "PausingCheckpointer.pause_at_step = 90\n"
    f"PausingCheckpointer.hold_dir = {str(holds)!r}\n"
  )
  executor = Executor(model_dir, gin_files=[str(pausing)])
  executor.wait_held(holds, "in_write")  # Inside the write of step 90.
  executor.kill()
  # The files of step 90 are complete, but the pointer still names step 60.
  assert (model_dir / "checkpoints" / "ckpt-90.index").exists()
  assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith("ckpt-60")
  executor = Executor(model_dir)
  assert executor.finish() == 0, executor.log
  assert "at step 60" in executor.log
  assert_same_state(checkpoint_state(model_dir), reference)


@pytest.mark.slow
def test_sigterm_saves_exits_zero_and_resumes(tmp_path, reference):
  model_dir, holds = tmp_path / "run", tmp_path / "holds"
  executor = Executor(model_dir, *hold_params(holds, "train", 50))
  executor.wait_held(holds, "train")  # In the main thread: the handler runs, and logs, while held.
  executor.signal(signal.SIGTERM)
  executor.wait_for("SIGTERM received")
  release(holds, "train")
  assert executor.finish() == 0, executor.log
  stopped = int(re.search(r"Final checkpoint at step (\d+) .*stopped by SIGTERM", executor.log).group(1))
  assert stopped == 50
  assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith(f"ckpt-{stopped}")
  executor = Executor(model_dir)
  assert executor.finish() == 0, executor.log
  assert f"at step {stopped}" in executor.log
  assert_same_state(checkpoint_state(model_dir), reference)


def _spirals(model_dir, *params):
  return run(
    str(model_dir),
    ["gin/spirals.gin"],
    ["TrainProgram.steps_per_loop = 10", "Checkpointer.save_interval_steps = 30", *params],
  )


def test_truncated_newest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
  model_dir = tmp_path / "run"
  assert _spirals(model_dir, "Executor.max_steps = 60") == 60
  data = next((model_dir / "checkpoints").glob("ckpt-60.data-*"))
  data.write_bytes(data.read_bytes()[:100])
  with caplog.at_level("WARNING"):
    assert _spirals(model_dir, "Executor.max_steps = 90") == 90
  assert any("Skipping checkpoint" in r.message and "ckpt-60" in r.message for r in caplog.records)
  loss_steps = [s for s, _ in read_scalars(model_dir / "train")["loss"]]
  assert loss_steps == [10, 20, 30, 40, 50, 60] + [40, 50, 60, 70, 80, 90]  # Resumed from 30.


def test_second_executor_on_a_busy_model_dir_is_refused(tmp_path):
  model_dir = tmp_path / "run"
  model_dir.mkdir()
  holder = ModelDirLock(str(model_dir))
  holder.acquire()
  try:
    with pytest.raises(
      ConfigError, match=rf"model_dir '{model_dir}' is in use by another executor \(pid {os.getpid()}"
    ):
      _spirals(model_dir, "Executor.max_steps = 10")
  finally:
    holder.release()
  assert not (model_dir / "checkpoints").exists()


def test_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
  from resume_helpers import hold_the_lock

  model_dir, holds = tmp_path / "run", tmp_path / "holds"
  model_dir.mkdir()
  holder = faults_util.forked(hold_the_lock, str(model_dir), str(holds))
  try:
    wait_held(holds, "locked", holder.is_alive, lambda: f"exit code {holder.exitcode}")
  finally:
    holder.kill()
    holder.join()
  with caplog.at_level("INFO"):
    assert _spirals(model_dir, "Executor.max_steps = 10") == 10
  assert any("Took over the lock" in r.message for r in caplog.records)


def test_warm_start_maps_and_reports(tmp_path):
  source = tmp_path / "source"
  assert _spirals(source, "Executor.max_steps = 30") == 30
  target = tmp_path / "target"
  _spirals(
    target,
    "Executor.max_steps = 0",
    "Executor.warm_start = @WarmStart()",
    f"WarmStart.checkpoint_path = '{source / 'checkpoints'}'",
    "WarmStart.rules = [('mlp/hidden_(.*)', 'mlp/hidden_%s')]",
  )
  src = tf.train.load_checkpoint(str(source / "checkpoints" / "ckpt-30"))
  dst = tf.train.load_checkpoint(str(target / "checkpoints" / "ckpt-0"))
  for name in ["hidden_0/kernel", "hidden_0/bias", "hidden_1/kernel"]:
    key = f"variables/mlp.S{name.replace('/', '.S')}/.ATTRIBUTES/VARIABLE_VALUE"
    np.testing.assert_array_equal(src.get_tensor(key), dst.get_tensor(key))
  key = "variables/mlp.Slogits.Skernel/.ATTRIBUTES/VARIABLE_VALUE"
  assert not np.array_equal(src.get_tensor(key), dst.get_tensor(key))
  report = (target / "warm_start.txt").read_text()
  assert "mlp/hidden_0/kernel <- mlp/hidden_0/kernel" in report
  assert "mlp/logits/kernel: no rule matches" in report


def test_warm_start_is_skipped_when_model_dir_has_a_checkpoint(tmp_path):
  source, target = tmp_path / "source", tmp_path / "target"
  _spirals(source, "Executor.max_steps = 20")
  _spirals(target, "Executor.max_steps = 10")
  _spirals(
    target,
    "Executor.max_steps = 20",
    "Executor.warm_start = @WarmStart()",
    f"WarmStart.checkpoint_path = '{source / 'checkpoints'}'",
  )
  assert not (target / "warm_start.txt").exists()


def test_missing_warm_start_checkpoint_fails_before_writing(tmp_path):
  with pytest.raises(ConfigError, match="WarmStart.checkpoint_path '/no/such' holds no checkpoint"):
    _spirals(tmp_path / "run", "Executor.warm_start = @WarmStart()", "WarmStart.checkpoint_path = '/no/such'")
  assert not (tmp_path / "run").exists()


def test_checkpoint_path_evaluates_that_checkpoint_only(tmp_path):
  train_dir = tmp_path / "train"
  _spirals(train_dir, "Executor.max_steps = 60")
  before = sorted(os.listdir(train_dir / "checkpoints"))
  eval_dir = tmp_path / "eval"
  run(
    str(eval_dir),
    ["gin/spirals.gin"],
    ["SimpleProgramSchedule.train_executions_per_eval = 0"],
    checkpoint_path=str(train_dir / "checkpoints" / "ckpt-30"),
  )
  assert [s for s, _ in read_scalars(eval_dir / "eval_test")["accuracy"]] == [30]
  assert not (eval_dir / "checkpoints").exists() or not os.listdir(eval_dir / "checkpoints")
  assert sorted(os.listdir(train_dir / "checkpoints")) == before


def test_non_finite_variables_are_not_checkpointed(tmp_path):
  step = tf.Variable(7, dtype=tf.int64)
  weights = tf.Variable([1.0, 2.0], name="w")
  checkpointer = Checkpointer()
  checkpointer.attach(str(tmp_path), step, {}, [weights])
  checkpointer.save()
  weights.assign([1.0, float("nan")])
  step.assign(8)
  with pytest.raises(
    NonFiniteCheckpointError, match=r"step 8: w hold NaN or Inf; the latest checkpoint stays .*ckpt-7"
  ):
    checkpointer.save()
  assert tf.train.latest_checkpoint(str(tmp_path)).endswith("ckpt-7")


def test_async_save_error_surfaces_in_the_main_loop(tmp_path):
  step = tf.Variable(1, dtype=tf.int64)
  weights = tf.Variable(tf.zeros([1000]), name="w")
  directory = tmp_path / "checkpoints"
  checkpointer = Checkpointer(async_save=True)
  checkpointer.attach(str(directory), step, {}, [weights])
  checkpointer.save()
  checkpointer.wait()
  assert tf.train.latest_checkpoint(str(directory)).endswith("ckpt-1")
  shutil.rmtree(directory)
  directory.write_text("not a directory")  # Every later write fails.
  step.assign(2)
  with pytest.raises(Exception) as error:
    checkpointer.save()
    checkpointer.wait()
  assert (
    "ckpt-2" in str(error.value) or "checkpoints" in str(error.value) or "Not a directory" in str(error.value)
  )


def test_time_based_save_policy(tmp_path, monkeypatch):
  import executor.checkpoints

  # The checkpointer's clock, moved by the test: a loaded machine may take longer than any interval between lines.
  now = [1000.0]
  monkeypatch.setattr(executor.checkpoints, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
  step = tf.Variable(0, dtype=tf.int64)
  checkpointer = Checkpointer(save_interval_steps=None, save_interval_secs=0.5)
  checkpointer.attach(str(tmp_path), step, {}, [tf.Variable([1.0])])
  step.assign(1)
  now[0] += 0.49
  assert not checkpointer.maybe_save()  # Not half a second yet.
  now[0] += 0.02
  assert checkpointer.maybe_save()
  step.assign(2)
  assert not checkpointer.due()
  assert [os.path.basename(p) for p in checkpointer.checkpoints()] == ["ckpt-1"]


def test_host_counters_and_the_host_step_round_trip_through_checkpoints(tmp_path):
  from programs.core.runtime import HostCounter, Runtime

  runtime = Runtime()
  runtime.build([])
  cycle = HostCounter()
  checkpointer = Checkpointer(async_save=True)
  checkpointer.attach(str(tmp_path), runtime.step_counter, {"cycle": cycle}, is_chief=True)
  runtime.global_step.assign(5)
  runtime.note_step(5)
  cycle.value = 3
  checkpointer.save()
  cycle.value = 9  # Changed while the asynchronous save may still be writing.
  runtime.global_step.assign(12)
  runtime.note_step(12)
  checkpointer.wait()
  assert runtime.step() == 12
  assert checkpointer.restore() == 5
  assert cycle.value == 3 and runtime.step() == 5


@pytest.mark.parametrize("async_save", [False, True])
def test_host_counters_anywhere_in_the_saved_state_hold_their_value_at_each_save(tmp_path, async_save):
  from programs.core.runtime import HostCounter, Runtime

  runtime = Runtime()
  runtime.build([])
  holder = tf.Module()
  holder.counter = HostCounter()  # Nested in another trackable, as an action's state may be.
  checkpointer = Checkpointer(async_save=async_save, max_to_keep=5)
  checkpointer.attach(str(tmp_path), runtime.step_counter, {"holder": holder}, is_chief=True)
  saved = {}
  for step, value in ((1, 3), (2, 7), (3, 11)):
    runtime.note_step(step)
    holder.counter.value = value
    saved[checkpointer.save()] = (step, value)
  checkpointer.wait()
  holder.counter.value = -1
  for path, (step, value) in saved.items():
    assert checkpointer.restore(path) == step
    assert holder.counter.value == value and runtime.step() == step
