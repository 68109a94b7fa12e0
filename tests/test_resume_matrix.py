"""Resume what users configure: learning-rate schedules, optimizers and their options, precisions, devices.

Every cell trains an uninterrupted `--deterministic` reference and an interrupted run of the same config, and
requires the same final checkpoint, tensor for tensor (weights, slots, iterations, loss scale and its counter,
input position). Cells are sparse: every value of every axis once, plus the risky pairs.

| cell            | optimizer (options)                   | learning rate                   | precision     | devices  | resume        |
|-----------------|---------------------------------------|---------------------------------|---------------|----------|---------------|
| sgd_nesterov    | SGD momentum, nesterov                | PiecewiseConstantDecay          | float32       | one      | stop/restart  |
| adamw_poly      | AdamW weight_decay                    | PolynomialDecay                 | float32       | mirrored | stop/restart  |
| lion_clip       | Lion, global_clipnorm                 | InverseTimeDecay                | float32       | mirrored | stop/restart  |
| adam_ema        | Adam, use_ema=True                    | CosineDecayRestarts             | float32       | one      | stop/restart  |
| adam_accumulate | Adam, gradient_accumulation_steps=2   | ExponentialDecay                | mixed_float16 | one      | stop/restart  |
| adafactor_rsqrt | Adafactor                             | RsqrtDecay (a user's own class) | float32       | one      | stop/restart  |
| keras_task      | KerasTask compiled with Adam          | ExponentialDecay                | float32       | one      | stop/restart  |
| kill_cosine     | Adam                                  | CosineDecay with warmup_steps   | mixed_float16 | mirrored | kill -9       |

A constant learning rate is the existing resume tests' (tests/test_resume.py: kill -9, float32, bfloat16 and
float16) and the changed-learning-rate test below.
"""

import re
import signal

import gin
import keras
import numpy as np
import pytest
import resume_helpers  # noqa: F401  (registers RsqrtDecay)
import tensorflow as tf
from conftest import read_scalars
from holds import hold_params
from test_resume import Executor as Process
from test_resume import checkpoint_state

from executor.cli.main import run
from programs.core.errors import ConfigError

TINY = [
  "SpiralsClassifier.hidden_sizes = (8, 8)",
  "SpiralsClassifier.global_batch_size = 32",
  "TrainProgram.steps_per_loop = 5",
  "SimpleProgramSchedule.train_executions_per_eval = 1",  # A cycle per loop: saves are due at its end.
  "SimpleProgramSchedule.eval_programs = []",
  "Checkpointer.save_interval_steps = 10",
]
# In this process, the session's one MirroredStrategy (conftest's `mirrored`): collective instance keys are
# process-wide, so a second strategy's collectives would collide with the first's. A child process makes its own.
MIRRORED = ["Runtime.strategy_fn = @session_mirrored_strategy"]
MIRRORED_CHILD = ["Runtime.strategy_fn = @mirrored_strategy", "mirrored_strategy.num_logical_cpus = 2"]
_SESSION = {}


@gin.register
def session_mirrored_strategy() -> tf.distribute.Strategy:
  """The session's mirrored strategy, set by the tests that use it."""
  return _SESSION["mirrored"]()


FLOAT16 = ["Runtime.precision = 'mixed_float16'", "Runtime.loss_scale_growth_steps = 3"]
SCHEDULES = "keras.optimizers.schedules"

CELLS = {
  "sgd_nesterov": [
    "SpiralsClassifier.optimizer_fn = @keras.optimizers.SGD",
    "keras.optimizers.SGD.momentum = 0.9",
    "keras.optimizers.SGD.nesterov = True",
    f"keras.optimizers.SGD.learning_rate = @{SCHEDULES}.PiecewiseConstantDecay()",
    f"{SCHEDULES}.PiecewiseConstantDecay.boundaries = [7, 14]",
    f"{SCHEDULES}.PiecewiseConstantDecay.values = [0.1, 0.05, 0.01]",
  ],
  "adamw_poly": [
    "SpiralsClassifier.optimizer_fn = @keras.optimizers.AdamW",
    "keras.optimizers.AdamW.weight_decay = 0.01",
    f"keras.optimizers.AdamW.learning_rate = @{SCHEDULES}.PolynomialDecay()",
    f"{SCHEDULES}.PolynomialDecay.initial_learning_rate = 0.01",
    f"{SCHEDULES}.PolynomialDecay.decay_steps = 20",
    *MIRRORED,
  ],
  "lion_clip": [
    "SpiralsClassifier.optimizer_fn = @keras.optimizers.Lion",
    "keras.optimizers.Lion.global_clipnorm = 0.5",
    f"keras.optimizers.Lion.learning_rate = @{SCHEDULES}.InverseTimeDecay()",
    f"{SCHEDULES}.InverseTimeDecay.initial_learning_rate = 0.001",
    f"{SCHEDULES}.InverseTimeDecay.decay_steps = 5",
    f"{SCHEDULES}.InverseTimeDecay.decay_rate = 0.5",
    *MIRRORED,
  ],
  "adam_ema": [
    "keras.optimizers.Adam.use_ema = True",
    "keras.optimizers.Adam.ema_overwrite_frequency = 7",
    f"keras.optimizers.Adam.learning_rate = @{SCHEDULES}.CosineDecayRestarts()",
    f"{SCHEDULES}.CosineDecayRestarts.initial_learning_rate = 0.01",
    f"{SCHEDULES}.CosineDecayRestarts.first_decay_steps = 6",
  ],
  "adam_accumulate": [
    "keras.optimizers.Adam.gradient_accumulation_steps = 2",
    f"keras.optimizers.Adam.learning_rate = @{SCHEDULES}.ExponentialDecay()",
    f"{SCHEDULES}.ExponentialDecay.initial_learning_rate = 0.01",
    f"{SCHEDULES}.ExponentialDecay.decay_steps = 4",
    f"{SCHEDULES}.ExponentialDecay.decay_rate = 0.7",
    *FLOAT16,
  ],
  "adafactor_rsqrt": [
    "SpiralsClassifier.optimizer_fn = @keras.optimizers.Adafactor",
    "keras.optimizers.Adafactor.learning_rate = @RsqrtDecay()",
    "RsqrtDecay.peak = 0.01",
  ],
  "keras_task": [
    "Executor.task = @KerasTask()",
    "KerasTask.global_batch_size = 32",
    f"digits_mlp.learning_rate = @{SCHEDULES}.ExponentialDecay()",
    "digits_mlp.hidden_size = 16",
    f"{SCHEDULES}.ExponentialDecay.initial_learning_rate = 0.01",
    f"{SCHEDULES}.ExponentialDecay.decay_steps = 4",
    f"{SCHEDULES}.ExponentialDecay.decay_rate = 0.7",
  ],
}


def _train(model_dir, cell, steps, *extra):
  """Trains `cell`'s config (None: gin/spirals.gin's Adam at 0.003) in-process to `steps`."""
  files = ["gin/keras_digits.gin"] if cell == "keras_task" else ["gin/spirals.gin"]
  tiny = [p for p in TINY if cell != "keras_task" or not p.startswith("SpiralsClassifier")]
  params = [*tiny, *CELLS.get(cell, []), f"Executor.max_steps = {steps}", *extra]
  # Auto-named layers named as in a new process; no gc pass (it took minutes late in a long suite).
  keras.utils.clear_session(free_memory=False)
  return run(str(model_dir), files, params, deterministic=True)


def _assert_same_final_state(a, b, step):
  path_a, state_a = checkpoint_state(a)
  path_b, state_b = checkpoint_state(b)
  assert path_a.endswith(f"ckpt-{step}") and path_b.endswith(f"ckpt-{step}")
  assert state_a.keys() == state_b.keys()
  for key in state_a:
    assert np.array_equal(state_a[key], state_b[key]), f"{key} differs"
  return state_a


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_stop_and_restart_at_a_checkpoint_resumes_bit_exactly(tmp_path, cell, mirrored):
  _SESSION["mirrored"] = mirrored
  assert _train(tmp_path / "reference", cell, 20) == 20
  assert _train(tmp_path / "run", cell, 10) == 10
  assert _train(tmp_path / "run", cell, 20) == 20
  state = _assert_same_final_state(tmp_path / "run", tmp_path / "reference", 20)
  assert not any("learning_rate" in k for k in state)  # Configuration, not state.
  iterations = [v for k, v in state.items() if k.startswith("optimizer/") and "iteration" in k]
  assert iterations and max(int(v) for v in iterations) > 10  # Float16 skips overflowing steps.
  rates = [v for _, v in read_scalars(tmp_path / "run" / "train")["learning_rate"]]
  expected = [v for _, v in read_scalars(tmp_path / "reference" / "train")["learning_rate"]]
  assert rates == expected and len(set(rates)) > 1  # The schedule moved, and the same on both.


@pytest.mark.slow
def test_kill_9_mid_run_with_a_warmup_cosine_schedule_in_float16_mirrored(tmp_path):
  extra = [
    *(p for p in TINY if not p.startswith("TrainProgram")),
    "TrainProgram.steps_per_loop = 10",
    "Executor.max_steps = 120",
    "Checkpointer.save_interval_steps = 30",
    f"keras.optimizers.Adam.learning_rate = @{SCHEDULES}.CosineDecay()",
    f"{SCHEDULES}.CosineDecay.initial_learning_rate = 0.0",
    f"{SCHEDULES}.CosineDecay.warmup_target = 0.01",
    f"{SCHEDULES}.CosineDecay.warmup_steps = 50",
    f"{SCHEDULES}.CosineDecay.decay_steps = 70",
    *FLOAT16,
    *MIRRORED_CHILD,
  ]
  reference = Process(tmp_path / "reference", *extra)
  assert reference.finish() == 0, reference.log
  model_dir, holds = tmp_path / "run", tmp_path / "holds"
  process = Process(model_dir, *extra, *hold_params(holds, "train", 70))
  process.wait_held(holds, "train")  # Mid-run, past the checkpoint of step 60.
  process.kill()
  assert process.returncode == -signal.SIGKILL
  latest = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
  assert latest is not None and int(latest.rsplit("-", 1)[1]) == 60
  process = Process(model_dir, *extra)
  assert process.finish() == 0, process.log
  assert re.search(r"Restored .*ckpt-\d+ at step \d+", process.log)
  state = _assert_same_final_state(model_dir, tmp_path / "reference", 120)
  assert any("dynamic_scale" in k for k in state) and any("step_counter" in k for k in state)


def test_a_changed_learning_rate_takes_effect_and_is_logged(tmp_path, caplog):
  model_dir = tmp_path / "run"
  assert _train(model_dir, None, 10) == 10
  with caplog.at_level("WARNING"):
    _train(model_dir, None, 20, "keras.optimizers.Adam.learning_rate = 0.0003")
  changes = [r.getMessage() for r in caplog.records if "configuration changed" in r.getMessage()]
  assert len(changes) == 1 and "Adam.learning_rate: 0.003 -> 0.0003" in changes[0]
  # From a constant to a schedule: no slot moves (state is saved by name).
  _train(
    model_dir,
    None,
    30,
    f"keras.optimizers.Adam.learning_rate = @{SCHEDULES}.ExponentialDecay()",
    f"{SCHEDULES}.ExponentialDecay.initial_learning_rate = 0.001",
    f"{SCHEDULES}.ExponentialDecay.decay_steps = 1000",
    f"{SCHEDULES}.ExponentialDecay.decay_rate = 0.5",
  )
  rates = read_scalars(model_dir / "train")["learning_rate"]
  assert [s for s, _ in rates] == [5, 10, 15, 20, 25, 30]
  np.testing.assert_allclose([v for _, v in rates[:4]], [0.003, 0.003, 0.0003, 0.0003], rtol=1e-6)
  np.testing.assert_allclose(
    [v for _, v in rates[4:]], [0.001 * 0.5 ** (s / 1000) for s in (25, 30)], rtol=1e-5
  )
  assert "ExponentialDecay.initial_learning_rate = 0.001" in (model_dir / "operative_config.gin").read_text()


def test_state_a_resume_cannot_restore_is_refused_by_name(tmp_path):
  model_dir = tmp_path / "run"
  assert _train(model_dir, "adam_ema", 10, "keras.optimizers.Adam.use_ema = False") == 10
  before = sorted(p.name for p in (model_dir / "checkpoints").iterdir())
  with pytest.raises(
    ConfigError, match=r"optimizer \(Adam\) mlp_hidden_0_bias_average: not in the checkpoint"
  ):
    _train(model_dir, "adam_ema", 20)
  assert sorted(p.name for p in (model_dir / "checkpoints").iterdir()) == before
  # The other way round (use_ema turned off) drops the averages and resumes.
  assert _train(model_dir, "adam_ema", 20, "keras.optimizers.Adam.use_ema = False") == 20


def test_a_checkpoint_with_optimizer_state_by_position_is_refused_in_one_line(tmp_path):
  from executor import compatibility
  from executor.checkpoints import VariableIndex

  weights = tf.Variable(tf.ones([2, 3]), name="w")
  optimizer = keras.optimizers.Adam(0.01)
  optimizer.build([weights])
  # How an earlier release saved it: Keras' own layout, slots by position, the learning rate with them.
  path = tf.train.Checkpoint(optimizer=optimizer, variables=VariableIndex([weights])).write(
    str(tmp_path / "old")
  )
  with pytest.raises(ConfigError, match=r"optimizer \(Adam\): its state was saved by position") as refused:
    compatibility.check(path, str(tmp_path), [weights], {"optimizer": optimizer})
  assert "\n" not in str(refused.value)


def test_a_model_variable_saved_under_another_path_is_found_through_the_index(tmp_path):
  # TensorFlow writes a variable two items hold once, under the path it meets first: here `model/embedding`,
  # not `variables/embedding` (as TransformerLM's embeddings, which made gin/lm.gin refuse every resume).
  from executor import compatibility
  from executor.checkpoints import VariableIndex

  model = tf.Module()
  model.embedding = tf.Variable(tf.ones([4, 2]), name="embedding")
  path = tf.train.Checkpoint(model=model, variables=VariableIndex([model.embedding])).write(
    str(tmp_path / "c")
  )
  assert not any(k.startswith("variables/") for k, _ in tf.train.list_variables(path))
  assert compatibility.differences(path, [model.embedding]) == []
  model.embedding = tf.Variable(tf.ones([5, 2]), name="embedding")
  assert compatibility.differences(path, [model.embedding]) == [
    "embedding: checkpoint [4, 2] float32, model [5, 2] float32"
  ]
