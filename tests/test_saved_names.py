"""A model built after others in the process (a notebook that looked at it first, a test session) restores its
run's checkpoints: Keras names layers with process-wide counters (`dense_8` for the run's `dense_1`), and the items
saved by name (the variables' index, optimizer slots, preprocessing state) are matched to the checkpoint's names
(`programs.core.saved_names`); a checkpoint of another model is still refused in one line."""

import os

import gin
import keras
import keras_models
import pytest
from test_keras_resume import BASE, CELLS, STEPS, _assert_same_checkpoint, _train

from executor.cli.main import run
from programs.core.errors import ConfigError
from programs.core.saved_names import pair_names


def test_names_alike_but_for_keras_counters_pair_in_the_order_the_counters_give():
  ours = ["block_3/dense_8/kernel", "dense_9/kernel", "dense_10/kernel", "normalization_5/mean", "seed"]
  theirs = ["block/dense/kernel", "dense_1/kernel", "dense_2/kernel", "normalization/mean", "seed"]
  assert pair_names(ours, theirs) == dict(zip(ours, theirs))
  # The counters moved by one: `dense_3` is the checkpoint's second layer, not this process' first.
  assert pair_names(["dense_3/kernel", "dense_4/kernel"], ["dense_2/kernel", "dense_3/kernel"]) == {
    "dense_3/kernel": "dense_2/kernel",
    "dense_4/kernel": "dense_3/kernel",
  }
  # Optimizer slots are named after the variable's path.
  assert pair_names(["dense_7_kernel_momentum", "iteration"], ["dense_kernel_momentum", "iteration"]) == {
    "dense_7_kernel_momentum": "dense_kernel_momentum",
    "iteration": "iteration",
  }
  # Another model: a layer more (no pairing by counters), another name (none).
  assert pair_names(["dense_1/kernel", "dense_2/kernel"], ["dense/kernel"]) == {}
  assert pair_names(["dense_1/kernel", "head/kernel"], ["dense/kernel", "tail/kernel"]) == {
    "dense_1/kernel": "dense/kernel"
  }


def _built_before(cell: str) -> None:
  """Builds other models and the cell's own once, as a notebook does before loading a run."""
  keras_models.classes_model()
  {"preprocessing": keras_models.table_model, "gan": keras_models.gan_model}[cell]()


def _resume(model_dir, params, steps):
  """`_train` without the fresh Keras session: the layers are named after every one built before."""
  return run(str(model_dir), [], [*BASE, *params, f"Executor.max_steps = {steps}"], deterministic=True)


@pytest.mark.parametrize("cell", ["preprocessing", "gan"])
def test_a_run_resumed_after_other_models_were_built_in_the_process_resumes_bit_exactly(tmp_path, cell):
  assert _train(tmp_path / "reference", CELLS[cell], STEPS) == STEPS
  assert _train(tmp_path / "run", CELLS[cell], STEPS // 2) == STEPS // 2
  _built_before(cell)
  assert _resume(tmp_path / "run", CELLS[cell], STEPS) == STEPS
  # Every tensor equal under the same key: the resumed run also writes the names its checkpoint had.
  _assert_same_checkpoint(tmp_path / "run", tmp_path / "reference", STEPS)


@gin.configurable
def stack_model(widths=(8,)):
  """Dense layers Keras names (`dense`, `dense_1`, ...), `widths` wide."""
  model = keras.Sequential(
    [keras.Input((6,)), *[keras.layers.Dense(w) for w in widths], keras.layers.Dense(3)]
  )
  model.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
  return model


@pytest.mark.parametrize("widths", ["(16,)", "(8, 8)"])
def test_another_model_is_refused_in_one_line_after_other_models_were_built(tmp_path, widths):
  params = ["KerasTask.model_fn = @stack_model", "KerasTask.dataset_fn = @classes_data"]
  assert _train(tmp_path / "run", params, 5) == 5
  before = sorted(os.listdir(tmp_path / "run" / "checkpoints"))
  stack_model()
  with pytest.raises(ConfigError) as error:
    _resume(tmp_path / "run", [*params, f"stack_model.widths = {widths}"], 10)
  message = str(error.value)
  assert "does not fit this model" in message and "\n" not in message
  wrong = "[6, 16] float32" if widths == "(16,)" else "not in the checkpoint"
  assert wrong in message
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == before
