"""Keras callbacks of a KerasTask: each runs as the executor's own mechanism (with fit's rule, resuming with the
run), or is refused before anything is written in one line naming what to use instead; none is silently ignored."""

import functools
import inspect
import json
from pathlib import Path
from types import SimpleNamespace

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO

from executor import BestCheckpoints, Checkpointer, EarlyStopping, Executor
from executor.cli.main import run
from executor.keras_monitors import KerasEarlyStopping, ReduceLearningRateOnPlateau
from executor.schedule import CycleResult, SimpleProgramSchedule
from executor.tasks.keras_digits import digits_data, digits_mlp
from programs import EvalProgram, TrainProgram
from programs.core import KerasTask
from programs.core.errors import ConfigError
from programs.core.results import ProgramResult
from programs.core.runtime import Runtime

GIN = str(REPO / "gin" / "keras_digits.gin")
BASE = [
  "TrainProgram.steps_per_loop = 20",
  "Checkpointer.save_interval_steps = 20",
  "Checkpointer.max_to_keep = 100",
  "SimpleProgramSchedule.eval_programs = [@EvalProgram]",
]


def _executor(tmp_path, *callbacks, actions=(), evals=("test",), policy="stop"):
  """An Executor of the digits KerasTask with `callbacks` (made, not run: nothing is read or written)."""
  task = KerasTask(
    model_fn=digits_mlp, dataset_fn=digits_data, global_batch_size=64, callbacks=list(callbacks)
  )
  schedule = functools.partial(
    SimpleProgramSchedule,
    train_program=functools.partial(TrainProgram, steps_per_loop=20, non_finite_policy=policy),
    eval_programs=[functools.partial(EvalProgram, split=split, name=f"eval_{split}") for split in evals],
  )
  return Executor(str(tmp_path / "run"), task=task, schedule=schedule, actions=list(actions), max_steps=60)


def _run(model_dir, params, **kwargs):
  """`executor --gin_file=gin/keras_digits.gin` in this process, with Keras' layer names fresh as in a new one."""
  keras.utils.clear_session(free_memory=False)
  return run(str(model_dir), [GIN], params, **kwargs)


def _line(error):
  """The message, less what gin adds when it passes an error through a configurable (the CLI drops it too)."""
  return str(error.value).split("\n  In call to configurable")[0]


def _jsonl(path):
  return [json.loads(line) for line in Path(path).read_text().splitlines()]


# ----- Every callback: mapped or refused ---------------------------------------------------------------------


def _one_of_each(outside):
  """An instance of every callback class of keras.callbacks (a new one fails here until this test knows it)."""
  required = {
    keras.callbacks.BackupAndRestore: dict(backup_dir=str(outside / "backup")),
    keras.callbacks.CSVLogger: dict(filename=str(outside / "log.csv")),
    keras.callbacks.ModelCheckpoint: dict(filepath=str(outside / "model.keras")),
    keras.callbacks.LearningRateScheduler: dict(schedule=lambda epoch, lr: lr),
    keras.callbacks.TensorBoard: dict(log_dir=str(outside / "logs")),
  }
  callbacks = {}
  for name in dir(keras.callbacks):
    cls = getattr(keras.callbacks, name)
    if not (inspect.isclass(cls) and issubclass(cls, keras.callbacks.Callback)):
      continue
    if cls is keras.callbacks.OrbaxCheckpoint:  # Needs the orbax package to be made; its type is what counts.
      callbacks[name] = object.__new__(cls)
    else:
      callbacks[name] = cls(**required.get(cls, {}))
  return callbacks


MAPPED = {
  "EarlyStopping": "stops training after 1 epoch(s) without an improvement of eval_test/loss (auto)",
  "ReduceLROnPlateau": "the learning rate x 0.1 after 10 epoch(s) without an improvement of eval_test/loss",
  "ModelCheckpoint": "the run's checkpoints are in",
  "TensorBoard": "TensorBoard summaries go to",
  "BackupAndRestore": "built in: the run resumes from",
  "ProgbarLogger": "built in: a Progress line",
  "TerminateOnNaN": "TrainProgram.non_finite_policy = 'stop'",
}
REFUSED = {
  "CSVLogger": "metrics.jsonl",
  "History": "metrics.jsonl",
  "LearningRateScheduler": "keras.optimizers.schedules",
  "LambdaCallback": "write an executor Action",
  "RemoteMonitor": "write an executor Action",
  "SwapEMAWeights": "KerasTask.ema_decay and EvalProgram.use_ema",
  "OrbaxCheckpoint": "@BestCheckpoints()",
  "Callback": "write an executor Action",
  "CallbackList": "write an executor Action",
}


def test_every_keras_callback_is_mapped_or_refused_in_one_line(tmp_path):
  callbacks = _one_of_each(tmp_path / "outside")
  assert set(callbacks) == set(MAPPED) | set(REFUSED)
  for name, callback in callbacks.items():
    if name in MAPPED:
      executor = _executor(tmp_path, callback)
      lines = [a.keras_callback for a in executor.actions if hasattr(a, "keras_callback")]
      assert len(lines) == 1 and f"KerasTask.callbacks[0] keras.callbacks.{name}" in lines[0], lines
      assert MAPPED[name] in lines[0], lines[0]
    else:
      with pytest.raises(ConfigError) as error:
        _executor(tmp_path, callback)
      message = _line(error)
      assert "\n" not in message and "KerasTask.callbacks[0] keras." in message and name in message, message
      assert REFUSED[name] in message, message
  assert not (tmp_path / "outside").exists() and not (tmp_path / "run").exists()


class UsersCallback(keras.callbacks.Callback):
  def on_epoch_end(self, epoch, logs=None):
    pass


class PatientStopping(keras.callbacks.EarlyStopping):
  def on_epoch_end(self, epoch, logs=None):
    pass


REFUSALS = {
  "users_callback": (
    dict(callbacks=[UsersCallback()]),
    ["test_keras_callbacks.UsersCallback", "executor Action"],
  ),
  "subclass_of_early_stopping": (
    dict(callbacks=[PatientStopping()]),
    ["subclasses keras.callbacks.EarlyStopping", "use keras.callbacks.EarlyStopping itself"],
  ),
  "a_class": (dict(callbacks=[keras.callbacks.EarlyStopping]), ["is the class", "call it"]),
  "not_a_callback": (dict(callbacks=["EarlyStopping"]), ["'EarlyStopping', not a keras.callbacks.Callback"]),
  "histogram_freq": (dict(callbacks=[keras.callbacks.TensorBoard(histogram_freq=1)]), ["histogram_freq=1"]),
  "write_images": (dict(callbacks=[keras.callbacks.TensorBoard(write_images=True)]), ["write_images=True"]),
  "embeddings_freq": (
    dict(callbacks=[keras.callbacks.TensorBoard(embeddings_freq=1)]),
    ["embeddings_freq=1"],
  ),
  "profile_batch": (
    dict(callbacks=[keras.callbacks.TensorBoard(profile_batch=(2, 4))]),
    ["profile_batch", "@Profiler()"],
  ),
  "checkpoint_save_freq_in_batches": (
    dict(callbacks=[keras.callbacks.ModelCheckpoint("m.keras", save_freq=100)]),
    ["save_freq=100", "Checkpointer.save_interval_steps = 100"],
  ),
  "backup_save_freq_in_batches": (
    dict(callbacks=[keras.callbacks.BackupAndRestore("backup", save_freq=10)]),
    ["save_freq=10", "Checkpointer.save_interval_steps = 10"],
  ),
  "initial_value_threshold": (
    dict(
      callbacks=[keras.callbacks.ModelCheckpoint("m.keras", save_best_only=True, initial_value_threshold=1.0)]
    ),
    ["initial_value_threshold"],
  ),
  "best_only_and_best_checkpoints": (
    dict(
      callbacks=[keras.callbacks.ModelCheckpoint("m.keras", save_best_only=True)], actions=[BestCheckpoints()]
    ),
    ["save_best_only", "keep one"],
  ),
  "two_best_only": (
    dict(callbacks=[keras.callbacks.ModelCheckpoint(f"{n}.keras", save_best_only=True) for n in "ab"]),
    ["KerasTask.callbacks[1]", "keep one"],
  ),
  "two_reduce_lr": (
    dict(callbacks=[keras.callbacks.ReduceLROnPlateau(), keras.callbacks.ReduceLROnPlateau(monitor="loss")]),
    ["KerasTask.callbacks[1]", "one ReduceLROnPlateau per run"],
  ),
  "terminate_on_nan_and_rollback": (
    dict(callbacks=[keras.callbacks.TerminateOnNaN()], policy="rollback"),
    ["non_finite_policy is 'rollback'", "keep one"],
  ),
  "val_monitor_without_evaluation": (
    dict(callbacks=[keras.callbacks.EarlyStopping()], evals=()),
    [
      "monitor='val_loss'",
      "no evaluation to monitor",
      "monitor a train metric ('loss')",
      "'<program>/<metric>'",
    ],
  ),
  "val_monitor_of_two_evaluations": (
    dict(callbacks=[keras.callbacks.EarlyStopping()], evals=("test", "train")),
    ["several eval programs (eval_test, eval_train)", "monitor='eval_test/loss'"],
  ),
  "monitor_of_no_program": (
    dict(callbacks=[keras.callbacks.EarlyStopping(monitor="eval_dev/loss")]),
    ["'eval_dev' is not a program of the schedule (it has: train, eval_test)"],
  ),
  "negative_patience": (dict(callbacks=[keras.callbacks.EarlyStopping(patience=-1)]), ["patience must be"]),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_each_unsupported_feature_is_one_line_naming_the_alternative(tmp_path, case):
  kwargs, expected = REFUSALS[case]
  kwargs = dict(kwargs)
  callbacks = kwargs.pop("callbacks")
  with pytest.raises(ConfigError) as error:
    _executor(tmp_path, *callbacks, **kwargs)
  message = _line(error)
  assert "\n" not in message and all(e in message for e in expected), message
  assert not (tmp_path / "run").exists()


def test_what_needs_the_built_model_is_refused_before_the_restore_and_any_step(tmp_path):
  """A metric typo, a metric whose better side Keras cannot infer, a schedule to reduce: refused once traced."""

  def orientless(y_true, y_pred):
    return keras.ops.mean(y_pred)

  def schedule_model():
    model = digits_mlp()
    rate = keras.optimizers.schedules.ExponentialDecay(1e-3, 100, 0.5)
    model.compile(optimizer=keras.optimizers.Adam(rate), loss="categorical_crossentropy")
    return model

  def orientless_model():
    model = digits_mlp()
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=[orientless])
    return model

  cases = [
    (
      digits_mlp,
      keras.callbacks.EarlyStopping(monitor="val_acc"),
      "'acc' is not a metric of program 'eval_test'",
    ),
    (orientless_model, keras.callbacks.EarlyStopping(monitor="val_orientless"), "mode='auto' cannot tell"),
    (schedule_model, keras.callbacks.ReduceLROnPlateau(), "learning rate is ExponentialDecay, not a number"),
  ]
  for model_fn, callback, expected in cases:
    task = KerasTask(model_fn=model_fn, dataset_fn=digits_data, global_batch_size=64, callbacks=[callback])
    schedule = functools.partial(
      SimpleProgramSchedule,
      train_program=functools.partial(TrainProgram, steps_per_loop=20),
      eval_programs=[functools.partial(EvalProgram, split="test")],
    )
    executor = Executor(str(tmp_path / "run"), task=task, schedule=schedule, max_steps=40)
    with pytest.raises(ConfigError, match=expected):
      executor.train()
    assert not (tmp_path / "run").exists()  # The model_dir this start made is gone: nothing left behind.


def test_refusals_through_the_command_line_are_one_line_exit_2_and_nothing_on_disk_changed(tmp_path):
  from faults_util import Executor as Process
  from test_faults import disk_state

  model_dir = tmp_path / "run"
  assert _run(model_dir, [*BASE, "Executor.max_steps = 40"]) == 40
  (tmp_path / "outside").mkdir()
  (tmp_path / "outside" / "precious.txt").write_text("not the executor's")
  cases = [
    (
      [
        "KerasTask.callbacks = [@keras.callbacks.CSVLogger()]",
        "keras.callbacks.CSVLogger.filename = 'x.csv'",
      ],
      ["KerasTask.callbacks[0] keras.callbacks.CSVLogger", "metrics.jsonl"],
    ),
    (
      [
        "KerasTask.callbacks = [@keras.callbacks.EarlyStopping()]",
        "keras.callbacks.EarlyStopping.monitor = 'val_acc'",
      ],
      ["'acc' is not a metric of program 'eval_test'"],
    ),
  ]
  for params, expected in cases:
    before = disk_state(tmp_path)
    argv = [f"--gin_file={GIN}", f"--model_dir={model_dir}", *(f"--gin_param={p}" for p in [*BASE, *params])]
    process = Process(
      [*argv, "--gin_param=Executor.max_steps = 80"], tmp_path.parent / f"{tmp_path.name}.log"
    )
    assert process.finish() == 2, process.tail()
    last = process.log.strip().splitlines()[-1]
    assert last.startswith("executor: error: ") and all(e in last for e in expected), last
    assert "Traceback" not in process.log
    assert disk_state(tmp_path) == before


# ----- The rules, against Keras' own callbacks on the same values ---------------------------------------------


def _cycle(step, value, program="eval_test"):
  result = ProgramResult(
    step=step, steps=1, metrics={"loss": value, "accuracy": value}, per_example={}, secs=0.0
  )
  programs = {program: SimpleNamespace(final_metrics=lambda r: r.metrics)}
  return CycleResult(secs={}, results={program: result}, step=step, programs=programs)


@functools.cache
def _keras_model():
  """A compiled digits model, built (so `mode='auto'` finds its metrics), for Keras' own callbacks."""
  model = digits_mlp()
  model._symbolic_build(data_batch=(np.zeros((2, 64), "float32"), np.zeros((2, 10), "float32")))
  return model


def _reset(action):
  """The action as at the start of a fresh run (state made anew; the learning rate the configured one)."""
  action.state = None
  action.checkpoint_items()
  if isinstance(action, ReduceLearningRateOnPlateau):
    action._apply()
  return action


def _built(executor, kind):
  """The action of `kind` a callback became, started as a run would start it (on the task's built model)."""
  task = executor.tasks[0]
  task.build()
  action = next(a for a in executor.actions if isinstance(a, kind))
  action.validate_start("", {"train": None, "eval_test": {"loss", "accuracy", "auc"}})
  action.checkpoint_items()
  action.start(SimpleNamespace(max_steps=10**9))
  return action


def _sequences(n=12, length=20):
  """Noisy, mostly improving values in (0, 1): plateaus, dips and ties to `min_delta` at random places."""
  out = []
  for seed in range(n):
    rng = np.random.default_rng(seed)
    out.append(list(np.clip(0.6 + np.cumsum(rng.normal(-0.01, 0.04, size=length)), 0.01, 0.99)))
  return out


EARLY_STOPPING = [
  dict(),
  dict(patience=1),
  dict(patience=3),
  dict(patience=2, min_delta=0.03),
  dict(monitor="val_accuracy", patience=2),  # mode='auto': accuracy is better high.
  dict(monitor="val_accuracy", mode="max", patience=1, min_delta=0.02),
  dict(patience=2, baseline=0.45),
  dict(monitor="val_accuracy", mode="max", patience=1, baseline=0.7),
  dict(patience=1, start_from_epoch=4),
  dict(patience=0, start_from_epoch=2, baseline=0.5, min_delta=0.01),
]


def _keras_early_stopping(callback, values, monitor):
  """(stop epoch or None, best epoch) of Keras' own callback on `values`."""
  model = _keras_model()
  model.stop_training = False
  callback.set_model(model)
  callback.on_train_begin()
  for epoch, value in enumerate(values):
    callback.on_epoch_end(epoch, {monitor: value})
    if model.stop_training:
      return epoch, callback.best_epoch
  return None, callback.best_epoch


@pytest.mark.parametrize("config", EARLY_STOPPING, ids=[str(c) for c in EARLY_STOPPING])
def test_early_stopping_stops_at_the_epoch_fit_stops_at(tmp_path, config):
  action = _built(_executor(tmp_path, keras.callbacks.EarlyStopping(**config)), KerasEarlyStopping)
  stops = set()
  for values in _sequences():
    expected, best_epoch = _keras_early_stopping(
      keras.callbacks.EarlyStopping(**config), values, config.get("monitor", "val_loss")
    )
    _reset(action)
    stopped = None
    for epoch, value in enumerate(values):
      if action(_cycle(10 * (epoch + 1), value)):
        stopped = epoch
        break
    assert stopped == expected, (values, stopped, expected)
    if action.state.best_step.numpy() > 0:
      assert int(action.state.best_step.numpy()) == 10 * (best_epoch + 1)
    stops.add(stopped)
  assert len(stops) > 1  # The sequences stop at different epochs (or not at all): the rule is exercised.


def test_early_stopping_on_a_train_metric_counts_train_loops_and_stops_at_the_end_of_the_cycle(tmp_path):
  values = _sequences()[3]
  expected, _ = _keras_early_stopping(
    keras.callbacks.EarlyStopping(monitor="loss", patience=2), values, "loss"
  )
  assert expected is not None
  action = _built(
    _executor(tmp_path, keras.callbacks.EarlyStopping(monitor="loss", patience=2)), KerasEarlyStopping
  )
  assert action.monitor.train and action.monitor.program == "train"
  empty = CycleResult(secs={}, results={}, step=0)
  for epoch, value in enumerate(values):  # Two train loops per cycle: the stop waits for the cycle's end.
    action.after_train_loop(ProgramResult(10 * (epoch + 1), 10, {"loss": value}, {}, 0.0))
    if epoch % 2 and action(empty):
      break
  assert epoch == expected + (expected + 1) % 2
  assert int(action.state.epochs.numpy()) == expected + 1  # No loop after the stop is counted.


REDUCE_LR = [
  dict(monitor="val_loss", patience=0, factor=0.5),
  dict(monitor="val_loss", patience=2, factor=0.5, min_delta=0.0),
  dict(monitor="val_loss", patience=1, factor=0.3, cooldown=2, min_lr=2e-5),
  dict(monitor="val_accuracy", patience=1, factor=0.5, min_delta=0.02),  # mode='auto': max.
]


@pytest.mark.parametrize("config", REDUCE_LR, ids=[str(c) for c in REDUCE_LR])
def test_reduce_lr_on_plateau_sets_the_rate_fit_sets(tmp_path, config):
  action = _built(
    _executor(tmp_path, keras.callbacks.ReduceLROnPlateau(**config)), ReduceLearningRateOnPlateau
  )
  model = _keras_model()
  for values in _sequences(n=6):
    model.optimizer.learning_rate = 1e-3
    callback = keras.callbacks.ReduceLROnPlateau(**config)
    callback.set_model(model)
    callback.on_train_begin()
    _reset(action)
    rates, expected = [], []
    for epoch, value in enumerate(values):
      callback.on_epoch_end(epoch, {config["monitor"]: value})
      action(_cycle(10 * (epoch + 1), value))
      expected.append(float(np.asarray(model.optimizer.learning_rate)))
      rates.append(action.learning_rate())
    np.testing.assert_allclose(rates, expected, rtol=1e-6)
    assert min(rates) < 1e-3  # Reduced at least once.


# ----- End to end: real runs, resumed -----------------------------------------------------------------------


def latest_step(model_dir):
  return int(tf.train.latest_checkpoint(str(model_dir / "checkpoints")).rsplit("-", 1)[1])


def _variables(checkpoint):
  reader = tf.train.load_checkpoint(str(checkpoint))
  names = [n for n in reader.get_variable_to_shape_map() if n.startswith("variables/")]
  return {n: reader.get_tensor(n) for n in names}


def test_early_stopping_ends_a_real_run_where_fit_would_with_the_best_weights(tmp_path):
  """`EarlyStopping(restore_best_weights=True)` on val_loss: the stop step is fit's stop epoch on the run's own
  eval losses, and the final checkpoint holds the weights of the best epoch (the checkpoint of its step)."""
  model_dir = tmp_path / "run"
  params = [
    *BASE,
    "Executor.max_steps = 1000",
    "KerasTask.callbacks = [@keras.callbacks.EarlyStopping()]",
    "keras.callbacks.EarlyStopping.patience = 2",
    "keras.callbacks.EarlyStopping.min_delta = 0.05",
    "keras.callbacks.EarlyStopping.restore_best_weights = True",
  ]
  step = _run(model_dir, params, deterministic=True)
  evals = [(r["step"], r["loss"]) for r in _jsonl(model_dir / "eval_test" / "metrics.jsonl")]
  stop, best = _keras_early_stopping(
    keras.callbacks.EarlyStopping(patience=2, min_delta=0.05), [v for _, v in evals], "val_loss"
  )
  assert stop is not None and step == evals[stop][0] == evals[-1][0] < 1000
  final, kept = (
    _variables(model_dir / "checkpoints" / f"ckpt-{step}"),
    _variables(model_dir / "checkpoints" / f"ckpt-{evals[best][0]}"),
  )
  assert best < stop and final.keys() == kept.keys()
  for name in final:
    np.testing.assert_array_equal(final[name], kept[name], err_msg=name)


def _lr_params(max_steps):
  return [
    *BASE,
    f"Executor.max_steps = {max_steps}",
    "KerasTask.callbacks = [@keras.callbacks.ReduceLROnPlateau()]",
    "keras.callbacks.ReduceLROnPlateau.min_delta = 1e9",  # Only the first evaluation improves (on nothing).
    "keras.callbacks.ReduceLROnPlateau.patience = 2",
    "keras.callbacks.ReduceLROnPlateau.factor = 0.5",
    "keras.callbacks.ReduceLROnPlateau.cooldown = 1",
  ]


def test_reduce_lr_on_plateau_lowers_the_rate_in_summaries_and_a_resumed_run_keeps_it(tmp_path):
  whole, split = tmp_path / "whole", tmp_path / "split"
  assert _run(whole, _lr_params(200), deterministic=True) == 200
  assert _run(split, _lr_params(100), deterministic=True) == 100
  assert _run(split, _lr_params(200), deterministic=True) == 200
  rates = [(r["step"], r["learning_rate"]) for r in _jsonl(whole / "train" / "metrics.jsonl")]
  assert [s for s, _ in rates] == list(range(20, 201, 20))
  # What fit's callback sets on the same evaluations: each train loop runs at the rate set after the one before.
  model = _keras_model()
  model.optimizer.learning_rate = 1e-3
  callback = keras.callbacks.ReduceLROnPlateau(min_delta=1e9, patience=2, factor=0.5, cooldown=1)
  callback.set_model(model)
  callback.on_train_begin()
  expected = []
  for epoch, record in enumerate(_jsonl(whole / "eval_test" / "metrics.jsonl")):
    expected.append(float(np.asarray(model.optimizer.learning_rate)))
    callback.on_epoch_end(epoch, {"val_loss": record["loss"]})
  np.testing.assert_allclose([r for _, r in rates], expected, rtol=1e-6)
  assert expected[-1] < expected[0] / 8  # Reduced four times in ten evaluations.
  resumed = [(r["step"], r["learning_rate"]) for r in _jsonl(split / "train" / "metrics.jsonl")]
  assert resumed == rates
  # The resumed run ends bit for bit where the uninterrupted one does.
  a, b = _variables(whole / "checkpoints" / "ckpt-200"), _variables(split / "checkpoints" / "ckpt-200")
  for name in a:
    np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_early_stopping_state_resumes_and_runs_beside_the_executors_own(tmp_path, caplog):
  """Both an `EarlyStopping` action and a Keras `EarlyStopping` callback run (each saves its own state); a run
  resumed between evaluations stops where the uninterrupted one stops."""
  params = [
    *BASE,
    "Executor.actions = [@EarlyStopping()]",
    "EarlyStopping.patience = 100",
    "KerasTask.callbacks = [@keras.callbacks.EarlyStopping()]",
    "keras.callbacks.EarlyStopping.min_delta = 1e9",
    "keras.callbacks.EarlyStopping.patience = 3",
  ]
  assert _run(tmp_path / "whole", [*params, "Executor.max_steps = 400"]) == 80
  split = str(tmp_path / "split")
  assert _run(split, [*params, "Executor.max_steps = 60"]) == 60  # Two bad evaluations of three.
  with caplog.at_level("INFO"):
    assert _run(split, [*params, "Executor.max_steps = 400"]) == 80
  assert any(
    "early stopping (KerasTask.callbacks[0] keras.callbacks.EarlyStopping" in r.getMessage()
    for r in caplog.records
  )
  reader = tf.train.load_checkpoint(str(tmp_path / "split" / "checkpoints" / "ckpt-80"))
  assert reader.get_tensor("keras_early_stopping/wait/.ATTRIBUTES/VARIABLE_VALUE") == 3
  assert reader.get_tensor("keras_early_stopping/epochs/.ATTRIBUTES/VARIABLE_VALUE") == 4
  assert (
    reader.get_tensor("early_stopping/best_step/.ATTRIBUTES/VARIABLE_VALUE") > 0
  )  # The action's own ran too.


def test_accepted_callbacks_write_nothing_where_they_point_and_say_where_their_files_are(tmp_path, caplog):
  """ModelCheckpoint (best only), TensorBoard, BackupAndRestore, TerminateOnNaN and ProgbarLogger in one gin run:
  each logs its line at start, the best checkpoint is in model_dir/best, nothing is written outside model_dir."""
  outside = tmp_path / "outside"
  model_dir = tmp_path / "run"
  params = [
    *BASE,
    "Executor.max_steps = 100",
    "KerasTask.callbacks = [@keras.callbacks.ModelCheckpoint(), @keras.callbacks.TensorBoard(), "
    "@keras.callbacks.BackupAndRestore(), @keras.callbacks.TerminateOnNaN(), @keras.callbacks.ProgbarLogger()]",
    f"keras.callbacks.ModelCheckpoint.filepath = '{outside}/best.keras'",
    "keras.callbacks.ModelCheckpoint.save_best_only = True",
    "keras.callbacks.ModelCheckpoint.monitor = 'val_accuracy'",
    f"keras.callbacks.TensorBoard.log_dir = '{outside}/logs'",
    f"keras.callbacks.BackupAndRestore.backup_dir = '{outside}/backup'",
  ]
  with caplog.at_level("INFO"):
    assert _run(model_dir, params) == 100
  messages = [r.getMessage() for r in caplog.records]
  for i, what in enumerate(
    ["ModelCheckpoint", "TensorBoard", "BackupAndRestore", "TerminateOnNaN", "ProgbarLogger"]
  ):
    assert sum(m.startswith(f"KerasTask.callbacks[{i}] keras.callbacks.{what}") for m in messages) == 1, what
  assert not outside.exists()
  accuracy = {r["step"]: r["accuracy"] for r in _jsonl(model_dir / "eval_test" / "metrics.jsonl")}
  kept = json.loads((model_dir / "best" / "best.json").read_text())
  assert [r["step"] for r in kept] == [max(accuracy, key=lambda s: (accuracy[s], -s))]
  assert (model_dir / "best" / f"{kept[0]['path']}.index").exists()


def test_dry_run_lists_what_each_callback_became(tmp_path, capsys):
  params = [
    *BASE,
    "KerasTask.callbacks = [@keras.callbacks.EarlyStopping(), @keras.callbacks.TensorBoard()]",
    "keras.callbacks.EarlyStopping.monitor = 'val_accuracy'",
  ]
  _run(tmp_path / "run", params, dry_run=True)
  plan = capsys.readouterr().out
  assert "keras callbacks (KerasTask.callbacks):" in plan
  assert (
    "keras.callbacks.EarlyStopping(monitor='val_accuracy'): stops training after 1 epoch(s) without an "
    "improvement of eval_test/accuracy (max)" in plan
  )
  assert "KerasTask.callbacks[1] keras.callbacks.TensorBoard: TensorBoard summaries go to" in plan
  assert not (tmp_path / "run").exists()


def test_the_executors_early_stopping_and_keras_callback_share_a_gin_file(tmp_path):
  """`@EarlyStopping()` stays the executor's action and `@keras.callbacks.EarlyStopping()` is Keras' callback."""
  import gin

  gin.parse_config(
    "Executor.actions = [@EarlyStopping()]\nEarlyStopping.patience = 7\n"
    "KerasTask.callbacks = [@keras.callbacks.EarlyStopping()]\nkeras.callbacks.EarlyStopping.patience = 4\n"
  )
  action = gin.query_parameter("Executor.actions")[0].scoped_configurable_fn()
  callback = gin.query_parameter("KerasTask.callbacks")[0].scoped_configurable_fn()
  assert type(action) is EarlyStopping and action.patience == 7
  assert type(callback) is keras.callbacks.EarlyStopping and callback.patience == 4


@pytest.mark.slow
def test_a_run_killed_between_checkpoints_resumes_the_callbacks_state_exactly(tmp_path):
  """kill -9 after the evaluation of step 120 (before its checkpoint): the restarted run reduces the learning rate
  and early-stops where the uninterrupted one does, ends on the same weights bit for bit (those of the best epoch,
  restored), and its summaries show one learning rate per step, the same."""
  from faults_util import Executor as Process

  params = [
    *_lr_params(400),
    "KerasTask.callbacks = [@keras.callbacks.ReduceLROnPlateau(), @keras.callbacks.EarlyStopping()]",
    "keras.callbacks.EarlyStopping.min_delta = 1e9",
    "keras.callbacks.EarlyStopping.patience = 8",
    "keras.callbacks.EarlyStopping.restore_best_weights = True",
  ]

  def argv(model_dir, *extra):
    flags = [f"--gin_file={GIN}", f"--model_dir={model_dir}", "--deterministic"]
    return [*flags, *(f"--gin_param={p}" for p in [*params, *extra])]

  pause = tmp_path / "pause.gin"
  pause.write_text(
    "import keras_callback_helpers\n"
    "Executor.actions = [@PauseAtStep()]\n"
    "PauseAtStep.step = 120\n"
    f"PauseAtStep.release_file = '{tmp_path / 'never'}'\n"
  )
  whole, killed = tmp_path / "whole", tmp_path / "killed"
  reference = Process(argv(whole), tmp_path / "whole.log")
  assert reference.finish() == 0, reference.tail()
  first = Process([*argv(killed), f"--gin_file={pause}"], tmp_path / "killed.log")
  first.wait_for("PAUSED_AT_STEP 120")
  first.kill()
  assert latest_step(killed) == 100
  second = Process(argv(killed), tmp_path / "resumed.log")
  assert second.finish() == 0, second.tail()
  assert "Restored" in second.log and "early stopping (KerasTask.callbacks[1]" in second.log
  rates = [(r["step"], r["learning_rate"]) for r in _jsonl(whole / "train" / "metrics.jsonl")]
  assert [s for s, _ in rates] == list(range(20, 181, 20))  # Stopped at the 9th evaluation (patience 8).
  assert [(r["step"], r["learning_rate"]) for r in _jsonl(killed / "train" / "metrics.jsonl")] == rates
  assert rates[-1][1] < rates[0][1] / 4
  final, again = (
    _variables(whole / "checkpoints" / "ckpt-180"),
    _variables(killed / "checkpoints" / "ckpt-180"),
  )
  best = _variables(whole / "checkpoints" / "ckpt-20")  # The only improvement: the first evaluation.
  for name in final:
    np.testing.assert_array_equal(final[name], again[name], err_msg=name)
    np.testing.assert_array_equal(final[name], best[name], err_msg=name)


def test_callbacks_on_two_replicas_restore_the_best_weights_on_each_and_reduce_the_rate(tmp_path, mirrored):
  keras.utils.clear_session(free_memory=False)
  callbacks = [
    keras.callbacks.EarlyStopping(min_delta=1e9, patience=3, restore_best_weights=True),
    keras.callbacks.ReduceLROnPlateau(min_delta=1e9, patience=1, factor=0.5),
  ]
  task = KerasTask(model_fn=digits_mlp, dataset_fn=digits_data, global_batch_size=64, callbacks=callbacks)
  schedule = functools.partial(
    SimpleProgramSchedule,
    train_program=functools.partial(TrainProgram, steps_per_loop=20),
    eval_programs=[functools.partial(EvalProgram, split="test")],
  )
  executor = Executor(
    str(tmp_path / "run"),
    task=task,
    schedule=schedule,
    runtime=Runtime(strategy_fn=mirrored),
    checkpointer=Checkpointer(save_interval_steps=20),
    max_steps=400,
  )
  assert executor.train() == 80  # The first evaluation is the only improvement; three bad ones stop.
  rates = [r["learning_rate"] for r in _jsonl(tmp_path / "run" / "train" / "metrics.jsonl")]
  np.testing.assert_allclose(rates, [1e-3, 1e-3, 5e-4, 2.5e-4], rtol=1e-6)
  best, final = _variables(tmp_path / "run" / "checkpoints" / "ckpt-20"), executor.variables
  assert len(final) == len(best) == 4
  for variable in final:
    replicas = [v.numpy() for v in variable.value.values]
    assert len(replicas) == 2
    for replica in replicas:  # Restored on every replica, not only where the checkpoint reads from.
      np.testing.assert_array_equal(replica, best[next(n for n in best if n.endswith(_escaped(variable)))])


def _escaped(variable):
  """The checkpoint key suffix of a model variable in the `variables/` index."""
  from programs.core.analysis import variable_name

  return variable_name(variable).replace("/", ".S") + "/.ATTRIBUTES/VARIABLE_VALUE"
