"""The executor: restore, compile, cycle the schedule, save, export, stop.

Where the work happens, top down:
  Executor.run                       this file
    -> SimpleProgramSchedule.run     executor/schedule.py
      -> TrainProgram.run            programs/train.py
      -> EvalProgram.run             programs/eval.py
      -> DecodeProgram.run           programs/decode.py
        -> compiled loop function    programs/loop.py (the on-device loop)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import gin
import keras
import tensorflow as tf
from absl import logging

from core.analysis import model_analysis, unique_variables
from core.errors import ConfigError
from core.files import write_atomically
from core.runtime import Runtime
from core.summaries import SummaryWriter, program_logdir
from core.task import Task
from executor.checkpoints import Checkpointer
from executor.lock import ModelDirLock
from executor.model_dir import check_model_dir
from executor.preemption import StopRequest
from executor.progress import Profiler, Progress
from executor.schedule import CycleResult, SimpleProgramSchedule
from executor.warm_start import WarmStart
from executor.watchers import BestCheckpoints, EarlyStopping
from programs.program import ProgramResult
from programs.train import NonFiniteLossError


@gin.configurable
class Executor:
  """Runs one task's schedule of programs over one runtime until `max_steps`.

  Construction instantiates (and so validates) the task and the programs;
  nothing touches the disk or the devices until `run`.
  """

  def __init__(
    self,
    model_dir: str,
    task: Task | None = None,
    schedule: Callable[..., SimpleProgramSchedule] = SimpleProgramSchedule,
    runtime: Runtime | None = None,
    checkpointer: Checkpointer | None = None,
    max_steps: int = 1000,
    warm_start: WarmStart | None = None,
    checkpoint_path: str | None = None,
    profiler: Profiler | None = None,
    early_stopping: EarlyStopping | None = None,
    best_checkpoints: BestCheckpoints | None = None,
    watch_dir: str | None = None,
    eval_timeout_secs: float = 3600.0,
    eval_poll_secs: float = 5.0,
  ):
    """Builds the objects of a run.

    Args:
      model_dir: Where checkpoints, summaries and analysis go.
      task: The task (bind `Executor.task = @MyTask()` in gin); None with a
        schedule that holds its own tasks (`MultiTaskProgramSchedule`).
      schedule: Factory of the schedule, called with `task=` (or with no
        argument when `task` is None).
      runtime: The runtime; a default one (default strategy) when None.
      checkpointer: The checkpointer; a default one when None.
      max_steps: Training ends when the global step reaches this.
      warm_start: Initialises a run whose model_dir has no checkpoint yet.
      checkpoint_path: Restore this checkpoint instead of model_dir's latest;
        only with an evaluate-once schedule (`train_executions_per_eval=0`).
      profiler: Captures a profiler trace of chosen train loops.
      early_stopping: Ends training when an eval or decode metric stops
        improving.
      best_checkpoints: Keeps the best checkpoints by a metric in
        `model_dir/best/`.
      watch_dir: Continuous evaluation: the model_dir of a training run to
        watch. Every new checkpoint there is evaluated and decoded once by
        the schedule's eval programs, into this run's `model_dir`; it ends
        after the checkpoint of `max_steps`, or `eval_timeout_secs` without a
        new checkpoint.
      eval_timeout_secs: See `watch_dir`.
      eval_poll_secs: How often `watch_dir` is looked at.
    """
    check_model_dir(model_dir)
    if max_steps < 0:
      raise ConfigError(f"Executor.max_steps must be >= 0, got {max_steps}")
    if task is not None and not isinstance(task, Task):
      raise ConfigError(f"Executor.task must be a Task instance (e.g. @MyTask()), got {task!r}")
    self.model_dir = model_dir
    self.max_steps = max_steps
    self.runtime = runtime or Runtime()
    self.schedule = schedule(task=task) if task is not None else schedule()
    self.tasks: list[Task] = list(getattr(self.schedule, "tasks", [task]))
    if not all(isinstance(t, Task) for t in self.tasks):
      raise ConfigError(
        "Executor.task is required (e.g. Executor.task = @MyTask()) unless the schedule has its tasks"
      )
    self.watch_dir = watch_dir
    self.checkpointer = checkpointer or Checkpointer()
    self.warm_start = warm_start
    self.checkpoint_path = checkpoint_path
    self.profiler = profiler
    self.progress: Progress | None = None
    self._rollbacks = 0
    self.early_stopping = early_stopping
    self.best_checkpoints = best_checkpoints
    names = [p.name for p in self.programs]
    for watcher in (early_stopping, best_checkpoints):
      if watcher is not None:
        watcher.watch.check(names)
    self.eval_timeout_secs, self.eval_poll_secs = eval_timeout_secs, eval_poll_secs
    if watch_dir is not None:
      if not tf.io.gfile.isdir(watch_dir):
        raise ConfigError(f"--watch_dir '{watch_dir}' is not a directory")
      if os.path.abspath(watch_dir) == os.path.abspath(model_dir):
        raise ConfigError(
          f"--watch_dir '{watch_dir}' must differ from --model_dir (the evaluator writes its own)"
        )
      if not self.schedule.eval_programs:
        raise ConfigError(
          "continuous evaluation needs eval or decode programs (SimpleProgramSchedule.eval_programs)"
        )
    if checkpoint_path:
      if self.schedule.trains:
        raise ConfigError(
          f"--checkpoint_path '{checkpoint_path}' evaluates one checkpoint: set "
          "SimpleProgramSchedule.train_executions_per_eval = 0"
        )
      if not tf.io.gfile.exists(f"{checkpoint_path}.index"):
        raise ConfigError(
          f"--checkpoint_path '{checkpoint_path}': no checkpoint there ('{checkpoint_path}.index')"
        )
    self.executor_writer: SummaryWriter | None = None
    self.stop = StopRequest()

  @property
  def programs(self):
    """Every program this run uses (only the eval and decode ones when evaluating)."""
    return self.schedule.eval_programs if self.watch_dir else self.schedule.programs

  @property
  def variables(self) -> list[tf.Variable]:
    """The model variables of every task (shared ones once)."""
    return unique_variables([v for task in self.tasks for v in task.variables])

  @property
  def trains(self) -> bool:
    """Whether this run trains (and so writes train state)."""
    return self.schedule.trains and self.watch_dir is None

  def run(self) -> int:
    """Runs to `max_steps` (or evaluates once); returns the final global step.

    SIGTERM or a first Ctrl-C ends the run after the current train loop, with
    a checkpoint; the return is then normal.
    """
    self.runtime.build(self.tasks)
    for program in self.programs:
      program.validate(self.runtime)
    if self.warm_start is not None:
      self.warm_start.resolve()
    # Nothing was written before this point; only the chief writes into model_dir.
    chief = self.runtime.is_chief
    if chief:
      os.makedirs(self.model_dir, exist_ok=True)
    # An evaluate-once run writes no train state, so it may share a busy model_dir.
    lock = ModelDirLock(self.model_dir) if self.trains and chief else None
    if lock is not None:
      lock.acquire()
    try:
      with self.stop:
        return self._run()
    finally:
      if lock is not None:
        lock.release()

  def _run(self) -> int:
    self.schedule.build(self.runtime)
    for program in self.programs:
      program.build(self.runtime)
    items = dict(self.schedule.checkpoint_items())
    for task in self.tasks:
      prefix = f"{task.name}_" if len(self.tasks) > 1 else ""
      items.update({prefix + k: v for k, v in task.checkpoint_items().items()})
    if self.early_stopping is not None:
      self.early_stopping.build()
      items["early_stopping"] = self.early_stopping
    if self.best_checkpoints is not None:
      self.best_checkpoints.attach(self.model_dir)
    for program in self.programs:
      items.update(program.checkpoint_items())
    self.checkpointer.attach(
      os.path.join(self.watch_dir or self.model_dir, "checkpoints"),
      self.runtime.global_step,
      items,
      self.variables,
      is_chief=self.runtime.is_chief,
      agree=self.runtime.any_worker,
      step=self.runtime.step,
      before_save=self.runtime.before_save,
      after_restore=self.runtime.after_restore,
    )
    restored = None if self.watch_dir else self.checkpointer.restore(self.checkpoint_path)
    if restored is None and self.warm_start is not None and self.trains:
      report = self.warm_start.apply(self.variables)
      if self.runtime.is_chief:
        _write_atomically(os.path.join(self.model_dir, "warm_start.txt"), report.text())
    self.executor_writer = SummaryWriter(
      program_logdir(self.model_dir, "executor"), enabled=self.runtime.is_chief
    )
    for program in self.programs:
      program.setup(self.runtime, self.model_dir)
    self._write_analysis()
    step = self.runtime.step()
    compile_secs = {f"compile_secs/{p.name}": p.compile() for p in self.programs}
    self.executor_writer.scalars(compile_secs, step)
    try:
      if self.watch_dir:
        self._evaluate_continuously()
      elif self.schedule.trains:
        self._train_loop()
      else:
        self._cycle(steps_left=None)
      for program in self.programs:
        program.wait()
    finally:
      for program in self.programs:
        program.close()
      self.executor_writer.close()
      self.checkpointer.wait()
    return self.runtime.step()

  def _train_loop(self) -> None:
    self.progress = Progress(self.runtime.step(), self.max_steps)
    while self.runtime.step() < self.max_steps and not self._should_stop():
      if self.profiler is not None and self.runtime.is_chief:
        self.profiler.maybe_start(self.runtime.step(), self.model_dir)
      start = time.perf_counter()
      self.checkpointer.maybe_save()
      checkpoint_secs = time.perf_counter() - start
      try:
        self._cycle(self.max_steps - self.runtime.step(), extra={"checkpoint_secs": checkpoint_secs})
      except NonFiniteLossError as error:
        self._roll_back(error)
    if self.profiler is not None:
      self.profiler.stop()
    start = time.perf_counter()
    self.checkpointer.save()
    self.checkpointer.wait()
    how = f"stopped by {self.stop.reason or 'another worker'}" if self._should_stop() else "done"
    logging.info(
      "Final checkpoint at step %d in %.2fs (%s)", self.runtime.step(), time.perf_counter() - start, how
    )

  def _cycle(
    self, steps_left: int | None, extra: dict[str, float] | None = None, evals_only: bool = False
  ) -> None:
    start = time.perf_counter()
    if evals_only:
      cycle = self.schedule.run_evals(None)
    else:
      cycle = self.schedule.run(
        steps_left, should_stop=self._should_stop, after_train_loop=self._after_train_loop
      )
    scalars = {f"{kind}_secs": secs for kind, secs in cycle.secs.items()}
    scalars["cycle_secs"] = time.perf_counter() - start + sum((extra or {}).values())
    scalars.update(extra or {})
    self.executor_writer.scalars(scalars, self.runtime.step())
    self._watch(cycle)

  def _watch(self, cycle: CycleResult) -> None:
    """Feeds this cycle's metrics to early stopping and the best checkpoints."""
    for program in self.programs:
      reason = program.stop_reason() if self.trains else None
      if reason:
        self.stop.request(reason)
    watched = {w.watch.program for w in (self.early_stopping, self.best_checkpoints) if w is not None}
    if not watched or not self.trains:
      return
    by_name = {p.name: p for p in self.programs}
    metrics = {name: by_name[name].final_metrics(r) for name, r in cycle.results.items() if name in watched}
    step = self.runtime.step()
    if self.best_checkpoints is not None and self.runtime.is_chief:
      self.best_checkpoints.update(metrics, step, self.checkpointer.write_copy)
    if self.early_stopping is not None:
      reason = self.early_stopping.update(metrics, step)
      if reason:
        self.stop.request(reason)

  def _evaluate_continuously(self) -> None:
    """Evaluates each new checkpoint of `watch_dir` once, until `max_steps` or the timeout."""
    record = os.path.join(self.model_dir, "continuous_eval.json")
    done = set(json.load(open(record))["evaluated"]) if os.path.exists(record) else set()
    deadline = time.monotonic() + self.eval_timeout_secs
    while not self._should_stop():
      for path in self.checkpointer.checkpoints():
        step = int(path.rsplit("-", 1)[1])
        if step in done:
          continue
        try:
          self.checkpointer.restore(path)
        except ValueError:  # Deleted by the trainer's max_to_keep, or unreadable: warned.
          continue
        self._cycle(steps_left=None, evals_only=True)
        for program in self.programs:
          program.wait()
        done.add(step)
        if self.runtime.is_chief:
          _write_atomically(record, json.dumps({"evaluated": sorted(done)}))
        deadline = time.monotonic() + self.eval_timeout_secs
        if step >= self.max_steps:
          logging.info("Evaluated the final checkpoint (step %d) of %s", step, self.watch_dir)
          return
      if time.monotonic() > deadline:
        logging.info("No new checkpoint in %s for %.0fs: done", self.watch_dir, self.eval_timeout_secs)
        return
      time.sleep(self.eval_poll_secs)

  def _roll_back(self, error: NonFiniteLossError) -> None:
    """Restores the last good checkpoint but keeps reading past the batches that diverged."""
    train = error.program
    if train is None or train.non_finite_policy != "rollback":
      raise error
    if self._rollbacks >= train.max_rollbacks:
      raise NonFiniteLossError(f"{error} ({self._rollbacks} rollbacks already: giving up)") from error
    if self.checkpointer.latest is None:
      raise NonFiniteLossError(f"{error} (no checkpoint to roll back to)") from error
    position = int(train.input_position.numpy())
    step = self.checkpointer.restore()
    train.input_position.assign(position)
    train.reset_input()
    self._rollbacks += 1
    logging.warning(
      "%s. Rolled back to step %d (rollback %d of at most %d); reading on from input position %d",
      error,
      step,
      self._rollbacks,
      train.max_rollbacks,
      position,
    )
    self.executor_writer.scalars({"rollbacks": self._rollbacks}, step)

  def _should_stop(self) -> bool:
    # Every worker must leave the loop at the same step.
    return self.runtime.any_worker(self.stop())

  def _after_train_loop(self, result: ProgramResult) -> None:
    if self.progress is not None:
      self.progress.log(result)
    if self.profiler is not None:
      self.profiler.after_train_loop()

  def _write_analysis(self) -> None:
    if not self.runtime.is_chief:
      return
    text, total = model_analysis(self.variables)
    _write_atomically(os.path.join(self.model_dir, "model_analysis.txt"), text)
    _write_atomically(os.path.join(self.model_dir, "operative_config.gin"), gin.operative_config_str())
    step = self.runtime.step()
    self.executor_writer.scalars({"total_num_params": total}, step)
    self.executor_writer.text("model_analysis", f"```\n{text}```", step)
    self.executor_writer.text("operative_config", f"```\n{gin.operative_config_str()}```", step)
    logging.info("Model analysis:\n%s", text)


def _write_atomically(path: str, text: str) -> None:
  write_atomically(path, text)  # Temporary file, fsync, rename.


def enable_determinism(seed: int = 0) -> None:
  """Op determinism and fixed seeds, for bit-exact reproducibility on CPU."""
  tf.config.experimental.enable_op_determinism()
  keras.utils.set_random_seed(seed)
