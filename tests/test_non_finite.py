"""The non-finite loss policies, driven by NaN batches at chosen steps."""

import json
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, read_scalars, served_scalars

from executor.cli.main import run
from programs import NonFiniteLossError, TrainProgram
from programs.core.runtime import Runtime

sys.path.insert(0, str(REPO / "tests"))
from poison import PoisonedSpirals  # noqa: E402

PARAMS = [
  "import poison",
  "Executor.task = @PoisonedSpirals()",
  "PoisonedSpirals.global_batch_size = 64",
  "PoisonedSpirals.optimizer_fn = @keras.optimizers.Adam",
  "TrainProgram.steps_per_loop = 10",
  "Checkpointer.save_interval_steps = 20",
  "DecodeProgram.num_batches = 1",
]


def _run(model_dir, *params):
  return run(str(model_dir), ["gin/spirals.gin"], [*PARAMS, *params])


def test_non_finite_stop_names_program_and_step_and_keeps_the_last_checkpoint(tmp_path):
  model_dir = tmp_path / "run"
  with pytest.raises(
    NonFiniteLossError, match=r"program 'train' of task 'poisoned_spirals': loss is nan .* step 50"
  ):
    _run(model_dir, "Executor.max_steps = 100", "PoisonedSpirals.poisoned_batches = [45]")
  assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith("ckpt-40")


def test_non_finite_skip_skips_the_update_on_device(tmp_path, mirrored):
  for strategy_fn in (None, mirrored):
    task = PoisonedSpirals(global_batch_size=64, poisoned_batches=[2 * (strategy_fn is not None) + 3])
    train = TrainProgram(task, steps_per_loop=5, non_finite_policy="skip")
    runtime = Runtime(strategy_fn) if strategy_fn else Runtime()
    runtime.build([task])
    train.prepare(runtime, str(tmp_path / str(strategy_fn is None)))
    before = [v.numpy() for v in task.model.trainable_variables]
    first = train.run(num_steps=1)  # One good step: weights move.
    assert first.metrics["skipped_steps"] == 0
    moved = [v.numpy() for v in task.model.trainable_variables]
    assert any(not np.array_equal(a, b) for a, b in zip(before, moved))
    result = train.run()  # Steps 2..6: the poisoned batch is skipped, the rest apply.
    assert result.metrics["skipped_steps"] == 1
    assert np.isfinite(result.metrics["loss"])
    assert all(np.all(np.isfinite(v.numpy())) for v in task.model.variables)
    assert int(task.optimizer.iterations.numpy()) == 5  # 6 steps, one skipped.
    assert runtime.step() == 6


def test_non_finite_skip_through_the_executor_counts_skipped_steps(tmp_path):
  model_dir = tmp_path / "run"
  assert (
    _run(
      model_dir,
      "Executor.max_steps = 40",
      "PoisonedSpirals.poisoned_batches = [12, 13]",
      "TrainProgram.non_finite_policy = 'skip'",
    )
    == 40
  )
  skipped = dict(read_scalars(model_dir / "train")["skipped_steps"])
  assert skipped == {10: 0, 20: 2, 30: 0, 40: 0}


def test_non_finite_rollback_restores_and_reads_past_the_bad_batches(tmp_path, caplog):
  model_dir = tmp_path / "run"
  with caplog.at_level("WARNING"):
    assert (
      _run(
        model_dir,
        "Executor.max_steps = 60",
        "PoisonedSpirals.poisoned_batches = [25]",
        "TrainProgram.non_finite_policy = 'rollback'",
      )
      == 60
    )
  assert any("Rolled back to step 20" in r.getMessage() for r in caplog.records)
  steps = [s for s, _ in read_scalars(model_dir / "train")["loss"]]
  assert steps == [10, 20, 30, 40, 50, 60]  # Step 30's loop diverged, was rolled back, and ran again.
  # The rerun of steps 21..30 read batches 30..39, not the poisoned one again.
  reader = tf.train.load_checkpoint(str(model_dir / "checkpoints" / "ckpt-60"))
  # The position counts examples: 70 batches of 64.
  assert reader.get_tensor("train_input_position/.ATTRIBUTES/VARIABLE_VALUE") == 70 * 64


def test_non_finite_rollback_forgets_the_summaries_of_the_steps_it_undid(tmp_path):
  model_dir = tmp_path / "run"
  # Step 30 is trained, evaluated and decoded, then the loop of step 40 diverges: back to the checkpoint of 20.
  _run(
    model_dir,
    "Executor.max_steps = 60",
    "PoisonedSpirals.poisoned_batches = [35]",
    "TrainProgram.non_finite_policy = 'rollback'",
  )
  for program in ("train", "eval_test", "decode_test"):
    # TensorBoard's loaders (purge on) show step 30 once: the rerun's (before the fix: twice).
    served = {tag: [s for s, _, _ in points] for tag, points in served_scalars(model_dir)[program].items()}
    assert served and all(steps == [10, 20, 30, 40, 50, 60] for steps in served.values()), (program, served)
    rows = [json.loads(line) for line in (model_dir / program / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [10, 20, 30, 40, 50, 60], program


def test_non_finite_rollback_gives_up_after_max_rollbacks(tmp_path):
  with pytest.raises(NonFiniteLossError, match="1 rollbacks already: giving up"):
    _run(
      tmp_path / "run",
      "Executor.max_steps = 80",
      "PoisonedSpirals.poisoned_batches = [25, 45]",
      "TrainProgram.non_finite_policy = 'rollback'",
      "TrainProgram.max_rollbacks = 1",
    )


def test_unknown_non_finite_policy_is_refused(tmp_path):
  from programs.core.errors import ConfigError

  with pytest.raises(
    ConfigError, match="non_finite_policy must be one of stop, skip, rollback, got 'ignore'"
  ):
    _run(tmp_path / "run", "TrainProgram.non_finite_policy = 'ignore'")


@pytest.mark.parametrize("policy", ["stop", "rollback"])
def test_a_finite_loss_over_non_finite_weights_triggers_the_policy(tmp_path, caplog, policy):
  # Batch 29 (step 30, the last of its loop) has a finite loss and NaN gradients: only the weights tell.
  params = [
    "Executor.max_steps = 40",
    "PoisonedSpirals.poisoned_batches = [29]",
    "PoisonedSpirals.finite_loss = True",
  ]
  if policy == "stop":
    with pytest.raises(
      NonFiniteLossError, match=r"the weights hold NaN or Inf after the train loop ending at step 30"
    ):
      _run(tmp_path / "run", *params)
    assert tf.train.latest_checkpoint(str(tmp_path / "run" / "checkpoints")).endswith("ckpt-20")
    return
  with caplog.at_level("WARNING"):
    assert _run(tmp_path / "run", *params, "TrainProgram.non_finite_policy = 'rollback'") == 40
  assert any(
    "weights hold NaN" in r.getMessage() and "Rolled back to step 20" in r.getMessage()
    for r in caplog.records
  )
  reader = tf.train.load_checkpoint(str(tmp_path / "run" / "checkpoints" / "ckpt-40"))
  assert all(
    np.all(np.isfinite(reader.get_tensor(name)))
    for name, _ in tf.train.list_variables(str(tmp_path / "run" / "checkpoints" / "ckpt-40"))
    if reader.get_variable_to_dtype_map()[name].is_floating
  )
