"""One interface for where a program's metrics go: TensorBoard event files and a plain `metrics.jsonl`.

Programs write through a `MetricWriter`; `program_writer` gives each program (and the executor) a
`MultiWriter` that sends every scalar to its TensorBoard folder (`SummaryWriter`) and appends it to
`<folder>/metrics.jsonl` (`JsonlWriter`), one JSON object a line:
`{"step": 120, "wall_time": 1764900000.1, "loss": 0.31, ...}`, which `pandas.read_json(path, lines=True)`
reads as a table. Both are crash-safe the same way: `restart(step)` at the start of a session forgets what a
killed run wrote after the checkpoint it resumes from (TensorBoard by a `SessionLog.START` event, the JSONL by
cutting those rows), so each step shows the resumed run's values once.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Protocol, runtime_checkable

import gin

from programs.core.files import atomic_write
from programs.core.summaries import SummaryWriter, program_logdir

METRICS_FILE = "metrics.jsonl"


@runtime_checkable
class MetricWriter(Protocol):
  """Where a program's metrics go; every method may be called from the program's worker thread."""

  def scalars(self, values: Mapping[str, float], step: int) -> None:
    """Records every `name: value` at `step`."""

  def text(self, name: str, markdown: str, step: int) -> None:
    """Records a markdown text at `step` (writers of numbers only may ignore it)."""

  def restart(self, step: int) -> None:
    """Starts a session resumed from `step`: what was written at later steps is forgotten."""

  def flush(self) -> None:
    """Makes everything written so far visible on disk."""

  def close(self) -> None:
    """Flushes and releases the writer."""


class JsonlWriter:
  """Appends scalars to a JSON-lines file: one `{"step", "wall_time", <name>: <value>...}` object a line.

  Rows reach the file a line at a time. Text is not written (it is TensorBoard's). A writer made with `enabled=False` (non-chief workers) writes
  nothing and creates no file. The file is opened without following a link, and only on the first write.
  """

  def __init__(self, path: str, enabled: bool = True):
    """Binds the writer to `path` (created, with its folder, on the first write)."""
    self.path = path
    self.enabled = enabled
    self._file: IO[str] | None = None
    self._lock = threading.Lock()

  def scalars(self, values: Mapping[str, float], step: int) -> None:
    if not self.enabled or not values:
      return
    row = {"step": int(step), "wall_time": time.time()}
    row.update({name: float(value) for name, value in values.items() if name not in row})
    line = json.dumps(row) + "\n"
    with self._lock:
      self._open().write(line)

  def text(self, name: str, markdown: str, step: int) -> None:
    del name, markdown, step

  def restart(self, step: int) -> None:
    """Cuts the rows of steps after `step`, and a last row a kill cut in half, rewriting the file atomically."""
    if not self.enabled:
      return
    with self._lock:
      self._close()
      if not os.path.isfile(self.path) or os.path.islink(self.path):
        return
      with open(self.path, encoding="utf-8", errors="replace") as f:
        lines = f.read().split("\n")
      kept = [line for line in lines if _step_of_row(line) is not None and _step_of_row(line) <= step]
      if len(kept) != len([line for line in lines if line]):
        with atomic_write(self.path) as f:
          f.writelines(line + "\n" for line in kept)

  def flush(self) -> None:
    with self._lock:
      if self._file is not None:
        self._file.flush()

  def close(self) -> None:
    with self._lock:
      self._close()

  def _open(self) -> IO[str]:
    if self._file is None:
      os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
      fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
      self._file = os.fdopen(fd, "a", encoding="utf-8", buffering=1)  # Line by line: a kill loses no row.
    return self._file

  def _close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


def _step_of_row(line: str) -> int | None:
  """The step of one JSONL row; None for a blank, torn or foreign line."""
  try:
    row = json.loads(line)
  except ValueError:
    return None
  step = row.get("step") if isinstance(row, dict) else None
  return step if isinstance(step, int) else None


class MultiWriter:
  """Sends everything to several `MetricWriter`s, in order (CLU's `MultiWriter`, for this executor)."""

  def __init__(self, writers: Sequence[MetricWriter], logdir: str):
    """Sends to `writers`.

    Args:
      writers: Where to write, in this order.
      logdir: The program's folder (where its other outputs, decode records, go too).
    """
    self.writers = list(writers)
    self.logdir = logdir

  def scalars(self, values: Mapping[str, float], step: int) -> None:
    for writer in self.writers:
      writer.scalars(values, step)

  def text(self, name: str, markdown: str, step: int) -> None:
    for writer in self.writers:
      writer.text(name, markdown, step)

  def restart(self, step: int) -> None:
    for writer in self.writers:
      writer.restart(step)

  def flush(self) -> None:
    for writer in self.writers:
      writer.flush()

  def close(self) -> None:
    for writer in self.writers:
      writer.close()


@gin.configurable
def program_writer(
  model_dir: str, name: str, enabled: bool = True, jsonl: bool = True, flush_secs: float = 5.0
) -> MultiWriter:
  """The writer of the program (or the executor) called `name`: TensorBoard events, plus `metrics.jsonl`.

  Args:
    model_dir: The run's directory.
    name: The program's folder name in it.
    enabled: Write anything at all (False on non-chief workers).
    jsonl: Also append the scalars to `<model_dir>/<name>/metrics.jsonl`.
    flush_secs: Longest time TensorBoard events wait in memory before they are flushed (TensorBoard reloads
      every 5 s); JSONL rows are written a line at a time.
  """
  logdir = program_logdir(model_dir, name)
  writers: list[MetricWriter] = [SummaryWriter(logdir, enabled=enabled, flush_secs=flush_secs)]
  if jsonl:
    writers.append(JsonlWriter(os.path.join(logdir, METRICS_FILE), enabled=enabled))
  return MultiWriter(writers, logdir)
