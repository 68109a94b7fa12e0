"""How programs compile: the step and the loop traced once each, XLA on the step, AutoGraph by choice."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import read_scalars, ready_programs
from tiny_tasks import CountingRegression

from programs import DecodeProgram, EvalProgram, TrainAndDecodeProgram, TrainProgram
from programs.core.errors import ConfigError
from programs.core.runtime import Runtime, default_strategy


class BranchingRegression(CountingRegression):
  """Device code with a Python `if` on a tensor: needs AutoGraph."""

  def compute_loss(self, batch, training):
    loss, metrics, per_example = super().compute_loss(batch, training)
    if tf.reduce_mean(batch["x"]) > 100.0:  # Never true: only the trace differs.
      loss = loss * 0.0
    return loss, metrics, per_example


def test_each_function_is_traced_once_over_many_runs(tmp_path, mirrored):
  for strategy_fn, where in ((default_strategy, "one"), (mirrored, "two")):
    task = CountingRegression()
    train = TrainProgram(task, steps_per_loop=4)
    evaluate = EvalProgram(task, split="test", steps_per_loop=2)
    decode = DecodeProgram(task, split="test", steps_per_loop=3, async_postprocess=False)
    programs = [train, evaluate, decode]
    ready_programs(task, programs, tmp_path / where, strategy_fn)
    for _ in range(3):
      train.run()
      evaluate.run()  # A fresh iterator each time, and a short last loop.
      decode.run()
    train.run(num_steps=1)
    for p in programs:
      assert p.trace_counts == {"loops": 1, "loop/step": 1}, (where, p.name)
    for p in programs:
      p.close()


def test_fused_program_traces_each_step_once(tmp_path):
  task = CountingRegression()
  fused = TrainAndDecodeProgram(task, steps_per_loop=4, decode_num_batches=2)
  ready_programs(task, [fused], tmp_path)
  for _ in range(3):
    fused.run()
  assert fused.trace_counts == {"loops": 1, "train/step": 1, "decode/step": 1}
  fused.close()


def test_train_step_under_xla_matches_the_graph_step(tmp_path):
  results = {}
  for jit in (None, True):
    keras.utils.set_random_seed(0)
    task = CountingRegression()
    train = TrainProgram(task, steps_per_loop=5, jit_compile=jit, name=f"train_{jit}")
    ready_programs(task, [train], tmp_path)
    results[jit] = [train.run().metrics["mse"] for _ in range(3)]
    assert train.trace_count == 1
    train.close()
  np.testing.assert_allclose(results[True], results[None], rtol=1e-4)


def test_xla_over_several_devices_is_refused_before_anything_runs(tmp_path, mirrored):
  task = CountingRegression()
  train = TrainProgram(task, steps_per_loop=5, jit_compile=True)
  runtime = Runtime(mirrored)
  runtime.build([task])
  with pytest.raises(ConfigError, match=r"TrainProgram 'train': jit_compile=True .* 2 replicas"):
    train.validate(runtime)


def test_python_control_flow_on_tensors_needs_autograph(tmp_path):
  task = BranchingRegression()
  train = TrainProgram(task, steps_per_loop=5)
  with pytest.raises(ConfigError, match=r"TrainProgram 'train': .*BranchingRegression.autograph = True"):
    ready_programs(task, [train], tmp_path / "off")
  task = BranchingRegression(autograph=True)
  train = TrainProgram(task, steps_per_loop=5)
  evaluate = EvalProgram(task, split="test")
  ready_programs(task, [train, evaluate], tmp_path / "on")
  assert np.isfinite(train.run().metrics["mse"]) and np.isfinite(evaluate.run().metrics["mse"])
  assert train.trace_count == 1 and evaluate.trace_count == 1


def test_learning_rate_and_step_summaries_come_from_the_loop(tmp_path):
  schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)

  class Decaying(CountingRegression):
    def __init__(self):
      super().__init__()
      self._optimizer_fn = lambda: keras.optimizers.SGD(schedule)

  task = Decaying()
  train = TrainProgram(task, steps_per_loop=3)
  runtime = ready_programs(task, [train], tmp_path)
  steps = [train.run().step for _ in range(2)]
  train.close()
  assert steps == [3, 6] and runtime.step() == 6
  lr = read_scalars(tmp_path / "train")["learning_rate"]
  assert [s for s, _ in lr] == [3, 6]
  # After 3 and 6 updates, the schedule's rate is 0.1 * 0.5**3 and 0.1 * 0.5**6.
  assert [v for _, v in lr] == pytest.approx([0.1 * 0.5**3, 0.1 * 0.5**6])
