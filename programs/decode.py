"""DecodeProgram: device decode loop, then host post-processing in a worker thread."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import time
from typing import Any

import gin
from absl import logging

from programs.core.errors import check_value
from programs.core.files import atomic_write
from programs.core.results import MetricsText, ProgramResult
from programs.core.task import Task
from programs.eval import SplitProgram

_RECORDS = re.compile(r"^decoder_out_(\d+)\.jsonl$")


@gin.configurable
class DecodeProgram(SplitProgram):
  """Decodes a split on device and post-processes the outputs on the host.

  The device loop gathers every replica's per-example outputs; the host then
  runs `task.postprocess_decode` in a worker thread (so the device moves on to
  the next program), writes every record to
  `decode_<split>/decoder_out_<step>.jsonl` and the metrics, `decode_secs`,
  `postprocess_secs`, `examples/sec` and a markdown sample of records to
  `decode_<split>/` summaries. Records are kept for the last `keep_records`
  decodes, and for the steps of the kept and best checkpoints.
  """

  kind = "decode"

  def __init__(
    self,
    task: Task,
    split: str = "test",
    num_batches: int | None = None,
    async_postprocess: bool = True,
    num_samples_in_summary: int = 5,
    name: str | None = None,
    steps_per_loop: int = 100,
    use_ema: bool = False,
    trigger_interval: int = 1,
    trigger_offset: int = 0,
    keep_records: int | None = 10,
  ):
    """Configures the decode program.

    Args:
      task: The task to decode with.
      split: The split to decode; must be finite if `num_batches` is None.
      num_batches: Batches per decode; None runs until the split ends.
      async_postprocess: Post-process in a worker thread; False waits for it.
      num_samples_in_summary: Records shown in the text summary.
      name: Summary folder name; defaults to `decode_<split>`.
      steps_per_loop: Decode steps per compiled call.
      use_ema: Run on the EMA of the weights (`Task.ema_decay`).
      trigger_interval: Run in every this many schedule cycles.
      trigger_offset: ... in the cycles whose index modulo `trigger_interval`
        is this.
      keep_records: Keep the `decoder_out_<step>.jsonl` of this many latest
        decodes, plus those of the steps of kept and best checkpoints; older
        ones are deleted after each decode. None keeps them all.
    """
    super().__init__(
      task, split, num_batches, steps_per_loop, use_ema, trigger_interval, trigger_offset, name
    )
    self.keep_records = check_value(
      "DecodeProgram.keep_records", keep_records, integer=True, minimum=1, optional=True
    )
    self.async_postprocess = async_postprocess
    check_value("DecodeProgram.num_samples_in_summary", num_samples_in_summary, integer=True, minimum=0)
    self.num_samples_in_summary = num_samples_in_summary
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
    self._pending: concurrent.futures.Future | None = None
    self.last_metrics: dict[str, float] | None = None

  def _step_fn(self, batch):
    return {}, self.task.decode_step(batch)

  def run(self) -> ProgramResult:
    """Decodes once at the current global step; post-processing may still run after."""
    step = self.runtime.step()
    start = time.perf_counter()
    acc = self._run_until(*self._run_input())
    return self.postprocess(acc.per_example(), acc.steps, step, time.perf_counter() - start)

  def postprocess(
    self, per_example: dict[str, Any], steps: int, step: int, decode_secs: float
  ) -> ProgramResult:
    """Hands decoder outputs to the host post-processing (in the worker thread)."""
    self.wait()  # One post-processing at a time; surfaces its errors here.
    if self.runtime.is_chief:  # Every worker holds all records; one writes them.
      self._pending = self._pool.submit(self._postprocess, per_example, step, decode_secs)
      if not self.async_postprocess:
        self.wait()
    return ProgramResult(step=step, steps=steps, metrics={}, per_example=per_example, secs=decode_secs)

  def metric_names(self) -> set[str] | None:
    """Not known before a run: the host's `postprocess_decode` makes the metrics."""
    return None

  def final_metrics(self, result: ProgramResult) -> dict[str, float]:
    self.wait()
    return dict(self.last_metrics or {})

  def wait(self) -> None:
    """Waits for the pending post-processing and re-raises its error, if any."""
    pending, self._pending = self._pending, None
    if pending is not None:
      pending.result()

  def busy(self) -> bool:
    return self._pending is not None and not self._pending.done()

  def close(self) -> None:
    super().close()
    self._pool.shutdown(wait=True)

  def output_path(self, step: int) -> str:
    """Where the records decoded at `step` are written."""
    return os.path.join(self.writer.logdir, f"decoder_out_{step}.jsonl")

  def _postprocess(self, per_example: dict[str, Any], step: int, decode_secs: float) -> None:
    start = time.perf_counter()
    with self._failures_named(f"the post-processing of step {step}", step=step):
      records, metrics = self.task.postprocess_decode(per_example)
    post_secs = time.perf_counter() - start
    num = len(records)
    _write_jsonl(self.output_path(step), records)
    self._prune_records(step)
    scalars = {k: float(v) for k, v in metrics.items()}
    scalars.update(
      {
        "decode_secs": decode_secs,
        "postprocess_secs": post_secs,
        "examples/sec": num / decode_secs if decode_secs else 0.0,
      }
    )
    self.writer.scalars(scalars, step)
    self.writer.text("samples", _markdown_table(records[: self.num_samples_in_summary]), step)
    self.last_metrics = {k: float(v) for k, v in metrics.items()}
    logging.info("%s step %d: %d records, %s", self.name, step, num, MetricsText(self.last_metrics))

  def _prune_records(self, step: int) -> None:
    """Deletes the records beyond `keep_records` but those of `keep_steps` (regular files of this folder only)."""
    if self.keep_records is None:
      return
    folder = self.writer.logdir
    steps = sorted(int(m.group(1)) for m in map(_RECORDS.match, os.listdir(folder)) if m)
    keep = {step, *steps[-self.keep_records :], *self.keep_steps()}
    for old in steps:
      path = self.output_path(old)
      if old not in keep and os.path.isfile(path) and not os.path.islink(path):
        with contextlib.suppress(FileNotFoundError):
          os.unlink(path)


def _write_jsonl(path: str, records: list[dict[str, Any]]) -> None:
  with atomic_write(path) as f:  # Whole or absent, even if the run is killed mid-write.
    for record in records:
      f.write(json.dumps(record, sort_keys=True) + "\n")


def _markdown_table(records: list[dict[str, Any]]) -> str:
  if not records:
    return "(no records)"
  columns = sorted({k for r in records for k in r})
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  for r in records:
    cells = [str(r.get(c, "")).replace("|", "\\|").replace("\n", " ") for c in columns]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)
