"""KerasTask: a compiled Keras model trains, evaluates and decodes with no step code; its metrics (AUC included)
equal `model.evaluate` on the same examples and weights, on one device and on two replicas."""

import keras
import numpy as np
import pytest
from conftest import ready_programs

from executor.tasks.keras_digits import digits_data, digits_mlp
from programs import DecodeProgram, EvalProgram, TrainProgram
from programs.core import KerasTask
from programs.core.errors import ConfigError
from programs.core.runtime import default_strategy


def _reference(task, split="test", compile_args=None):
  """`model.evaluate` of a fresh copy of the task's model (one device, no strategy) with the task's weights."""
  model = task.model_fn()
  if compile_args is not None:
    model.compile(**compile_args)
  model.set_weights([w.numpy() for w in task.model.weights])
  x, y = task.dataset_fn(split)
  return model, model.evaluate(x, y, batch_size=task.global_batch_size, verbose=0, return_dict=True)


def _train_and_evaluate(strategy_fn, model_dir):
  keras.utils.set_random_seed(0)
  task = KerasTask(model_fn=digits_mlp, dataset_fn=digits_data, global_batch_size=64)
  train = TrainProgram(task, steps_per_loop=20)
  # Loops of 4 steps: a run adds up several loops (1000 examples: 15 full batches and one of 40).
  evaluate = EvalProgram(task, split="test", steps_per_loop=4)
  ready_programs(task, [train, evaluate], model_dir, strategy_fn)
  train_metrics = train.run().metrics
  return task, train_metrics, evaluate.run()


@pytest.mark.parametrize("where", ["one_device", "mirrored"])
def test_eval_metrics_equal_model_evaluate(tmp_path, mirrored, where):
  strategy_fn = default_strategy if where == "one_device" else mirrored
  task, train_metrics, result = _train_and_evaluate(strategy_fn, tmp_path)
  assert set(train_metrics) == {"loss", "accuracy", "auc"}
  assert set(result.metrics) == {"loss", "accuracy", "auc"}
  _, expected = _reference(task)
  assert set(expected) == {"loss", "accuracy", "auc"}
  for name, value in expected.items():
    assert result.metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
  # Real numbers, not a degenerate state; every example counted (16 steps of 64 or of 2 x 32).
  assert 0.0 < result.metrics["accuracy"] < 1.0 and 0.5 < result.metrics["auc"] < 1.0
  assert result.steps == 16


def test_decode_writes_the_predictions_of_every_example(tmp_path):
  task = KerasTask(model_fn=digits_mlp, dataset_fn=digits_data, global_batch_size=64)
  decode = DecodeProgram(task, split="test", steps_per_loop=8, async_postprocess=False)
  ready_programs(task, [decode], tmp_path)
  result = decode.run()
  x, y = digits_data("test")
  model, _ = _reference(task)
  np.testing.assert_allclose(
    result.per_example["prediction"], model.predict(x, verbose=0), rtol=1e-5, atol=1e-6
  )
  np.testing.assert_array_equal(result.per_example["label"], y)
  lines = (tmp_path / "decode_test" / "decoder_out_0.jsonl").read_text().splitlines()
  assert len(lines) == 1000
  decode.close()


def _uncompiled_mlp():
  return keras.Sequential([keras.Input((64,)), keras.layers.Dense(10, activation="softmax")])


def test_an_uncompiled_model_is_compiled_with_the_task_arguments(tmp_path):
  task = KerasTask(
    model_fn=_uncompiled_mlp,
    dataset_fn=digits_data,
    loss="categorical_crossentropy",
    metrics=[keras.metrics.Precision(name="precision"), keras.metrics.AUC(name="auc")],
    optimizer_fn=lambda: keras.optimizers.SGD(0.1),
    global_batch_size=50,
  )
  evaluate = EvalProgram(task, split="test", steps_per_loop=3)
  train = TrainProgram(task, steps_per_loop=5)
  ready_programs(task, [train, evaluate], tmp_path)
  train.run()
  assert isinstance(task.optimizer, keras.optimizers.SGD)
  metrics = evaluate.run().metrics
  compile_args = {
    "loss": "categorical_crossentropy",
    "metrics": [keras.metrics.Precision(name="precision"), keras.metrics.AUC(name="auc")],
  }
  _, expected = _reference(task, compile_args=compile_args)
  assert set(metrics) == set(expected) == {"loss", "precision", "auc"}
  for name, value in expected.items():
    assert metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_an_uncompiled_model_without_a_loss_is_a_config_error(tmp_path):
  task = KerasTask(model_fn=_uncompiled_mlp, dataset_fn=digits_data)
  with pytest.raises(ConfigError, match="not compiled; compile it in model_fn or set KerasTask.loss"):
    ready_programs(task, [], tmp_path)


def test_the_example_gin_file_runs_with_eval_and_decode(tmp_path):
  from conftest import read_scalars

  from executor.cli.main import run

  params = ["Executor.max_steps = 40", "TrainProgram.steps_per_loop = 20"]
  assert run(str(tmp_path / "run"), ["gin/keras_digits.gin"], params) == 40
  scalars = read_scalars(tmp_path / "run" / "eval_test")
  assert {"loss", "accuracy", "auc"} <= set(scalars)
  assert [step for step, _ in scalars["auc"]] == [20, 40]
  assert not any(tag.startswith("keras_metric_state") for tag in read_scalars(tmp_path / "run" / "train"))
  records = (tmp_path / "run" / "decode_test" / "decoder_out_40.jsonl").read_text().splitlines()
  assert len(records) == 2 * 64


@pytest.mark.parametrize("source", ["arrays", "record_files", "tf_data"])
def test_a_resume_opens_arrays_and_record_files_at_the_saved_example_and_replays_only_tf_data(
  tmp_path, source
):
  import tensorflow as tf

  from programs.core.records import RecordFiles, array_parser, write_array_records

  x, y = digits_data("train")
  arrays = {"x": x, "y": y}
  files = write_array_records(arrays, str(tmp_path / "data"), 3)

  def parse(serialized):
    features = array_parser(arrays)(serialized)
    return features["x"], features["y"]

  def data(split):
    if split != "train" or source == "arrays":
      return digits_data(split)
    return (
      RecordFiles(files, parse) if source == "record_files" else tf.data.Dataset.from_tensor_slices((x, y))
    )

  task = KerasTask(model_fn=digits_mlp, dataset_fn=data, global_batch_size=64)
  train = TrainProgram(task, steps_per_loop=5)
  runtime = ready_programs(task, [train], tmp_path / "run")
  train.run()
  position = 10**6 * 64
  assert task.seekable() == (source != "tf_data")
  if source == "tf_data":  # Replayed: the work grows with the position (and the log says what it costs).
    assert runtime.replay_batches(task, position) == 10**6
    return
  assert runtime.replay_batches(task, position) == 0
  train.input_position.assign(position)
  train.restored()
  first = next(train.input.iterator)
  # The batch an uninterrupted reader meets there: the stream opened one batch earlier, second batch.
  expected = list(task.dataset("train", tf.distribute.InputContext(), position - 64).take(2))[1]
  np.testing.assert_array_equal(first[0].numpy(), expected[0].numpy())
  np.testing.assert_array_equal(first[1].numpy(), expected[1].numpy())
