"""EMA of the weights: the tail op updates it once per loop; eval and decode can run on it."""

import numpy as np
import pytest
import tensorflow as tf
from conftest import ready_programs
from tiny_tasks import CountingRegression

from executor.cli.main import run
from programs import DecodeProgram, EvalProgram, TrainProgram
from programs.core.errors import ConfigError
from programs.core.runtime import Runtime


def test_ema_tail_updates_shadows_once_per_loop(tmp_path):
  task = CountingRegression(ema_decay=0.75)
  train = TrainProgram(task, steps_per_loop=4)
  ready_programs(task, [train], tmp_path)
  expected = [v.numpy() for v in task.trainable_variables]  # Shadows start at the initial weights.
  for _ in range(3):
    train.run()
    expected = [0.75 * e + 0.25 * v.numpy() for e, v in zip(expected, task.trainable_variables)]
    for e, shadow in zip(expected, task.ema.shadows):
      np.testing.assert_allclose(shadow.numpy(), e, rtol=1e-6)
  assert int(task.tail_calls.numpy()) == 3


def test_ema_eval_differs_from_raw_and_matches_a_hand_computation(tmp_path):
  task = CountingRegression(ema_decay=0.9)
  train = TrainProgram(task, steps_per_loop=5)
  raw = EvalProgram(task, split="test", name="eval_raw")
  ema = EvalProgram(task, split="test", use_ema=True, name="eval_ema")
  decode = DecodeProgram(task, split="test", use_ema=True, async_postprocess=False, name="decode_ema")
  ready_programs(task, [train, raw, ema, decode], tmp_path)
  for _ in range(4):
    train.run()
  live = [v.numpy() for v in task.trainable_variables]
  raw_mse = raw.run().metrics["mse"]
  ema_mse = ema.run().metrics["mse"]
  assert raw_mse != pytest.approx(ema_mse, rel=1e-3)
  # By hand: the linear model with the shadow weights.
  kernel, bias = (s.numpy() for s in task.ema.shadows)
  x, y = task._data("test")
  assert ema_mse == pytest.approx(float(np.mean((x @ kernel + bias - y) ** 2)), rel=1e-5)
  predictions = decode.run().per_example["prediction"]
  np.testing.assert_allclose(predictions, (x @ kernel + bias)[:, 0], rtol=1e-5, atol=1e-6)
  # The live weights are back after the EMA evaluations.
  for before, v in zip(live, task.trainable_variables):
    np.testing.assert_array_equal(before, v.numpy())
  decode.close()


def test_ema_without_decay_is_refused(tmp_path):
  task = CountingRegression()
  program = EvalProgram(task, split="test", use_ema=True)
  runtime = Runtime()
  runtime.build([task])
  with pytest.raises(
    ConfigError, match="use_ema needs an EMA of the weights: set CountingRegression.ema_decay"
  ):
    program.validate(runtime)


def test_ema_is_checkpointed(tmp_path):
  model_dir = tmp_path / "run"
  run(
    str(model_dir),
    ["gin/spirals.gin"],
    [
      "Executor.max_steps = 20",
      "TrainProgram.steps_per_loop = 10",
      "SpiralsClassifier.ema_decay = 0.5",
      "EvalProgram.use_ema = True",
    ],
  )
  keys = [k for k, _ in tf.train.list_variables(str(model_dir / "checkpoints" / "ckpt-20"))]
  assert sum(k.startswith("ema/") for k in keys) == 6  # Three dense layers, kernel and bias.
