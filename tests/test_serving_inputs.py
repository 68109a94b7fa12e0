"""What a Task's `serving_default` takes: the model's inputs alone, declared or read off `decode_step`, never a label
it only passes through; what cannot be served is refused in one line naming what to declare, writing nothing."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from executor.tasks.keras_digits import digits_data, digits_mlp
from programs.core import KerasTask, Task, array_dataset
from programs.core.errors import ConfigError

_N = 10


class Points(Task):
  """Classifies points; its decode step passes the points, label and index through into its records, as the
  shipped tasks' do, and with `correct` also computes an output from the label."""

  splits = ("test",)

  def __init__(self, correct=False, **kwargs):
    super().__init__(global_batch_size=4, **kwargs)
    self.correct = correct

  def build(self):
    keras.utils.set_random_seed(0)
    self.model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])

  def arrays(self):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(_N, 2)).astype(np.float32)
    return {"x": x, "y": rng.integers(0, 3, _N).astype(np.int32), "index": np.arange(_N, dtype=np.int32)}

  def dataset(self, split, input_context, start_example=0):
    return array_dataset(self.arrays(), input_context, self.global_batch_size, False)

  def decode_step(self, batch):
    prediction = tf.argmax(self.model(batch["x"], training=False), -1, output_type=tf.int32)
    out = {
      "x": batch["x"],
      "label": batch["y"],
      "index": tf.identity(batch["index"]),
      "prediction": prediction,
    }
    if self.correct:
      out["correct"] = tf.equal(prediction, batch["y"])
    return out


class NoDecode(Points):
  decode_step = Task.decode_step


class PassThrough(Points):
  def decode_step(self, batch):
    return {"x": batch["x"], "label": batch["y"]}


def _export(task, tmp_path):
  """Exports the built task; (its serving_default's {input: dtype}, the signature, the loaded SavedModel)."""
  task.build()
  task.export(str(tmp_path / "export"), "test")
  loaded = tf.saved_model.load(str(tmp_path / "export"))
  serve = loaded.signatures["serving_default"]
  return {k: v.dtype.name for k, v in serve.structured_input_signature[1].items()}, serve, loaded


def _decoded(task):
  arrays = task.arrays()
  return {k: v.numpy() for k, v in task.decode_step({k: tf.constant(v) for k, v in arrays.items()}).items()}


def test_undeclared_it_serves_what_the_predictions_read_leaving_out_fields_passed_through(tmp_path):
  task = Points()
  inputs, serve, loaded = _export(task, tmp_path)
  assert inputs == {"x": "float32"}  # Not the label nor the index decode_step passes through.
  out = serve(x=tf.constant(task.arrays()["x"]))
  assert sorted(out) == ["prediction"]
  np.testing.assert_array_equal(out["prediction"].numpy(), _decoded(task)["prediction"])
  # `score` runs eval_step: it takes every field (labels included); this task has no compute_loss.
  assert sorted(loaded.signatures) == ["serving_default"]


def test_an_output_computed_from_the_label_makes_it_an_input_unless_serving_inputs_leave_it_out(tmp_path):
  inputs, serve, _ = _export(Points(correct=True), tmp_path / "undeclared")
  assert inputs == {"x": "float32", "y": "int32"}
  assert sorted(serve.structured_outputs) == ["correct", "prediction"]
  task = Points(correct=True, serving_inputs=("x",))
  inputs, serve, _ = _export(task, tmp_path / "declared")
  assert inputs == {"x": "float32"}
  assert sorted(serve.structured_outputs) == ["prediction"]  # `correct` reads the label: left out.
  out = serve(x=tf.constant(task.arrays()["x"]))
  np.testing.assert_array_equal(out["prediction"].numpy(), _decoded(task)["prediction"])


@pytest.mark.parametrize(
  ("config", "params", "inputs", "outputs"),
  [
    ("spirals.gin", [], {"x": "float32"}, ["prediction", "probability"]),
    ("reverse.gin", ["DigitReversal.hidden_size=16"], {"source": "int32"}, ["decoded"]),
    ("images.gin", ["DigitsClassifier.widths=(8,)"], {"image": "float32"}, ["classes", "probabilities"]),
    (
      "lm.gin",
      ["TransformerLM.num_layers=1", "TransformerLM.model_dim=32", "TransformerLM.num_decode_tokens=4"],
      {"prompt": "int32", "length": "int32"},
      ["greedy", "samples"],
    ),
  ],
  ids=["spirals", "reverse", "images", "lm"],
)
def test_the_shipped_tasks_serve_without_labels_what_their_decode_step_computes(
  tmp_path, config, params, inputs, outputs
):
  from executor.cli.config import parse_config
  from executor.executor import Executor
  from executor.export import export, serving_program

  parse_config([config], params)
  executor = Executor(model_dir=str(tmp_path / "run"))
  executor.runtime.build(executor.tasks)
  program = serving_program(executor)
  serve = tf.saved_model.load(export(executor, str(tmp_path / "exports"))).signatures["serving_default"]
  assert {k: v.dtype.name for k, v in serve.structured_input_signature[1].items()} == inputs
  context = tf.distribute.InputContext()
  batch = next(iter(program.task.dataset(program.split, context)))
  served = serve(**{k: batch[k] for k in inputs})
  assert sorted(served) == outputs
  decoded = program.task.decode_step(batch)
  for name in outputs[:1]:  # The LM's samples draw from its generator: the greedy continuation is compared.
    np.testing.assert_allclose(served[name].numpy(), decoded[name].numpy(), atol=1e-5)


@pytest.mark.parametrize(
  ("task", "message"),
  [
    (
      lambda: Points(serving_inputs=("x", "z")),
      "task 'points' (split 'test'): serving_inputs names 'z', not a field of its batches (index, x, y)",
    ),
    (
      lambda: Points(serving_inputs=("index",)),
      "task 'points' (split 'test'): serving_default has no output to serve from index (prediction read x); "
      "set serving_inputs to the fields of the batch (index, x, y) its predictions read, or override "
      "serving_functions",
    ),
    (
      lambda: Points(serving_inputs=()),
      "task 'points' (split 'test'): serving_default has no output to serve from no field (prediction read x); "
      "set serving_inputs to the fields of the batch (index, x, y) its predictions read, or override "
      "serving_functions",
    ),
    (
      PassThrough,
      "task 'pass_through' (split 'test'): serving_default has no output to serve from no field (its outputs "
      "pass fields through or read none); set serving_inputs to the fields of the batch (index, x, y) its "
      "predictions read, or override serving_functions",
    ),
    (
      NoDecode,
      "task 'no_decode' (split 'test') cannot be exported: serving_default runs decode_step, and NoDecode does "
      "not implement decode_step(); define decode_step or override serving_functions",
    ),
  ],
  ids=["unknown_field", "nothing_to_serve", "no_field", "only_fields_passed_through", "no_decode_step"],
)
def test_what_cannot_be_served_is_one_line_naming_what_to_declare_and_nothing_is_written(
  tmp_path, task, message
):
  with pytest.raises(ConfigError) as error:
    _export(task(), tmp_path)
  assert str(error.value) == message
  assert not (tmp_path / "export").exists()


@pytest.mark.parametrize(
  ("make", "message"),
  [
    (
      lambda: Points(serving_inputs="x"),
      "Points.serving_inputs must be a tuple of batch field names, got 'x'",
    ),
    (
      lambda: KerasTask(model_fn=digits_mlp, dataset_fn=digits_data, serving_inputs=("x",)),
      "KerasTask.serving_inputs does not apply: KerasTask.export decides what its serving signature takes (a "
      "KerasTask serves its model's inputs: name them with keras.Input(name=...))",
    ),
  ],
  ids=["a_string", "keras_task"],
)
def test_serving_inputs_that_cannot_apply_are_refused_when_the_task_is_made(make, message):
  with pytest.raises(ConfigError) as error:
    make()
  assert str(error.value).splitlines()[0] == message  # The CLI's line; gin adds where it was called.
