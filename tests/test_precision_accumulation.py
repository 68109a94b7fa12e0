"""Mixed precision and gradient accumulation in the train program's step, on real TensorFlow."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import ready_programs

from executor.checkpoints import Checkpointer
from executor.tasks.keras_digits import digits_data, digits_mlp
from executor.tasks.spirals import SpiralsClassifier
from programs import TrainProgram
from programs.core import KerasTask
from programs.core.errors import ConfigError
from programs.core.runtime import Runtime


def _spirals(**kwargs):
  kwargs.setdefault("hidden_sizes", (16, 16))
  return SpiralsClassifier(
    global_batch_size=64, optimizer_fn=lambda: keras.optimizers.SGD(0.1), seed=3, **kwargs
  )


@pytest.mark.parametrize("mirrored_run", [False, True], ids=["default", "mirrored"])
def test_k_micro_batches_equal_one_big_batch(tmp_path, mirrored, mirrored_run):
  weights = {}
  for k in (1, 4):
    keras.utils.set_random_seed(0)
    task = _spirals()
    train = TrainProgram(task, steps_per_loop=5, accumulate_steps=k, name=f"train_{k}")
    runtime = ready_programs(task, [train], tmp_path / str(k), mirrored if mirrored_run else None)
    results = [train.run() for _ in range(3)]
    assert runtime.step() == 15  # Updates, not micro-batches.
    assert results[-1].examples == 5 * 64
    weights[k] = [v.numpy() for v in task.model.trainable_variables]
  # Float32 sums in another order: equal to within 1e-5 (absolute and relative) after 15 updates.
  for a, b in zip(weights[1], weights[4]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_bad_accumulation_and_precision_settings_are_refused(tmp_path):
  with pytest.raises(ConfigError, match="accumulate_steps must be an integer >= 1, got 0"):
    TrainProgram(_spirals(), accumulate_steps=0)
  with pytest.raises(ConfigError, match=r"does not divide into 1 replica\(s\) x accumulate_steps 5"):
    ready_programs(_spirals(), [TrainProgram(_spirals(), accumulate_steps=5)], tmp_path)
  with pytest.raises(
    ConfigError, match="Runtime.precision must be one of float32, mixed_bfloat16, mixed_float16"
  ):
    Runtime(precision="float8")
  with pytest.raises(ConfigError, match="Runtime.loss_scale_growth_steps must be an integer >= 1, got 0"):
    Runtime(precision="mixed_float16", loss_scale_growth_steps=0)
  with pytest.raises(ConfigError, match="Runtime.initial_loss_scale must be > 0, got -1"):
    Runtime(precision="mixed_float16", initial_loss_scale=-1)


def test_mixed_bfloat16_computes_in_bfloat16_and_keeps_float32_variables(tmp_path):
  task = _spirals()
  train = TrainProgram(task, steps_per_loop=5)
  runtime = Runtime(precision="mixed_bfloat16")
  runtime.build([task])
  train.prepare(runtime, str(tmp_path))
  result = train.run()
  assert np.isfinite(result.metrics["loss"])
  assert all(v.dtype == "float32" for v in task.model.trainable_variables)
  assert task.model.layers[0].compute_dtype == "bfloat16"
  assert keras.config.dtype_policy().name == "float32"  # The global policy is left as it was.


class BlowUp(SpiralsClassifier):
  """Spirals whose loss can be made huge: its float16 gradients overflow while the loss stays finite."""

  def build(self):
    super().build()
    self.blow_up = tf.Variable(False, trainable=False)

  def compute_loss(self, batch, training):
    loss, metrics, per_example = super().compute_loss(batch, training)
    return tf.cast(loss, tf.float32) * tf.where(self.blow_up, 1e30, 1.0), metrics, per_example


def test_float16_overflow_lowers_the_loss_scale_skips_the_update_and_the_scale_is_checkpointed(tmp_path):
  task = BlowUp(global_batch_size=64, hidden_sizes=(16,), optimizer_fn=lambda: keras.optimizers.SGD(0.1))
  train = TrainProgram(task, steps_per_loop=1)
  runtime = Runtime(precision="mixed_float16")
  runtime.build([task])
  train.prepare(runtime, str(tmp_path / "run"))
  assert isinstance(task.optimizer, keras.optimizers.LossScaleOptimizer)
  first = train.run()
  assert first.metrics["loss"] < 10 and int(task.optimizer.iterations.numpy()) == 1
  scale = float(task.optimizer.dynamic_scale.numpy())
  before = [v.numpy() for v in task.model.trainable_variables]
  task.blow_up.assign(True)
  train.run()
  assert float(task.optimizer.dynamic_scale.numpy()) == scale / 2
  assert int(task.optimizer.iterations.numpy()) == 1  # The update was skipped ...
  for a, v in zip(before, task.model.trainable_variables):
    np.testing.assert_array_equal(a, v.numpy())  # ... and the weights did not move.
  task.blow_up.assign(False)
  train.run()
  assert int(task.optimizer.iterations.numpy()) == 2
  checkpointer = Checkpointer()
  checkpointer.attach(str(tmp_path / "ckpt"), runtime.step_counter, task.checkpoint_items())
  checkpointer.save()

  fresh = BlowUp(global_batch_size=64, hidden_sizes=(16,), optimizer_fn=lambda: keras.optimizers.SGD(0.1))
  fresh_runtime = Runtime(precision="mixed_float16")
  fresh_runtime.build([fresh])
  other = Checkpointer()
  other.attach(str(tmp_path / "ckpt"), fresh_runtime.step_counter, fresh.checkpoint_items())
  assert other.restore() == 3
  assert float(fresh.optimizer.dynamic_scale.numpy()) == scale / 2


def test_the_runtime_loss_scale_settings_hold_for_an_optimizer_keras_compile_wrapped(tmp_path):
  # A KerasTask's model is compiled under the float16 policy, so Keras wraps its optimizer itself (with Keras'
  # defaults); the runtime's settings must still be the ones that train it.
  task = KerasTask(model_fn=digits_mlp, dataset_fn=digits_data, global_batch_size=64)
  runtime = Runtime(precision="mixed_float16", initial_loss_scale=2.0**10, loss_scale_growth_steps=3)
  runtime.build([task])
  assert isinstance(task.optimizer, keras.optimizers.LossScaleOptimizer)
  assert float(task.optimizer.dynamic_scale.numpy()) == 2.0**10
  train = TrainProgram(task, steps_per_loop=3)
  train.prepare(runtime, str(tmp_path))
  assert np.isfinite(train.run().metrics["loss"])
  # Three steps without an overflow at 2^10 (the inputs are small): the scale doubled once, after step 3.
  assert float(task.optimizer.dynamic_scale.numpy()) == 2.0**11
