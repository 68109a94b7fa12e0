"""Resume at scale: the input restored in constant time, incompatible checkpoints refused, counters kept."""

import hashlib
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, ready_programs
from holds import hold_params
from test_resume import Executor, checkpoint_state

from executor.checkpoints import Checkpointer
from executor.tasks.spirals import SpiralsClassifier
from programs import TrainProgram
from programs.core.data import array_dataset
from programs.core.runtime import Runtime

BATCH = 32


def _train_program(strategy_fn=None, batch=BATCH, tmp_path=None):
  task = SpiralsClassifier(global_batch_size=batch, hidden_sizes=(8,))
  train = TrainProgram(task, steps_per_loop=5)
  runtime = ready_programs(task, [train], tmp_path, strategy_fn)
  return task, train, runtime


def _first_batch(train, runtime):
  """The next step's batch over all replicas, read as the train loop reads it."""
  batch = tf.function(runtime.per_replica)(train.input.iterator)
  return {
    k: np.concatenate([np.asarray(x) for x in runtime.strategy.experimental_local_results(v)])
    for k, v in batch.items()
  }


def _stream(task, start, count):
  """`count` examples of the one-pipeline train stream from example `start`, read from the start (uninterrupted)."""
  ds = array_dataset(task.arrays("train"), tf.distribute.InputContext(), 1, True, task.seed)
  it = iter(ds.skip(start).take(count))
  rows = [next(it) for _ in range(count)]
  return {k: np.concatenate([r[k].numpy() for r in rows]) for k in rows[0]}


def dataset_ops(ds: tf.data.Dataset) -> set[str]:
  """The op names of a tf.data pipeline's graph: what it does to produce its elements."""
  graph = tf.compat.v1.GraphDef.FromString(
    tf.raw_ops.DatasetToGraphV2(input_dataset=ds._variant_tensor).numpy()
  )
  return {node.op for node in graph.node} | {n.op for f in graph.library.function for n in f.node_def}


@pytest.mark.parametrize("mirrored_run", [False, True], ids=["default", "mirrored"])
def test_the_first_batch_after_a_restart_at_a_large_position_takes_no_replay_and_is_exact(
  tmp_path, mirrored, mirrored_run
):
  task, train, runtime = _train_program(mirrored if mirrored_run else None, tmp_path=tmp_path)
  # Work count, not wall-clock: the restart replays nothing, and the pipeline it opens has no skip in it (its
  # first element is computed from the position), so the work is the same at step 0 and step 10^6.
  for steps in (0, 10**5, 10**6):
    train.input_position.assign(steps * BATCH)  # Set by writing the counter, not by training.
    train.restored()
    assert runtime.replay_batches(task, steps * BATCH) == 0
    _first_batch(train, runtime)
    far = array_dataset(
      task.arrays("train"), tf.distribute.InputContext(), BATCH, True, task.seed, steps * BATCH
    )
    assert not {op for op in dataset_ops(far) if "Skip" in op}, dataset_ops(far)
  # The exact batch an uninterrupted reader meets there (checked at a position a test can read up to).
  train.input_position.assign(137 * BATCH)
  train.restored()
  batch = _first_batch(train, runtime)
  expected = _stream(task, 137 * BATCH, BATCH)
  np.testing.assert_array_equal(batch["x"], expected["x"])
  np.testing.assert_array_equal(batch["y"], expected["y"])
  # ... and at 10^5 steps the stream agrees with itself started a few batches earlier.
  train.input_position.assign(10**5 * BATCH)
  train.restored()
  far = _first_batch(train, runtime)
  ds = array_dataset(
    task.arrays("train"), tf.distribute.InputContext(), BATCH, True, task.seed, 10**5 * BATCH - 3 * BATCH
  )
  np.testing.assert_array_equal(far["x"], list(ds.skip(3).take(1))[0]["x"].numpy())


def test_a_changed_global_batch_on_resume_reads_on_from_the_right_example(tmp_path, caplog):
  task, train, runtime = _train_program(batch=BATCH, tmp_path=tmp_path / "a")
  train.restored()
  for _ in range(8):
    train.run()  # 40 steps of 32: 1280 examples.
  checkpointer = Checkpointer()
  checkpointer.attach(str(tmp_path / "ckpt"), runtime.step_counter, train.checkpoint_items())
  checkpointer.save()
  assert int(train.input_position.numpy()) == 40 * BATCH

  bigger, train2, runtime2 = _train_program(batch=2 * BATCH, tmp_path=tmp_path / "b")
  checkpointer2 = Checkpointer()
  checkpointer2.attach(str(tmp_path / "ckpt"), runtime2.step_counter, train2.checkpoint_items())
  with caplog.at_level("WARNING"):
    assert checkpointer2.restore() == 40
    train2.restored()
  assert any("global batch size changed from 32 to 64" in r.getMessage() for r in caplog.records)
  batch = _first_batch(train2, runtime2)
  expected = _stream(bigger, 40 * BATCH, 2 * BATCH)
  np.testing.assert_array_equal(batch["x"], expected["x"])


def _tree_digest(path):
  digest = {}
  for root, _, files in os.walk(path):
    for name in files:
      full = os.path.join(root, name)
      with open(full, "rb") as f:
        digest[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
  return digest


def _cli(model_dir, *params):
  args = [sys.executable, "-m", "executor.cli.main", "--gin_file=gin/spirals.gin", f"--model_dir={model_dir}"]
  args += [
    f"--gin_param={p}" for p in ["TrainProgram.steps_per_loop = 10", "DecodeProgram.num_batches = 1", *params]
  ]
  env = dict(os.environ, PYTHONPATH=str(REPO))
  return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_wider_model_on_an_existing_model_dir_is_refused_and_nothing_changes(tmp_path):
  model_dir = tmp_path / "run"
  first = _cli(model_dir, "Executor.max_steps = 20", "SpiralsClassifier.hidden_sizes = (16,)")
  assert first.returncode == 0, first.stderr[-2000:]
  before = _tree_digest(model_dir)
  refused = _cli(model_dir, "Executor.max_steps = 40", "SpiralsClassifier.hidden_sizes = (32,)")
  assert refused.returncode == 2, refused.stderr[-2000:]
  assert "does not fit this model" in refused.stderr
  assert "mlp/hidden_0/kernel: checkpoint [2, 16] float32, model [2, 32] float32" in refused.stderr
  assert "new --model_dir" in refused.stderr and "WarmStart" in refused.stderr
  assert _tree_digest(model_dir) == before
  other_optimizer = _cli(
    model_dir,
    "SpiralsClassifier.hidden_sizes = (16,)",
    "SpiralsClassifier.optimizer_fn = @keras.optimizers.Adafactor",
  )
  assert other_optimizer.returncode == 2
  assert "optimizer (Adafactor) kernel: not in the checkpoint" in other_optimizer.stderr
  assert _tree_digest(model_dir) == before


ROLLBACK = [
  "import poison",
  "Executor.task = @PoisonedSpirals()",
  "PoisonedSpirals.hidden_sizes = (32,)",
  "PoisonedSpirals.global_batch_size = 64",
  "PoisonedSpirals.poisoned_batches = [45]",
  "TrainProgram.non_finite_policy = 'rollback'",
  "Checkpointer.save_interval_steps = 10",
  "Executor.actions = [@EarlyStopping()]",
  "EarlyStopping.patience = 100",
]


@pytest.mark.slow
def test_rollback_count_and_early_stopping_survive_kill_9(tmp_path):
  reference = Executor(tmp_path / "reference", *ROLLBACK)
  assert reference.finish() == 0, reference.log
  model_dir, holds = tmp_path / "run", tmp_path / "holds"
  # Held after the save of step 90, past the rollback of the cycle from step 30.
  killed = Executor(model_dir, *ROLLBACK, *hold_params(holds, "train", 100, actions=["@EarlyStopping()"]))
  killed.wait_held(holds, "train")
  killed.kill()
  assert killed.returncode == -signal.SIGKILL
  resumed = Executor(model_dir, *ROLLBACK)
  assert resumed.finish() == 0, resumed.log
  path, state = checkpoint_state(model_dir)
  _, expected = checkpoint_state(tmp_path / "reference")
  assert state["rollbacks/.ATTRIBUTES/VARIABLE_VALUE"] == 1
  for key in (
    "rollbacks",
    "early_stopping/best",
    "early_stopping/bad_evaluations",
    "early_stopping/best_step",
  ):
    full = f"{key}/.ATTRIBUTES/VARIABLE_VALUE"
    np.testing.assert_array_equal(state[full], expected[full], err_msg=key)


def test_host_counters_restore_into_a_fresh_runtime(tmp_path):
  runtime = Runtime()
  runtime.build([])
  runtime.global_step.assign(7)
  runtime.note_step(7)
  checkpointer = Checkpointer()
  checkpointer.attach(str(tmp_path), runtime.step_counter, {})
  checkpointer.save()
  fresh = Runtime()
  fresh.build([])
  other = Checkpointer()
  other.attach(str(tmp_path), fresh.step_counter, {})
  assert other.restore() == 7
  assert fresh.step() == 7 and int(fresh.global_step.numpy()) == 7
