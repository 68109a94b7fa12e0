"""Programs over a real runtime: averaging, the tail op, per-example outputs, tracing, replicas."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import ready_programs
from tiny_tasks import CountingRegression

from executor.tasks.spirals import SpiralsClassifier, make_spirals
from programs import DecodeProgram, EvalProgram, TrainProgram
from programs.core.runtime import default_strategy


def test_tail_runs_once_per_loop_and_per_example_rows(tmp_path):
  task = CountingRegression()
  train = TrainProgram(task, steps_per_loop=5)
  runtime = ready_programs(task, [train], tmp_path)
  results = [train.run() for _ in range(3)]
  assert int(task.tail_calls.numpy()) == 3
  assert runtime.step() == 15
  for r in results:
    assert r.steps == 5
    assert r.per_example["id"].shape == (5 * 8,)
  # The persistent train iterator moves on: loop 2 starts where loop 1 ended.
  assert list(results[1].per_example["id"][:8]) == list(range(40, 48))
  assert train.trace_count == 1
  # A shorter last loop is a tensor argument: no retrace.
  assert train.run(num_steps=2).steps == 2
  assert runtime.step() == 17 and int(task.tail_calls.numpy()) == 4
  assert train.trace_count == 1


@pytest.mark.parametrize("strategy", ["default", "mirrored"])
def test_one_step_loops_train_exactly_as_one_long_loop(tmp_path, strategy, request):
  strategy_fn = default_strategy if strategy == "default" else request.getfixturevalue("mirrored")
  finals = []
  for steps_per_loop, loops in ((1, 6), (6, 1)):
    keras.utils.set_random_seed(0)
    task = CountingRegression(name=f"reg_{steps_per_loop}")
    train = TrainProgram(task, steps_per_loop=steps_per_loop, name=f"train_{steps_per_loop}")
    runtime = ready_programs(task, [train], tmp_path / str(steps_per_loop), strategy_fn)
    results = [train.run() for _ in range(loops)]
    assert runtime.step() == 6 and int(task.tail_calls.numpy()) == loops and train.trace_count == 1
    assert [r.step for r in results] == list(range(steps_per_loop, 7, steps_per_loop))
    ids = np.concatenate([r.per_example["id"] for r in results])
    assert sorted(ids) == list(range(48))
    finals.append(([v.numpy() for v in task.model.variables], results[-1].metrics, results[-1].steps))
  (one, _, steps_one), (long, _, steps_long) = finals
  assert (steps_one, steps_long) == (1, 6)
  for a, b in zip(one, long):
    np.testing.assert_array_equal(a, b)
  # A one-step program's last loop cannot be shorter: asking for none is an error, not a silent step.
  with pytest.raises(ValueError, match="at least one step"):
    train.run(num_steps=0)


def test_eval_metrics_do_not_depend_on_steps_per_loop(tmp_path):
  task = CountingRegression()
  evals = [EvalProgram(task, split="test", steps_per_loop=n, name=f"eval_{n}") for n in (1, 3, 10)]
  ready_programs(task, evals, tmp_path)
  results = [p.run() for p in evals]
  # 37 examples in batches of 8: the last batch has 5, and is weighted by 5.
  x, y = task._data("test")
  err = task.model(x).numpy() - y
  expected = {"mse": float(np.mean(err**2)), "abs": float(np.mean(np.abs(err)))}
  for r in results:
    assert r.steps == 5
    for name, value in expected.items():
      assert r.metrics[name] == pytest.approx(value, rel=1e-5)
  # Every run sees the same batches.
  assert evals[0].run().metrics == results[0].metrics
  assert [p.trace_count for p in evals] == [1, 1, 1]


def test_decode_collects_every_example_in_order(tmp_path):
  task = CountingRegression()
  decode = DecodeProgram(task, split="test", steps_per_loop=2, async_postprocess=False)
  ready_programs(task, [decode], tmp_path)
  result = decode.run()
  assert list(result.per_example["id"]) == list(range(37))
  lines = (tmp_path / "decode_test" / "decoder_out_0.jsonl").read_text().splitlines()
  assert len(lines) == 37
  decode.close()


def test_num_batches_limits_eval(tmp_path):
  task = CountingRegression()
  program = EvalProgram(task, split="test", num_batches=3, steps_per_loop=2)
  ready_programs(task, [program], tmp_path)
  assert program.run().steps == 3


def _train_spirals(strategy_fn, tmp_path, steps):
  keras.utils.set_random_seed(0)
  task = SpiralsClassifier(global_batch_size=64)
  train = TrainProgram(task, steps_per_loop=steps)
  evaluate = EvalProgram(task, split="test")
  runtime = ready_programs(task, [train, evaluate], tmp_path / strategy_fn.__name__, strategy_fn)
  train_metrics = train.run().metrics
  weights = [v.numpy() for v in task.model.variables]
  return runtime, train_metrics, evaluate.run().metrics, weights


def test_mirrored_two_replicas_match_one_device(tmp_path, mirrored):
  one, train1, eval1, w1 = _train_spirals(default_strategy, tmp_path, 30)
  two, train2, eval2, w2 = _train_spirals(mirrored, tmp_path, 30)
  assert one.num_replicas == 1 and two.num_replicas == 2
  # Same global batch, same examples per step: equal up to float32 summation order.
  for a, b in zip(w1, w2):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  for name in train1:
    assert train1[name] == pytest.approx(train2[name], rel=1e-4, abs=1e-6)
  for name in eval1:
    assert eval1[name] == pytest.approx(eval2[name], rel=1e-4, abs=1e-6)


def test_mirrored_decode_gathers_every_replica(tmp_path, mirrored):
  task = CountingRegression()
  decode = DecodeProgram(task, split="test", steps_per_loop=3, async_postprocess=False)
  ready_programs(task, [decode], tmp_path, mirrored)
  ids = decode.run().per_example["id"]
  assert sorted(ids) == list(range(37))
  decode.close()


def test_spirals_data_is_deterministic():
  a = make_spirals(10, 3, 0.1, seed=5)
  b = make_spirals(10, 3, 0.1, seed=5)
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[1], b[1])


class FilteredTestSplit(CountingRegression):
  """A test split of unknown size (filtered), so the steps of a run are not known in advance."""

  def dataset(self, split, input_context):
    ds = super().dataset(split, input_context)
    return ds.filter(lambda batch: tf.reduce_all(batch["id"] >= 0)) if split == "test" else ds


def test_eval_and_decode_read_the_same_batches_every_run(tmp_path, mirrored):
  for strategy_fn, where in ((default_strategy, "one"), (mirrored, "two")):
    task = CountingRegression()
    whole = DecodeProgram(task, split="test", steps_per_loop=2, async_postprocess=False)
    part = DecodeProgram(
      task, split="test", num_batches=2, steps_per_loop=1, async_postprocess=False, name="p"
    )
    endless = DecodeProgram(task, split="train", num_batches=3, async_postprocess=False, name="train_head")
    evaluate = EvalProgram(task, split="test", steps_per_loop=3)
    ready_programs(task, [whole, part, endless, evaluate], tmp_path / where, strategy_fn)
    first = evaluate.run().metrics
    for _ in range(3):
      assert list(whole.run().per_example["id"]) == list(range(37)), where
      assert list(part.run().per_example["id"]) == list(range(16)), where
      assert list(endless.run().per_example["id"]) == list(range(24)), where
      assert evaluate.run().metrics == first
    # One iterator over the repeated batches, kept across runs.
    for p in (whole, part, endless, evaluate):
      assert p._run_input()[0] is p._run_input()[0]
      p.close()


def test_a_split_of_unknown_size_gets_a_fresh_iterator_per_run(tmp_path):
  task = FilteredTestSplit()
  # 5 batches in loops of 5: the second loop finds the data ended, with no rows.
  decode = DecodeProgram(task, split="test", steps_per_loop=5, async_postprocess=False)
  ready_programs(task, [decode], tmp_path)
  assert decode._run_input()[0] is not decode._run_input()[0]
  for _ in range(2):
    assert list(decode.run().per_example["id"]) == list(range(37))
  decode.close()


class OddTestSplit(CountingRegression):
  """33 test examples: with two replicas, 9 batches of up to 4, so the last step leaves a replica empty."""

  def _data(self, split):
    x, y = super()._data(split)
    return (x[:33], y[:33]) if split == "test" else (x, y)


def test_decode_when_the_last_step_leaves_a_replica_without_data(tmp_path, mirrored):
  task = OddTestSplit()
  decodes = [
    DecodeProgram(task, split="test", steps_per_loop=n, async_postprocess=False, name=f"decode_{n}")
    for n in (1, 100)
  ]
  ready_programs(task, decodes, tmp_path, mirrored)
  for decode in decodes:
    for _ in range(2):
      result = decode.run()
      assert list(result.per_example["id"]) == list(range(33))
      assert result.per_example["prediction"].shape == (33,)
    decode.close()
