"""A dry run: everything a run would check and compile, nothing it would write; the plan, printed.

The task and every program of the mode are built and traced (so a shape error, a missing split or Python control
flow on a tensor shows now, not after an hour of training), one batch of every program's input is read, and the
latest checkpoint of `model_dir` (or the one to evaluate) is checked against the model. Programs write their
summaries into a scratch folder that is deleted afterwards: `model_dir` is left as it was.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

import tensorflow as tf

from executor import compatibility
from executor.continuous import check_watch_dir
from programs.core.analysis import model_analysis

if TYPE_CHECKING:
  from executor.base import ExecutorBase


def dry_run(
  executor: ExecutorBase,
  mode: str = "train",
  checkpoint_path: str | None = None,
  watch_dir: str | None = None,
) -> str:
  """Checks and compiles what `mode` would run, writes nothing; returns the plan.

  Raises:
    ConfigError: whatever the real run would refuse before writing (bad config, incompatible checkpoint, ...).
  """
  if watch_dir:
    check_watch_dir(watch_dir, executor.model_dir)
  trains = mode == "train" and executor.schedule.trains
  programs = list(executor.schedule.programs) if trains else executor.eval_programs()
  runtime = executor.runtime
  runtime.build(executor.tasks)
  for program in programs:
    program.validate(runtime)
  if trains and executor.warm_start is not None:
    executor.warm_start.resolve()
  checkpoints = os.path.join(watch_dir or executor.model_dir, "checkpoints")
  restore = checkpoint_path or tf.train.latest_checkpoint(checkpoints)
  compatibility.check(restore, watch_dir or executor.model_dir, executor.variables, executor.optimizers())
  lines = [
    f"Dry run of --mode={mode} in {executor.model_dir} (nothing is written)",
    f"runtime: {type(runtime.strategy).__name__}, {runtime.num_replicas} replica(s), "
    f"{runtime.num_workers} worker(s), precision {runtime.precision}",
  ]
  _, total = model_analysis(executor.variables)
  for task in executor.tasks:
    lines.append(f"task {task.name} ({type(task).__name__}): global batch {task.global_batch_size}")
  lines.append(f"parameters: {total:,}")
  lines.append(f"schedule: {type(executor.schedule).__name__}")
  with tempfile.TemporaryDirectory(prefix="executor_dry_run_") as scratch:
    executor.schedule.build(runtime)
    for program in programs:
      secs = program.prepare(runtime, scratch)
      next(iter(program.dataset))  # The input yields what the traced step expects.
      lines.append(
        f"  program {program.name} ({program.kind}): split '{program.split}', "
        f"steps_per_loop {program.steps_per_loop}, traced in {secs:.2f}s, input ok"
      )
    for program in programs:
      program.close()
  if trains:  # What the run checks once traced: the metrics the actions watch, the files they read.
    names = {p.name: p.metric_names() for p in programs}
    for action in executor.actions:
      action.validate_start(executor.model_dir, names)
  if trains:
    lines.append(
      f"train to step {executor.max_steps}; checkpoints every {executor.checkpointer.save_interval_steps} steps"
    )
    lines.append("actions: " + ", ".join(type(a).__name__ for a in executor.actions))
    callbacks = [a.keras_callback for a in executor.actions if getattr(a, "keras_callback", None)]
    lines += ["keras callbacks (KerasTask.callbacks):"] + [f"  {c}" for c in callbacks] if callbacks else []
  if watch_dir:
    lines.append(f"evaluates every new checkpoint of {watch_dir} until step {executor.max_steps}")
  elif restore:
    step = int(tf.train.load_checkpoint(restore).get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE"))
    lines.append(f"restores: {restore} (step {step}); the checkpoint fits the model")
  elif trains and executor.warm_start is not None:
    lines.append(f"restores: nothing (fresh start), warm start from {executor.warm_start.checkpoint_path}")
  else:
    lines.append("restores: nothing (fresh start)")
  return "\n".join(lines)
