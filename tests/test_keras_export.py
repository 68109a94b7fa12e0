"""Which names a Keras model serves under: its inputs' and outputs' own, the data's for a model without declared
inputs, and `inputs` / `prediction` for names Keras made up (they change with the layers a process made)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from programs.core.keras_export import export_model


def _signature(model, tmp_path, features):
  export_model(model, str(tmp_path / "export"), features)
  serve = tf.saved_model.load(str(tmp_path / "export")).signatures["serving_default"]
  return serve, {k: v.dtype.name for k, v in serve.structured_input_signature[1].items()}


class Subclassed(keras.Model):
  """Takes a dict of features, returns a dict of outputs; it declares no inputs."""

  def __init__(self):
    super().__init__()
    self.dense = keras.layers.Dense(2)

  def call(self, x):
    logits = self.dense(tf.concat([x["a"], tf.cast(x["b"], tf.float32)], -1))
    return {"logits": logits, "best": tf.argmax(logits, -1)}


def test_a_model_without_declared_inputs_serves_the_features_of_the_data_by_their_keys(tmp_path):
  model = Subclassed()
  x = {"a": np.ones((3, 2), np.float32), "b": np.arange(3, dtype=np.int32)[:, None]}
  expected = model(x)
  features = {"a": tf.TensorSpec([2], tf.float32), "b": tf.TensorSpec([1], tf.int32)}
  serve, inputs = _signature(model, tmp_path, features)
  assert inputs == {"a": "float32", "b": "int32"}
  out = serve(a=tf.constant(x["a"]), b=tf.constant(x["b"]))
  assert sorted(out) == ["best", "logits"]
  np.testing.assert_allclose(out["logits"], expected["logits"], atol=1e-6)


@pytest.mark.parametrize("named", [True, False])
def test_a_list_of_inputs_and_outputs_serves_their_names_or_numbered_ones_for_names_keras_made_up(
  tmp_path, named
):
  a = keras.Input((2,), name="length" if named else None)
  b = keras.Input((3,), name="width" if named else None)
  hidden = keras.layers.Dense(4)(keras.layers.concatenate([a, b]))
  outputs = [
    keras.layers.Dense(1, name="area" if named else None)(hidden),
    keras.layers.Dense(2, name="kind" if named else None)(hidden),
  ]
  model = keras.Model([a, b], outputs)
  serve, inputs = _signature(model, tmp_path, None)
  names = (
    (["length", "width"], ["area", "kind"])
    if named
    else (["inputs_0", "inputs_1"], ["prediction_0", "prediction_1"])
  )
  assert sorted(inputs) == names[0]
  x = [np.ones((2, 2), np.float32), np.ones((2, 3), np.float32)]
  out = serve(**{n: tf.constant(v) for n, v in zip(names[0], x)})
  assert sorted(out) == names[1]
  for name, expected in zip(names[1], model.predict(x, verbose=0)):
    np.testing.assert_allclose(out[name], expected, atol=1e-6)


def test_a_sequential_serves_its_input_by_the_name_it_was_declared_with(tmp_path):
  # A Sequential has no `model.input` until called on a symbolic tensor; its `inputs` name the keras.Input.
  model = keras.Sequential([keras.Input((3,), name="features"), keras.layers.Dense(2, name="score")])
  serve, inputs = _signature(model, tmp_path, tf.TensorSpec([3], tf.float32))
  assert inputs == {"features": "float32"}
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  np.testing.assert_allclose(serve(features=tf.constant(x))["score"], model.predict(x, verbose=0), atol=1e-6)


def test_a_keras_task_on_examples_without_labels_exports_the_model_on_them(tmp_path):
  """A GAN's or an autoencoder's data is `x` alone (`image_dataset_from_directory(label_mode=None)`), as fit
  takes it: the export reads the features from a dataset that is not a tuple."""
  from programs.core import KerasTask
  from programs.core.runtime import Runtime

  class Scorer(keras.Model):  # Declares no inputs: served on the data's features, `inputs`.
    def __init__(self):
      super().__init__()
      self.dense = keras.layers.Dense(1)

    def call(self, x):
      return self.dense(x)

  def model_fn():
    model = Scorer()
    model.compile(optimizer="adam")
    return model

  images = np.linspace(0, 1, 24, dtype=np.float32).reshape(8, 3)
  task = KerasTask(
    model_fn=model_fn,
    dataset_fn=lambda split: tf.data.Dataset.from_tensor_slices(images),
    global_batch_size=4,
  )
  Runtime().build([task])
  assert task.export(str(tmp_path / "export"), "test") == ["serve", "serving_default"]
  serve = tf.saved_model.load(str(tmp_path / "export")).signatures["serving_default"]
  assert {k: v.shape.as_list() for k, v in serve.structured_input_signature[1].items()} == {
    "inputs": [None, 3]
  }
  (served,) = serve(inputs=tf.constant(images)).values()
  np.testing.assert_allclose(served, task.model.predict(images, verbose=0), atol=1e-6)
