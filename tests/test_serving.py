"""A Keras model with features by name (keras.io's structured-data style), trained as a KerasTask from its own
folder and exported from another, serves as `serve(age=..., ca=..., thal=...)` in a process with TensorFlow alone:
the model's predictions, under its own input and output names, no label."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO
from serving_util import serve, shown_signatures

_HEART = textwrap.dedent(
  '''
  """Heart disease in small: numeric and categorical features by name, as in keras.io's structured-data example."""
  import gin
  import keras
  import numpy as np
  import tensorflow as tf

  THAL = ["fixed", "normal", "reversible"]


  def features(split):
    """({name: column [n, 1]}, target [n, 1]) of `split`, drawn from a seed."""
    rng = np.random.default_rng(0 if split == "train" else 1)
    n = 512 if split == "train" else 40
    age = rng.integers(29, 78, (n, 1)).astype("float32")
    ca = rng.integers(0, 4, (n, 1)).astype("int64")
    thal = rng.choice(THAL, (n, 1)).astype(object)
    target = ((age > 55) & (ca > 0) | (thal == "reversible")).astype("float32")
    return {"age": age, "ca": ca, "thal": thal}, target


  @gin.configurable
  def heart_examples(split):
    return tf.data.Dataset.from_tensor_slices(features(split))


  @gin.configurable
  def served_heart_model():  # A name no other test module registers with gin (one pytest process runs many).
    inputs = {
      "age": keras.Input((1,), name="age"),
      "ca": keras.Input((1,), name="ca", dtype="int64"),
      "thal": keras.Input((1,), name="thal", dtype="string"),
    }
    encoded = keras.layers.concatenate(
      [
        keras.layers.Normalization(mean=53.0, variance=81.0)(inputs["age"]),
        keras.layers.IntegerLookup(vocabulary=[0, 1, 2, 3], output_mode="one_hot")(inputs["ca"]),
        keras.layers.StringLookup(vocabulary=THAL, output_mode="one_hot")(inputs["thal"]),
      ]
    )
    hidden = keras.layers.Dense(16, activation="relu")(encoded)
    output = keras.layers.Dense(1, activation="sigmoid", name="heart_disease")(hidden)
    model = keras.Model(inputs, output)
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model
  '''
)

_GIN = """
import heart

Executor.task = @KerasTask()
KerasTask.model_fn = @served_heart_model
KerasTask.dataset_fn = @heart_examples
KerasTask.global_batch_size = 32
Executor.max_steps = 40
TrainProgram.steps_per_loop = 20
SimpleProgramSchedule.eval_programs = [@EvalProgram, @DecodeProgram]
"""


def _cli(args, cwd):
  return subprocess.run(
    [sys.executable, "-m", "executor.cli.main", *args],
    cwd=cwd,
    env=dict(os.environ, PYTHONPATH=str(REPO)),
    capture_output=True,
    text=True,
    timeout=600,
  )


@pytest.mark.slow
def test_a_keras_model_with_named_features_serves_them_by_name_and_equals_model_predict(tmp_path):
  from executor.cli.config import parse_run_config
  from executor.executor import Executor

  folder, elsewhere = tmp_path / "heart", tmp_path / "elsewhere"
  folder.mkdir()
  elsewhere.mkdir()
  (folder / "heart.py").write_text(_HEART)
  (folder / "heart.gin").write_text(_GIN)
  trained = _cli(["--gin_search_path=.", "--gin_file=heart.gin", "--model_dir=runs/heart"], cwd=folder)
  assert trained.returncode == 0, trained.stderr[-3000:]
  run = folder / "runs" / "heart"
  exported = _cli(["export", f"--model_dir={run}"], cwd=elsewhere)  # The run's folder and module: recorded.
  assert exported.returncode == 0, exported.stderr[-3000:]
  export = exported.stdout.strip().splitlines()[-1]
  assert export == str(run / "export" / "40")

  parse_run_config(str(run), [], [], operative=True)  # What `executor export` did, in this process.
  import heart

  x, _ = heart.features("test")
  keras.utils.clear_session(
    free_memory=False
  )  # Keras names unnamed layers by what this process built before.
  model = Executor(model_dir=str(run)).load_model().model
  expected = model.predict({k: tf.constant(v) for k, v in x.items()}, verbose=0)
  (served,) = serve([(export, {**x, "thal": x["thal"].astype(str)})], tmp_path)
  assert served["inputs"] == {"age": "float32", "ca": "int64", "thal": "string"}  # No label.
  assert served["signatures"] == ["serve", "serving_default"]
  np.testing.assert_allclose(served["outputs"]["heart_disease"], expected, atol=1e-6)
  assert 0.0 < np.std(expected)  # Predictions that differ by example: the features were all read.
  assert shown_signatures(export)["serving_default"] == {
    "inputs": {"age": "DT_FLOAT", "ca": "DT_INT64", "thal": "DT_STRING"},
    "outputs": {"heart_disease": "DT_FLOAT"},
  }
