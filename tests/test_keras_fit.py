"""KerasTask runs Keras code as `fit` users write it, with the numbers `fit` and `evaluate` give.

Each test trains the same model from the same weights on the same batches in the same order (no shuffling), once
with `model.fit` and once with the executor's programs, a train loop standing for an epoch, and compares what both
log (under `fit`'s names) and the weights; then `evaluate` against an eval program. Features: several outputs with
`loss_weights`, `metrics` and `weighted_metrics`, sample weights from the data, `class_weight`, a model's own
`train_step`/`test_step` (a GAN with two optimizers), mixed precision. What `fit` refuses is refused in one line.
"""

import keras
import keras_models as km
import numpy as np
import pytest
import tensorflow as tf
from conftest import ready_programs

from programs import DecodeProgram, EvalProgram, TrainProgram
from programs.core import KerasTask, Runtime
from programs.core.errors import ConfigError

BATCH, STEPS = 32, 5


def _programs(task, model_dir, strategy_fn=None, precision="float32", eval_split="test"):
  """(train, eval) programs of `task`, prepared on a runtime built as the executor builds it."""
  train = TrainProgram(task, steps_per_loop=STEPS)
  evaluate = EvalProgram(task, split=eval_split, steps_per_loop=3) if eval_split else None
  runtime = Runtime(strategy_fn, precision=precision) if strategy_fn else Runtime(precision=precision)
  runtime.build([task])
  for program in (train, evaluate)[: 2 if evaluate else 1]:
    program.prepare(runtime, str(model_dir))
  return train, evaluate


def _reference(task, precision="float32"):
  """A fresh model from `task.model_fn`, outside any strategy, holding the task model's variables (seeds too)."""
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy(precision)
  try:
    model = task.model_fn()
  finally:
    keras.config.set_dtype_policy(previous)
  x, _, _ = keras.utils.unpack_x_y_sample_weight(next(iter(task.dataset_fn("train").batch(2))))
  model(x)
  assert len(model.variables) == len(task.model.variables)
  for theirs, ours in zip(model.variables, task.model.variables):
    theirs.assign(ours.numpy())
  return model


def _train_batches(task):
  return task.dataset_fn("train").repeat().batch(BATCH, drop_remainder=True)


def _assert_logs_equal(ours, theirs, rel=1e-5):
  assert set(ours) == set(theirs), (sorted(ours), sorted(theirs))
  for name, value in theirs.items():
    assert ours[name] == pytest.approx(value, rel=rel, abs=1e-6), name


def _assert_same_weights(task, model, rtol=1e-5):
  for ours, theirs in zip(task.model.variables, model.variables):
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=rtol, atol=1e-6, err_msg=ours.path)


def _fit_and_compare(task, train, evaluate, fit_args=None, precision="float32", loops=2, rel=1e-5):
  """Trains `loops` loops and as many epochs of `fit`; compares each loop's metrics with the epoch's logs, the
  weights, and an eval run with `evaluate`. Returns the last loop's metrics."""
  model = _reference(task, precision)
  ours = [train.run().metrics for _ in range(loops)]
  history = model.fit(
    _train_batches(task), epochs=loops, steps_per_epoch=STEPS, verbose=0, **(fit_args or {})
  ).history
  for i, metrics in enumerate(ours):
    _assert_logs_equal(metrics, {name: values[i] for name, values in history.items()}, rel)
  _assert_same_weights(task, model, rtol=max(rel, 1e-5))
  if evaluate is not None:
    expected = model.evaluate(task.dataset_fn("test").batch(BATCH), verbose=0, return_dict=True)
    _assert_logs_equal(evaluate.run().metrics, expected, rel)
  return ours[-1]


def test_several_outputs_with_loss_weights_metrics_weighted_metrics_and_sample_weights(tmp_path):
  keras.utils.set_random_seed(3)
  task = KerasTask(km.two_heads_model, km.two_heads_data, global_batch_size=BATCH, shuffle_buffer=0)
  train, evaluate = _programs(task, tmp_path)
  metrics = _fit_and_compare(task, train, evaluate)
  # fit's names: the total, each output's (unweighted) loss, each output's metrics and weighted metrics.
  assert set(metrics) == {"loss", "kind_loss", "size_loss", "kind_accuracy", "size_mae", "kind_weighted_acc"}
  assert metrics["kind_accuracy"] != metrics["kind_weighted_acc"]  # The sample weights count in one only.


def test_per_output_losses_over_two_replicas_equal_evaluate(tmp_path, mirrored):
  task = KerasTask(km.two_heads_model, km.two_heads_data, global_batch_size=BATCH, shuffle_buffer=0)
  train, evaluate = _programs(task, tmp_path, mirrored)
  train.run()
  expected = _reference(task).evaluate(task.dataset_fn("test").batch(BATCH), verbose=0, return_dict=True)
  _assert_logs_equal(evaluate.run().metrics, expected)


@pytest.mark.parametrize("one_hot", [False, True], ids=["sparse_labels", "one_hot_labels"])
def test_class_weight_weighs_examples_as_fit_does(tmp_path, one_hot):
  class_weight = {0: 3.0, 2: 0.5}  # Class 1 is not listed: it weighs 1.
  task = KerasTask(
    lambda: km.classes_model(one_hot),
    lambda split: km.classes_data(split, one_hot),
    class_weight=class_weight,
    global_batch_size=BATCH,
    shuffle_buffer=0,
  )
  train, evaluate = _programs(task, tmp_path)
  metrics = _fit_and_compare(task, train, evaluate, {"class_weight": class_weight})
  assert metrics["accuracy"] != metrics["wacc"]


def test_a_gan_with_its_own_train_step_and_two_optimizers_trains_as_fit_trains_it(tmp_path):
  task = KerasTask(km.gan_model, km.gan_data, global_batch_size=BATCH, shuffle_buffer=0)
  train, _ = _programs(task, tmp_path, eval_split=None)
  assert train.task_writes_its_step
  # Both optimizers were built before any trace, with the variables each applies to.
  assert task.model.d_optimizer.built and task.model.g_optimizer.built
  slots = [v for v in task.model.d_optimizer.variables if "discriminator" in v.path]
  assert len(slots) == 2 * len(task.model.discriminator.trainable_weights)  # Adam: two per variable.
  metrics = _fit_and_compare(task, train, None)
  assert set(metrics) == {"d_loss", "g_loss"}  # The step's logs; it has no one loss.
  assert int(task.model.g_optimizer.iterations.numpy()) == 2 * STEPS


def test_own_train_step_and_test_step_equal_fit_and_evaluate(tmp_path):
  task = KerasTask(km.regressor_model, km.regressor_data, global_batch_size=BATCH, shuffle_buffer=0)
  train, evaluate = _programs(task, tmp_path)
  metrics = _fit_and_compare(task, train, evaluate)
  assert set(metrics) == {"loss", "mse", "abs_error"}


def test_own_train_step_over_two_replicas_trains_as_on_one_device(tmp_path, mirrored):
  """Each replica's trackers count its own examples; summed, they are the one-device numbers."""
  results = []
  for name, strategy in (("one", None), ("two", mirrored)):
    keras.utils.set_random_seed(0)
    task = KerasTask(km.regressor_model, km.regressor_data, global_batch_size=BATCH, shuffle_buffer=0)
    train, evaluate = _programs(task, tmp_path / name, strategy)
    results.append((train.run().metrics, evaluate.run().metrics, [v.numpy() for v in task.model.variables]))
  (train_a, eval_a, weights_a), (train_b, eval_b, weights_b) = results
  # abs_error counts examples; the loss tracker takes the step's loss, which Keras divides by the replica count.
  assert train_b["abs_error"] == pytest.approx(train_a["abs_error"], rel=1e-5)
  assert eval_b == pytest.approx(eval_a, rel=1e-5)
  for a, b in zip(weights_a, weights_b):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains_as_fit_under_the_same_policy(tmp_path, precision):
  task = KerasTask(km.two_heads_model, km.two_heads_data, global_batch_size=BATCH, shuffle_buffer=0)
  train, evaluate = _programs(task, tmp_path, precision=precision)
  assert task.model.dtype_policy.name == precision
  assert isinstance(task.optimizer, keras.optimizers.LossScaleOptimizer) == (precision == "mixed_float16")
  _fit_and_compare(task, train, evaluate, precision=precision, rel=1e-3)


class OwnLoss(keras.Sequential):
  """Overrides compute_loss and tracks it, as keras.io's "customizing fit" guide does."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.own_loss = keras.metrics.Mean(name="own_loss")

  def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
    loss = keras.ops.mean(keras.ops.abs(y_pred - y)) + keras.ops.sum(self.losses)
    self.own_loss.update_state(loss)
    return loss


def test_a_model_s_own_compute_loss_and_its_tracker_equal_fit(tmp_path):
  def model_fn():
    model = OwnLoss(
      [keras.Input((5,)), keras.layers.Dense(4, kernel_regularizer="l2"), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(0.05), metrics=["mse"])
    return model

  task = KerasTask(model_fn, km.regressor_data, global_batch_size=BATCH, shuffle_buffer=0)
  train, evaluate = _programs(task, tmp_path)
  assert set(_fit_and_compare(task, train, evaluate)) == {"loss", "mse", "own_loss"}


class Argmax(keras.Sequential):
  """Predicts classes, not probabilities: its own predict_step."""

  def predict_step(self, data):
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    return tf.argmax(self(x, training=False), axis=-1)


def test_a_decode_runs_the_model_s_own_predict_step(tmp_path):
  def model_fn():
    model = Argmax([keras.Input((6,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy")
    return model

  task = KerasTask(model_fn, km.classes_data, global_batch_size=BATCH)
  decode = DecodeProgram(task, split="test", steps_per_loop=4, async_postprocess=False)
  ready_programs(task, [decode], tmp_path)
  predictions = decode.run().per_example["prediction"]
  expected = _reference(task).predict(task.dataset_fn("test").map(lambda x, y: x).batch(BATCH), verbose=0)
  assert predictions.dtype == np.int64 and predictions.shape == (km.NUM,)
  np.testing.assert_array_equal(predictions, expected)
  decode.close()


# ----- Refused, as fit refuses them, in one line naming the alternative ------------------------------------


def test_the_program_s_step_policy_with_a_model_s_own_train_step_is_refused(tmp_path):
  task = KerasTask(km.gan_model, km.gan_data, global_batch_size=BATCH)
  train = TrainProgram(task, clip_gradient_norm=1.0)
  with pytest.raises(
    ConfigError, match=r"clip_gradient_norm apply to .* writes its own train_step \(GAN.train_step\)"
  ):
    ready_programs(task, [train], tmp_path)


def test_a_train_step_that_logs_a_tensor_is_refused_in_one_line(tmp_path):
  class Logger(km.GAN):
    def train_step(self, real):
      logs = super().train_step(real)
      return {**logs, "fake": self.generator(tf.zeros((2, self.latent)))}

  def model_fn():
    model = Logger()
    model.compile(keras.optimizers.Adam(), keras.optimizers.Adam(), keras.losses.BinaryCrossentropy())
    return model

  task = KerasTask(model_fn, km.gan_data, global_batch_size=BATCH)
  with pytest.raises(
    ConfigError, match=r"Logger.train_step returns the log 'fake' of shape \(2, 4\); the executor"
  ):
    ready_programs(task, [TrainProgram(task)], tmp_path)


def test_class_weight_with_several_outputs_is_refused(tmp_path):
  task = KerasTask(km.two_heads_model, lambda s: km.two_heads_data(s, False), class_weight={0: 2.0})
  with pytest.raises(ConfigError, match="class_weight is for a model with one output .*third element"):
    ready_programs(task, [], tmp_path)


def test_class_weight_with_sample_weights_in_the_data_is_refused(tmp_path):
  def data(split):
    return km.classes_data(split).map(lambda x, y: (x, y, tf.ones(())))

  task = KerasTask(km.classes_model, data, class_weight={0: 2.0})
  with pytest.raises(
    ConfigError, match="cannot both be used .*multiply the class weights into the sample weights"
  ):
    ready_programs(task, [], tmp_path)


def test_class_weight_with_examples_that_have_no_labels_is_refused_naming_them(tmp_path):
  # Examples that are x alone (no labels): before the fix, a TypeError ('TensorSpec' object is not iterable).
  def data(split):
    return km.classes_data(split).map(lambda x, y: x)

  task = KerasTask(km.classes_model, data, class_weight={0: 2.0})
  with pytest.raises(ConfigError, match="class_weight is for a model with one output .* have no labels"):
    ready_programs(task, [], tmp_path)


@pytest.mark.parametrize("class_weight", [{"a": 1.0}, {0: float("nan")}, {-1: 2.0}, [1.0, 2.0]])
def test_a_bad_class_weight_is_refused(class_weight):
  with pytest.raises(ConfigError, match="KerasTask.class_weight"):
    KerasTask(km.classes_model, km.classes_data, class_weight=class_weight)


def test_a_model_that_does_not_fit_its_data_fails_in_one_line_naming_the_split_and_spec(tmp_path):
  def misfit_model():  # One-hot city codes of shape (1, 5) into an input of shape (5,): the lead's case.
    inputs = keras.Input((5,), name="city")
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.Dense(4)(inputs)))
    model.compile("adam", "mse")
    return model

  def data(split):
    return tf.data.Dataset.from_tensor_slices((np.zeros((8, 1, 5), "float32"), np.zeros((8, 1), "float32")))

  task = KerasTask(misfit_model, data, name="misfit")
  with pytest.raises(ConfigError) as error:
    ready_programs(task, [], tmp_path)
  message = str(error.value)
  assert "\n" not in message
  assert "KerasTask 'misfit': the model of model_fn does not fit the examples of split 'train'" in message
  assert (
    "(element spec 0: float32(None, 1, 5), 1: float32(None, 1)): ValueError: Input 0 with name 'city'"
    in message
  )
  assert "expected shape=(None, 5), found shape=(None, 1, 5)" in message
