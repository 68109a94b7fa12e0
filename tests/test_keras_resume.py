"""A KerasTask resumes exactly whatever Keras code it runs: a run stopped at a checkpoint and started again ends
with the same checkpoint, tensor for tensor, as one never stopped (`--deterministic`).

| cell              | what it holds                                                                    | precision      | devices  |
|-------------------|----------------------------------------------------------------------------------|----------------|----------|
| two_heads         | two outputs, loss_weights, weighted_metrics, sample weights, Dropout, shuffled tf.data | float32  | one      |
| two_heads_float16 | the same                                                                         | mixed_float16  | mirrored |
| two_heads_bf16    | the same                                                                         | mixed_bfloat16 | one      |
| class_weight      | class_weight                                                                     | float32        | one      |
| gan               | its own train_step, two optimizers, trackers, a SeedGenerator                    | float32        | one      |
| preprocessing     | Normalization, Discretization, StringLookup, IntegerLookup, TextVectorization, adapted | float32  | one      |
| rng               | RandomFlip, Dropout, GaussianNoise, SeedGenerators from __init__ and build, 2 levels deep | float32 | one     |

And: a lookup that `adapt` fills with another vocabulary on the resume takes the checkpoint's (so the run still
ends where the uninterrupted one does); one given another vocabulary is refused; a GAN killed with SIGKILL (a real
process, killed once it holds at a known step) resumes bit-exactly.
"""

import os
import time

import gin
import keras
import keras_models  # noqa: F401  (registers the models with gin)
import numpy as np
import pytest
import tensorflow as tf
from faults_util import Executor as Process
from test_resume import checkpoint_state

from executor.cli.main import run
from programs.core.errors import ConfigError

STEPS = 20
BASE = [
  "Executor.task = @KerasTask()",
  "KerasTask.global_batch_size = 32",
  "Executor.schedule = @SimpleProgramSchedule",
  "TrainProgram.steps_per_loop = 5",
  "SimpleProgramSchedule.train_executions_per_eval = 1",
  "SimpleProgramSchedule.eval_programs = []",
  "Checkpointer.save_interval_steps = 10",
]
_SESSION = {}


@gin.register
def keras_session_mirrored_strategy() -> tf.distribute.Strategy:
  """The session's mirrored strategy (collective keys are process-wide: one strategy per process)."""
  return _SESSION["mirrored"]()


def _task(name, **bindings):
  return [f"KerasTask.model_fn = @{name}_model", f"KerasTask.dataset_fn = @{name}_data"] + [
    f"{k} = {v}" for k, v in bindings.items()
  ]


CELLS = {
  "two_heads": _task("two_heads"),
  "two_heads_float16": [
    *_task("two_heads"),
    "Runtime.precision = 'mixed_float16'",
    "Runtime.loss_scale_growth_steps = 3",
    "Runtime.strategy_fn = @keras_session_mirrored_strategy",
  ],
  "two_heads_bf16": [*_task("two_heads"), "Runtime.precision = 'mixed_bfloat16'"],
  "class_weight": [*_task("classes"), "KerasTask.class_weight = {0: 3.0, 2: 0.5}"],
  "gan": _task("gan"),
  "preprocessing": _task("table"),
  "rng": _task("noisy"),
}


def _train(model_dir, params, steps, gin_files=()):
  # Auto-named layers and seed generators named as in a new process.
  keras.utils.clear_session(free_memory=False)
  return run(
    str(model_dir), list(gin_files), [*BASE, *params, f"Executor.max_steps = {steps}"], deterministic=True
  )


def _assert_same_checkpoint(a, b, step):
  path_a, state_a = checkpoint_state(a)
  path_b, state_b = checkpoint_state(b)
  assert path_a.endswith(f"ckpt-{step}") and path_b.endswith(f"ckpt-{step}")
  assert state_a.keys() == state_b.keys()
  for key in state_a:
    assert np.array_equal(state_a[key], state_b[key]), f"{key} differs"
  return state_a


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_stop_and_restart_resumes_bit_exactly(tmp_path, cell, mirrored):
  _SESSION["mirrored"] = mirrored
  assert _train(tmp_path / "reference", CELLS[cell], STEPS) == STEPS
  assert _train(tmp_path / "run", CELLS[cell], STEPS // 2) == STEPS // 2
  assert _train(tmp_path / "run", CELLS[cell], STEPS) == STEPS
  state = _assert_same_checkpoint(tmp_path / "run", tmp_path / "reference", STEPS)
  what = {  # What each cell must have saved (and so restored), beyond the weights ('/' in a name is '.S' in a key).
    "gan": ["model_optimizers/d_optimizer/", "model_optimizers/g_optimizer/", "seed_generator_state"],
    "preprocessing": ["preprocessing/string_lookup/", "preprocessing/integer_lookup/", "normalization.Smean"],
    "rng": ["block.Sjitter.Sseed_generator", "seed_generator_2.Sseed_generator_state"],
    "two_heads_float16": ["dynamic_scale", "seed_generator_state"],
  }.get(cell, ["seed_generator_state" if cell.startswith("two_heads") else "optimizer/"])
  for part in what:
    assert any(part in key for key in state), (part, sorted(state))


def test_every_keras_rng_state_is_in_the_checkpoint_and_moves(tmp_path):
  """Every SeedGenerator of the model (RandomFlip's, Dropout's, GaussianNoise's, a layer's own from __init__ and
  from build, two levels down) is saved, and training moved each one."""
  _train(tmp_path / "run", CELLS["rng"], 10)
  keras.utils.clear_session(free_memory=False)
  model = keras_models.noisy_model()
  seeds = [v.path for v in model.variables if "seed_generator" in v.path]
  assert len(seeds) == 5, seeds  # RandomFlip's, Dropout's, GaussianNoise's, and Jitter's early and late.
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "run" / "checkpoints")))
  initial = {v.path: v.numpy() for v in model.variables}
  for path in seeds:
    key = f"variables/{path.replace('/', '.S')}/.ATTRIBUTES/VARIABLE_VALUE"
    assert reader.has_tensor(key), key
    assert not np.array_equal(reader.get_tensor(key), initial[path]), f"{path} never moved"


def test_a_resume_whose_adapt_gives_another_vocabulary_uses_the_checkpoint_s(tmp_path, caplog):
  params = CELLS["preprocessing"]
  assert _train(tmp_path / "reference", params, STEPS) == STEPS
  assert _train(tmp_path / "run", params, STEPS // 2) == STEPS // 2
  # Adapted on the first 60 examples only: the same tokens in another order of frequency, other bins.
  keras.utils.clear_session(free_memory=False)
  assert keras_models.table_model(adapt_first=60).layers  # (the vocabularies do differ: checked below)
  with caplog.at_level("WARNING"):
    assert _train(tmp_path / "run", [*params, "table_model.adapt_first = 60"], STEPS) == STEPS
  warnings = [r.getMessage() for r in caplog.records if "adapt() gave layer" in r.getMessage()]
  assert any("StringLookup" in w and "vocabulary[" in w for w in warnings), warnings
  assert any("Discretization" in w and "bin_boundaries" in w for w in warnings), warnings
  assert any("Normalization" in w and "mean" in w for w in warnings), warnings
  _assert_same_checkpoint(tmp_path / "run", tmp_path / "reference", STEPS)


def test_a_lookup_given_another_vocabulary_than_the_checkpoint_s_is_refused(tmp_path):
  cities = "['paris', 'rome', 'oslo', 'lima', 'kyiv', 'quito']"
  params = [*CELLS["preprocessing"], f"table_model.city_vocabulary = {cities}"]
  assert _train(tmp_path / "run", params, 10) == 10
  before = sorted(os.listdir(tmp_path / "run" / "checkpoints"))
  swapped = "['rome', 'paris', 'oslo', 'lima', 'kyiv', 'quito']"
  with pytest.raises(ConfigError) as error:
    _train(tmp_path / "run", [*params, f"table_model.city_vocabulary = {swapped}"], STEPS)
  message = str(error.value)
  assert "\n" not in message
  assert "layer 'string_lookup' (StringLookup) was given another state than the checkpoint's" in message
  assert "vocabulary[1] is 'paris' in the checkpoint, 'rome' now" in message
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == before


def test_a_gan_whose_discriminator_optimizer_changed_is_refused_before_anything_is_written(tmp_path):
  """Its optimizers are checked as the task's is: state the checkpoint lacks is refused by name."""
  assert _train(tmp_path / "run", CELLS["gan"], 5) == 5
  before = sorted(os.listdir(tmp_path / "run" / "checkpoints"))
  with pytest.raises(ConfigError) as error:
    _train(tmp_path / "run", [*CELLS["gan"], "gan_model.d_optimizer = @keras.optimizers.Adafactor()"], 10)
  message = str(error.value)
  assert "does not fit this model" in message and "\n" not in message
  assert (
    "model_optimizers/d_optimizer (Adafactor) bias: not in the checkpoint, so it cannot be restored"
    in message
  )
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == before


@pytest.mark.slow
def test_a_gan_killed_with_sigkill_resumes_bit_exactly(tmp_path):
  """A real process, killed once it holds after the train loop of step 20 (a marker file says so)."""
  marker = tmp_path / "held"
  bindings = "\n".join(
    [*BASE, *CELLS["gan"], "Executor.max_steps = 30", "Checkpointer.save_interval_steps = 5"]
  )
  plain, holding = tmp_path / "gan.gin", tmp_path / "gan_held.gin"
  plain.write_text(f"import keras_models\n{bindings}\n")
  holding.write_text(
    f"include '{plain}'\nExecutor.actions = [@HoldAfterStep()]\n"
    f"HoldAfterStep.step = 20\nHoldAfterStep.marker = '{marker}'\n"
  )

  def args(gin_file, model_dir):
    return [f"--gin_file={gin_file}", "--deterministic", f"--model_dir={model_dir}"]

  process = Process(args(holding, tmp_path / "run"), tmp_path / "killed.log")
  deadline = time.monotonic() + 120
  while not marker.exists():  # The event: the run holds, past step 20, until killed.
    assert process.returncode is None and time.monotonic() < deadline, process.tail()
    time.sleep(0.05)
  process.kill()
  latest = tf.train.latest_checkpoint(str(tmp_path / "run" / "checkpoints"))
  assert latest is not None and 0 < int(latest.rsplit("-", 1)[1]) <= 20
  resumed = Process(args(holding, tmp_path / "run"), tmp_path / "resumed.log")
  reference = Process(args(plain, tmp_path / "reference"), tmp_path / "reference.log")
  assert resumed.finish() == 0, resumed.tail()
  assert reference.finish() == 0, reference.tail()
  assert "Restored" in resumed.log
  state = _assert_same_checkpoint(tmp_path / "run", tmp_path / "reference", 30)
  assert any("model_optimizers/g_optimizer/" in key for key in state)
