"""Continuous evaluation: every new checkpoint of a training run evaluated and decoded once, into another model_dir.

The evaluator restores each checkpoint of `watch_dir` (the trainer's model_dir) newer than the last one it
evaluated, in step order, runs the schedule's eval and decode programs once on it and records the step in
`continuous_eval.json` with the run it watches, so a restarted evaluator does not evaluate a checkpoint twice
and one pointed at another run is refused. Its summaries go forward in step order: a checkpoint older than one
evaluated (one that could not be read in time, or that appeared late) is skipped with a warning, as is one that
cannot be read. It ends after the checkpoint of `max_steps` (at once when a restart finds it recorded), or after
`eval_timeout_secs` without a new checkpoint.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING

import tensorflow as tf
from absl import logging

from executor.startup import started
from programs.core.errors import ConfigError
from programs.core.files import write_atomically

if TYPE_CHECKING:
  from executor.base import ExecutorBase

RECORD = "continuous_eval.json"


def evaluate_continuously(executor: ExecutorBase, watch_dir: str) -> int:
  """Evaluates each new checkpoint of `watch_dir` once, into `executor.model_dir`.

  Returns:
    The latest step evaluated into `executor.model_dir` (by this call or an earlier one), -1 for none.

  Raises:
    ConfigError: `watch_dir` is not a directory, is the evaluator's own model_dir or is not the run its record
      says it evaluates, or the schedule has no eval or decode program; raised before anything is written.
  """
  check_watch_dir(watch_dir, executor.model_dir)
  programs = executor.eval_programs()
  record = os.path.join(executor.model_dir, RECORD)
  _, done = _evaluated(record)
  last = max(done, default=-1)
  # Locked as a trainer is: a second evaluator into the same model_dir is refused.
  with started(
    executor,
    programs,
    trains=False,
    restore=False,
    checkpoint_dir=os.path.join(watch_dir, "checkpoints"),
    lock=True,
  ):
    # What a killed evaluator wrote for a checkpoint it did not record as evaluated is written again: forgotten.
    # Every step up to `last` is recorded (older ones are skipped), so the cut loses nothing recorded.
    executor.restart_writers(last)
    if last >= executor.max_steps:
      logging.info("Evaluated the final checkpoint (step %d) of %s already", last, watch_dir)
      return last
    deadline = time.monotonic() + executor.eval_timeout_secs
    unreadable, passed_over = set(), set()  # Paths warned about, once each.
    while not executor.should_stop():
      for path in executor.checkpointer.checkpoints():
        if executor.should_stop():  # SIGTERM: stop after the current evaluation, whatever the backlog.
          return last
        step = int(path.rsplit("-", 1)[1])
        if step <= last:
          if step not in done and path not in passed_over:
            passed_over.add(path)
            logging.warning(
              "Skipping %s for good: step %d is evaluated already, and its scalars would come after that step's",
              path,
              last,
            )
          continue
        try:
          executor.checkpointer.restore(path)
        except ValueError as e:  # Deleted by the trainer's max_to_keep, or unreadable; tried again next poll.
          if path not in unreadable:
            unreadable.add(path)
            logging.warning("%s: tried again at each poll until a later checkpoint is evaluated", e)
          continue
        # Returns with its scalars and records on disk, before the record says so: a kill after it has nothing
        # to redo.
        executor.run_evals()
        done.add(step)
        last = step
        if executor.runtime.is_chief:
          write_atomically(record, json.dumps({"watch_dir": _resolved(watch_dir), "evaluated": sorted(done)}))
        deadline = time.monotonic() + executor.eval_timeout_secs
        if step >= executor.max_steps:
          logging.info("Evaluated the final checkpoint (step %d) of %s", step, watch_dir)
          return last
      if time.monotonic() > deadline:
        logging.info("No new checkpoint in %s for %.0fs: done", watch_dir, executor.eval_timeout_secs)
        return last
      wake = time.monotonic() + executor.eval_poll_secs
      while time.monotonic() < wake and not executor.stop():  # A SIGTERM ends the wait too.
        time.sleep(min(0.1, executor.eval_poll_secs))
  return last


def check_watch_dir(watch_dir: str, model_dir: str) -> None:
  """Raises ConfigError unless `watch_dir` may be evaluated into `model_dir`.

  It must be a directory other than `model_dir` (symlinks resolved) and, when `model_dir` holds a record of
  evaluated checkpoints, the run that record was written for.
  """
  if not tf.io.gfile.isdir(watch_dir):
    raise ConfigError(f"--watch_dir '{watch_dir}' is not a directory")
  if _resolved(watch_dir) == _resolved(model_dir):
    raise ConfigError(
      f"--watch_dir '{watch_dir}' must differ from --model_dir (the evaluator writes its own)"
    )
  record = os.path.join(model_dir, RECORD)
  watched, _ = _evaluated(record)
  if watched is not None and watched != _resolved(watch_dir):
    raise ConfigError(
      f"'{record}' records the checkpoints of '{watched}' as evaluated, not those of --watch_dir "
      f"'{watch_dir}': evaluate another run into another --model_dir (or edit the record if that run moved)"
    )


def _resolved(path: str) -> str:
  """`path` with symlinks resolved and made absolute; a URL (gs://...) as it is."""
  return path if "://" in path else os.path.realpath(path)


def _evaluated(record: str) -> tuple[str | None, set[int]]:
  """The run `record` says it watches (None when it does not say) and the steps it says were evaluated.

  Raises:
    ConfigError: the record is not `{"watch_dir": path, "evaluated": [step, ...]}`; raised before anything is
      written.
  """
  if not os.path.lexists(record):
    return None, set()
  try:
    with open(record) as f:
      content = json.load(f)
    steps, watched = content["evaluated"], content.get("watch_dir")
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise ConfigError(f"'{record}' is unreadable ({type(e).__name__}: {e}): fix or remove it") from None
  if not isinstance(steps, list) or not all(
    isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps
  ):
    raise ConfigError(f"'{record}' must hold {{\"evaluated\": [step, ...]}}, got {steps!r}: fix or remove it")
  if watched is not None and not isinstance(watched, str):
    raise ConfigError(f"'{record}' must name the watched run as a string, got {watched!r}: fix or remove it")
  return watched, set(steps)
