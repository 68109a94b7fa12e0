"""Keras callbacks of a `KerasTask` (`KerasTask.callbacks`), as the executor runs them.

The executor never calls a Keras callback's hooks. Each callback `fit` users pass becomes the executor's own
mechanism, which saves its state with the run and resumes exactly, or is refused when the Executor is built (or,
for what needs the traced model, before the restore and any step), in one line naming what to use instead:

  EarlyStopping            an action with fit's rule on the monitored metric (`keras_monitors.KerasEarlyStopping`)
  ReduceLROnPlateau        an action that scales the optimizer's learning rate (`ReduceLearningRateOnPlateau`)
  ModelCheckpoint          the run's checkpoints; `save_best_only=True`: the best one in `model_dir/best/`
  TensorBoard              the run's summaries in model_dir (histograms, images, embeddings, profiles refused)
  BackupAndRestore         the run's checkpoints (it resumes from them, kill -9 included)
  ProgbarLogger            the executor's progress lines
  TerminateOnNaN           `TrainProgram.non_finite_policy = 'stop'` (the default)
  CSVLogger, History       refused: every scalar is in `<program>/metrics.jsonl`
  LearningRateScheduler    refused: a `keras.optimizers.schedules` schedule of the step resumes exactly
  anything else            refused: write an executor `Action`

A callback's `monitor` is `val_<metric>` (the metric of the schedule's eval program: one evaluation is one epoch),
`<metric>` (the train program's loop metric: one train loop is one epoch), or `<program>/<metric>`. Nothing is
ever written where a callback's path points (`filepath`, `log_dir`, `backup_dir`): the executor writes only inside
model_dir, and each callback's log line says where its files are.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import gin
import keras

from executor.actions import Action
from executor.keras_monitors import (
  BuiltInCallback,
  KerasBestCheckpoints,
  KerasEarlyStopping,
  Monitor,
  ReduceLearningRateOnPlateau,
)
from executor.watchers import BestCheckpoints
from programs.core.errors import ConfigError, check_value
from programs.core.task import Task

# Gin names them as Python does: `KerasTask.callbacks = [@keras.callbacks.EarlyStopping()]`.
for _cls in (
  keras.callbacks.BackupAndRestore,
  keras.callbacks.CSVLogger,
  keras.callbacks.EarlyStopping,
  keras.callbacks.History,
  keras.callbacks.LambdaCallback,
  keras.callbacks.LearningRateScheduler,
  keras.callbacks.ModelCheckpoint,
  keras.callbacks.ProgbarLogger,
  keras.callbacks.ReduceLROnPlateau,
  keras.callbacks.RemoteMonitor,
  keras.callbacks.SwapEMAWeights,
  keras.callbacks.TensorBoard,
  keras.callbacks.TerminateOnNaN,
):
  gin.external_configurable(_cls, module="keras.callbacks")

_WRITE_AN_ACTION = (
  "write an executor Action instead (subclass executor.Action: before_cycle, after_train_loop, "
  "__call__(cycle), close) and list it in Executor.actions"
)
_METRICS_JSONL = (
  "the executor writes every scalar of each program to model_dir/<program>/metrics.jsonl "
  "(pandas.read_json(path, lines=True)) and to TensorBoard; remove the callback"
)
# Callbacks whose work the executor cannot do as fit does: what to use instead.
_REFUSED = {
  keras.callbacks.CSVLogger: _METRICS_JSONL,
  keras.callbacks.History: "there is no History object after a run: " + _METRICS_JSONL,
  keras.callbacks.LearningRateScheduler: (
    "a Python function of the epoch cannot resume exactly; give the optimizer a learning-rate schedule of the "
    "step instead (keras.optimizers.schedules.*, e.g. keras.optimizers.Adam(learning_rate="
    "keras.optimizers.schedules.CosineDecay(...)) in model_fn, or KerasTask.optimizer_fn in gin)"
  ),
  keras.callbacks.LambdaCallback: "its functions are never called: " + _WRITE_AN_ACTION,
  keras.callbacks.RemoteMonitor: "it is never called: " + _WRITE_AN_ACTION + " that posts cycle.metrics(...)",
  keras.callbacks.SwapEMAWeights: (
    "the executor keeps its own average of the weights: set KerasTask.ema_decay and EvalProgram.use_ema = True"
  ),
  keras.callbacks.OrbaxCheckpoint: (
    "the executor checkpoints the whole run in model_dir/checkpoints (Checkpointer) and keeps the best "
    "checkpoints with @BestCheckpoints() in Executor.actions; remove the callback"
  ),
}


class _Context:
  """What a translation looks at: the task, the schedule's programs, the actions listed already."""

  def __init__(self, task: Task, schedule, actions: Sequence[Action], model_dir: str):
    self.task, self.model_dir = task, model_dir
    train = getattr(schedule, "train_program", None)
    self.train = train
    self.evals = [p.name for p in getattr(schedule, "eval_programs", []) if p.kind == "eval"]
    self.programs = [p.name for p in schedule.programs]
    self.actions = list(actions)
    self.counts: dict[str, int] = {}

  def key(self, kind: str) -> str:
    """The checkpoint name of a callback's state: by kind and rank among its kind (not by list position)."""
    n = self.counts.get(kind, 0)
    self.counts[kind] = n + 1
    return f"keras_{kind}" + (f"_{n}" if n else "")


def callback_actions(
  tasks: Sequence[Task], schedule, actions: Sequence[Action], model_dir: str
) -> list[Action]:
  """The actions the Keras callbacks of `tasks` become, in their order (empty when no task has callbacks).

  Args:
    tasks: The executor's tasks; only a `KerasTask` has `callbacks`.
    schedule: The schedule (its train and eval programs are what monitors name).
    actions: `Executor.actions`, for the callbacks that cannot share a job with one of them.
    model_dir: Where the run writes (named in the log lines).

  Raises:
    ConfigError: one line naming the callback and what to use instead.
  """
  with_callbacks = [t for t in tasks if getattr(t, "callbacks", None)]
  if not with_callbacks:
    return []
  if len(tasks) > 1:
    raise ConfigError(
      f"KerasTask.callbacks of task '{with_callbacks[0].name}': callbacks need a schedule of one task; with "
      "several, list the executor's actions in Executor.actions (@EarlyStopping(), @BestCheckpoints(), ...)"
    )
  context = _Context(with_callbacks[0], schedule, actions, model_dir)
  out: list[Action] = []
  for i, callback in enumerate(with_callbacks[0].callbacks):
    action = _translate(f"KerasTask.callbacks[{i}]", callback, context)
    context.actions.append(action)
    out.append(action)
  return out


def _translate(where: str, callback, context: _Context) -> Action:
  if inspect.isclass(callback):
    raise ConfigError(
      f"{where} is the class {callback.__module__}.{callback.__name__}, not a callback: call it "
      f"(@keras.callbacks.{callback.__name__}() in gin)"
    )
  if not isinstance(callback, keras.callbacks.Callback):
    raise ConfigError(f"{where} is {callback!r}, not a keras.callbacks.Callback")
  kind = type(callback)
  name = f"keras.callbacks.{kind.__name__}"
  if kind in _TRANSLATIONS:
    return _TRANSLATIONS[kind](f"{where} {name}", callback, context)
  if kind in _REFUSED:
    raise ConfigError(f"{where} {name} is not run by the executor: {_REFUSED[kind]}")
  known = [k for k in (*_TRANSLATIONS, *_REFUSED) if isinstance(callback, k)]
  what = (
    f"subclasses keras.callbacks.{known[0].__name__}, whose hooks the executor never calls: use "
    f"keras.callbacks.{known[0].__name__} itself, or "
    if known
    else "is a Keras callback whose hooks the executor never calls: "
  )
  raise ConfigError(f"{where} {kind.__module__}.{kind.__qualname__} {what}{_WRITE_AN_ACTION}")


def _monitor(owner: str, monitor: str, mode: str, context: _Context) -> Monitor:
  """The program and metric `monitor` names (see the module docstring)."""
  owner = f"{owner}(monitor='{monitor}')"
  if not isinstance(monitor, str) or not monitor:
    raise ConfigError(f"{owner}: monitor must name a metric ('val_loss', 'loss', 'eval_test/accuracy')")
  if "/" in monitor:
    program, metric = monitor.rsplit("/", 1)
    if program not in context.programs:
      raise ConfigError(
        f"{owner}: '{program}' is not a program of the schedule (it has: {', '.join(context.programs)})"
      )
    train = context.train is not None and program == context.train.name
    return Monitor(owner, program, metric, mode, train)
  if monitor.startswith("val_"):
    metric = monitor[len("val_") :]
    if len(context.evals) != 1:
      if not context.evals:
        raise ConfigError(
          f"{owner}: there is no evaluation to monitor: add an eval program to the schedule "
          f"(SimpleProgramSchedule.eval_programs = [@EvalProgram]), monitor a train metric ('{metric}'), or "
          "name a program's metric ('<program>/<metric>')"
        )
      raise ConfigError(
        f"{owner}: the schedule has several eval programs ({', '.join(context.evals)}): name one, e.g. "
        f"monitor='{context.evals[0]}/{metric}'"
      )
    return Monitor(owner, context.evals[0], metric, mode, train=False)
  if context.train is None:
    raise ConfigError(f"{owner}: the schedule has no train program whose '{monitor}' to monitor")
  return Monitor(owner, context.train.name, monitor, mode, train=True)


def _epoch(monitor: Monitor) -> str:
  return "one train loop" if monitor.train else f"one evaluation of {monitor.program}"


def _early_stopping(owner: str, cb: keras.callbacks.EarlyStopping, context: _Context) -> Action:
  monitor = _monitor(owner, cb.monitor, cb.mode, context)
  check_value(f"{owner}.patience", cb.patience, integer=True, minimum=0)
  check_value(f"{owner}.min_delta", cb.min_delta, minimum=0)
  check_value(f"{owner}.baseline", cb.baseline, optional=True)
  check_value(f"{owner}.start_from_epoch", cb.start_from_epoch, integer=True, minimum=0)

  def line() -> str:  # Said at start, when the side `mode='auto'` infers is known.
    return (
      f"{monitor.owner}: stops training after {max(cb.patience, 1)} epoch(s) without an improvement of "
      f"{monitor.describe()} (an epoch is {_epoch(monitor)})"
      + (" and restores the best epoch's weights at the end" if cb.restore_best_weights else "")
    )

  return KerasEarlyStopping(
    monitor,
    context.key("early_stopping"),
    line,
    context.task,
    patience=cb.patience,
    min_delta=cb.min_delta,
    baseline=cb.baseline,
    restore_best_weights=bool(cb.restore_best_weights),
    start_from_epoch=cb.start_from_epoch,
  )


def _reduce_lr(owner: str, cb: keras.callbacks.ReduceLROnPlateau, context: _Context) -> Action:
  monitor = _monitor(owner, cb.monitor, cb.mode, context)
  if any(isinstance(a, ReduceLearningRateOnPlateau) for a in context.actions):
    raise ConfigError(f"{monitor.owner}: one ReduceLROnPlateau per run (two would scale one learning rate)")
  check_value(f"{owner}.factor", cb.factor, above=0, below=1)
  check_value(f"{owner}.patience", cb.patience, integer=True, minimum=0)
  check_value(f"{owner}.cooldown", cb.cooldown, integer=True, minimum=0)
  check_value(f"{owner}.min_lr", cb.min_lr, minimum=0)
  check_value(f"{owner}.min_delta", cb.min_delta, minimum=0)
  train = context.train.name if context.train is not None else "train"

  def line() -> str:
    return (
      f"{monitor.owner}: the learning rate x {cb.factor} after {max(cb.patience, 1)} epoch(s) without an "
      f"improvement of {monitor.describe()}, then {cb.cooldown} epoch(s) of cooldown, never below {cb.min_lr} "
      f"(an epoch is {_epoch(monitor)}); the rate is in {train}/learning_rate"
    )

  return ReduceLearningRateOnPlateau(
    monitor,
    context.key("reduce_lr_on_plateau"),
    line,
    context.task,
    factor=cb.factor,
    patience=cb.patience,
    min_delta=cb.min_delta,
    cooldown=cb.cooldown,
    min_lr=cb.min_lr,
  )


def _save_interval(owner: str, save_freq) -> None:
  if save_freq != "epoch":
    raise ConfigError(
      f"{owner}: save_freq={save_freq!r} is refused: the executor saves by Checkpointer.save_interval_steps "
      f"(set Checkpointer.save_interval_steps = {save_freq} instead, and leave save_freq='epoch')"
    )


def _model_checkpoint(owner: str, cb: keras.callbacks.ModelCheckpoint, context: _Context) -> Action:
  _save_interval(f"{owner}('{cb.filepath}')", cb.save_freq)
  not_written = f"'{cb.filepath}' is not written (the executor writes only inside model_dir)"
  if not cb.save_best_only:
    return BuiltInCallback(
      f"{owner}('{cb.filepath}'): the run's checkpoints are in {context.model_dir}/checkpoints (every "
      "Checkpointer.save_interval_steps steps and at the end; `executor export` makes a SavedModel of one); "
      + not_written
    )
  if cb.best is not None:  # Keras keeps initial_value_threshold as the first best.
    raise ConfigError(
      f"{owner}('{cb.filepath}'): initial_value_threshold is refused: the best checkpoint is kept from the "
      "first evaluation on; drop it"
    )
  monitor = _monitor(owner, cb.monitor, cb.mode, context)
  if any(isinstance(a, BestCheckpoints) for a in context.actions):
    raise ConfigError(
      f"{monitor.owner}: save_best_only keeps the best checkpoint in model_dir/best, which another "
      "BestCheckpoints (in Executor.actions, or another ModelCheckpoint) keeps already: keep one"
    )

  def line() -> str:
    return (
      f"{monitor.owner}: the best checkpoint by {monitor.describe()} is kept in {context.model_dir}/best "
      f"(best.json names it); " + not_written
    )

  return KerasBestCheckpoints(monitor, line, context.task)


def _tensorboard(owner: str, cb: keras.callbacks.TensorBoard, context: _Context) -> Action:
  refused = [
    (cb.histogram_freq, "histogram_freq", "histograms are not written"),
    (cb.write_images, "write_images", "weight images are not written"),
    (cb.embeddings_freq, "embeddings_freq", "embeddings are not written"),
  ]
  for value, option, why in refused:
    if value:
      raise ConfigError(f"{owner}: {option}={value!r} is refused: {why} (only scalars); drop it")
  if getattr(cb, "_start_batch", 0) or getattr(cb, "_stop_batch", 0):  # Keras' parse of profile_batch.
    raise ConfigError(
      f"{owner}: profile_batch is refused: list @Profiler() in Executor.actions instead "
      "(Profiler.start_step, Profiler.num_loops: it traces whole train loops into model_dir)"
    )
  return BuiltInCallback(
    f"{owner}: TensorBoard summaries go to {context.model_dir} (train/, eval_<split>/, ..., written after every "
    f"loop; tensorboard --logdir={context.model_dir}); '{cb.log_dir}' is not written"
  )


def _backup_and_restore(owner: str, cb: keras.callbacks.BackupAndRestore, context: _Context) -> Action:
  _save_interval(owner, cb.save_freq)
  return BuiltInCallback(
    f"{owner}: built in: the run resumes from {context.model_dir}/checkpoints after a stop or a crash "
    f"(kill -9 included), saved every Checkpointer.save_interval_steps steps; '{cb.backup_dir}' is not written"
  )


def _progbar(owner: str, cb: keras.callbacks.ProgbarLogger, context: _Context) -> Action:
  return BuiltInCallback(f"{owner}: built in: a Progress line after every train loop (step, rate, loss, ETA)")


def _terminate_on_nan(owner: str, cb: keras.callbacks.TerminateOnNaN, context: _Context) -> Action:
  policy = getattr(context.train, "non_finite_policy", "stop")
  if policy != "stop":
    raise ConfigError(
      f"{owner} stops on a NaN loss, but TrainProgram.non_finite_policy is '{policy}': keep one "
      "(drop the callback to keep the policy)"
    )
  return BuiltInCallback(
    f"{owner}: built in: TrainProgram.non_finite_policy = 'stop' ends the run at a NaN or Inf loss (or weights), "
    "keeping the last good checkpoint"
  )


_TRANSLATIONS: dict[type, Callable[[str, object, _Context], Action]] = {
  keras.callbacks.EarlyStopping: _early_stopping,
  keras.callbacks.ReduceLROnPlateau: _reduce_lr,
  keras.callbacks.ModelCheckpoint: _model_checkpoint,
  keras.callbacks.TensorBoard: _tensorboard,
  keras.callbacks.BackupAndRestore: _backup_and_restore,
  keras.callbacks.ProgbarLogger: _progbar,
  keras.callbacks.TerminateOnNaN: _terminate_on_nan,
}
