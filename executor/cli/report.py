"""A plain-text report of a run directory, from its files only.

`executor report --model_dir=DIR` prints it. Nothing runs on a TF device: the
checkpoint state file and checkpoint index files are read with TensorFlow's
file readers, the event files with TensorBoard's own loader (as `tensorboard`
serves them: after a resume, the resumed run's values), so a report can be
made while a run is writing to the same `model_dir`.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import time

from executor.lock import LOCK_NAME
from programs.core.errors import ConfigError

CHECKPOINTS = "checkpoints"
_GLOBAL_STEP_KEY = "global_step/.ATTRIBUTES/VARIABLE_VALUE"


@dataclasses.dataclass(frozen=True)
class Point:
  """The last event of one summary tag."""

  step: int
  wall_time: float
  value: float | None = None


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
  """One checkpoint of `model_dir/checkpoints`."""

  name: str
  step: int | None
  mtime: float | None
  size: int
  in_state: bool
  note: str = ""


@dataclasses.dataclass
class ProgramSummaries:
  """The last point of every tag in one summary folder (a TensorBoard run)."""

  name: str
  scalars: dict[str, Point]
  texts: dict[str, Point]
  others: dict[str, Point]
  damaged: list[str] = dataclasses.field(default_factory=list)

  def newest(self) -> Point | None:
    """The point with the highest step (then the latest wall time), or None."""
    points = [*self.scalars.values(), *self.texts.values(), *self.others.values()]
    return max(points, key=lambda p: (p.step, p.wall_time), default=None)


def report(model_dir: str) -> str:
  """Builds a plain-text report of the run in `model_dir`.

  The report holds the latest step (of the latest checkpoint and the newest
  in the summaries), the checkpoints kept (name, step, modification time,
  size) and, for each summary folder (`train`, `eval_<split>`,
  `decode_<split>`, `executor`, ...), the last value and step of every scalar
  tag and the last step of every other tag.

  Args:
    model_dir: The run's directory, as given to `executor --model_dir`.

  Returns:
    The report, lines ending in newlines.

  Raises:
    ConfigError: `model_dir` is not given, does not exist, is not a directory,
      or holds neither checkpoints nor event files.
  """
  if not model_dir:
    raise ConfigError("report needs --model_dir")
  if not os.path.exists(model_dir):
    raise ConfigError(f"model_dir '{model_dir}' does not exist")
  if not os.path.isdir(model_dir):
    raise ConfigError(f"model_dir '{model_dir}' is not a directory")
  checkpoints = list_checkpoints(os.path.join(model_dir, CHECKPOINTS))
  programs = [read_summaries(model_dir, folder) for folder in summary_folders(model_dir)]
  if not checkpoints and not programs:
    raise ConfigError(
      f"model_dir '{model_dir}' holds no run: no checkpoints in '{os.path.join(model_dir, CHECKPOINTS)}' "
      "and no TensorBoard event files"
    )
  now = time.time()
  lines = [f"Run: {os.path.abspath(model_dir)}"]
  lines += _step_lines(checkpoints, programs, now)
  lock = _lock_holder(model_dir)
  if lock:
    lines.append(f"Lock: held by {lock} (a training run is in progress, or was killed)")
  lines.append("")
  lines += _checkpoint_lines(os.path.join(model_dir, CHECKPOINTS), checkpoints, now)
  lines.append("")
  lines += _summary_lines(programs)
  return "\n".join(lines) + "\n"


def list_checkpoints(directory: str) -> list[CheckpointInfo]:
  """The checkpoints in `directory`, oldest first.

  Those named by the `checkpoint` state file come first, in its order (the
  last one is the latest); checkpoint files the state file does not name (a
  write in progress or cut short, or kept by hand) follow, with a note.

  A checkpoint's step is its saved global step, read from its index and the
  step's bytes only (the checkpoint's name when that fails, with a note that
  it is unreadable). The other tensors are not read: a truncated data file
  goes unnoticed here; the executor's restore detects it.
  """
  if not os.path.isdir(directory):
    return []
  import tensorflow as tf

  pointer = os.path.join(directory, "checkpoint")
  try:
    state = tf.train.get_checkpoint_state(directory)
  except Exception as e:  # noqa: BLE001  (a garbled text proto: ParseError, UnicodeDecodeError, ...)
    state, error = None, f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
  else:
    error = "not a checkpoint state"
  if state is None and os.path.exists(pointer):
    raise ConfigError(
      f"checkpoint state file '{pointer}' is unreadable ({error}); the next run of the executor rebuilds it from "
      "the checkpoint files"
    )
  listed = [
    os.path.join(directory, os.path.basename(p)) for p in (state.all_model_checkpoint_paths if state else [])
  ]
  if state and state.model_checkpoint_path:
    latest = os.path.join(directory, os.path.basename(state.model_checkpoint_path))
    if latest not in listed:
      listed.append(latest)
  out = [_checkpoint_info(prefix, in_state=True) for prefix in listed]
  unlisted = sorted(
    (p[: -len(".index")] for p in glob.glob(os.path.join(glob.escape(directory), "*.index"))),
    key=lambda p: (_step_from_name(p) is None, _step_from_name(p) or 0, p),
  )
  out += [
    _checkpoint_info(
      p, in_state=False, note="not in the checkpoint state file: being written, cut short or left over"
    )
    for p in unlisted
    if p not in listed
  ]
  return out


def summary_folders(model_dir: str) -> list[str]:
  """Every folder under `model_dir` holding event files, relative, sorted."""
  folders = []
  for root, dirs, files in os.walk(model_dir):
    dirs.sort()
    if any(".tfevents." in f for f in files):
      folders.append(os.path.relpath(root, model_dir))
  return sorted(folders)


def read_summaries(model_dir: str, folder: str) -> ProgramSummaries:
  """The last point of every tag in the event files of `model_dir/folder`, as `tensorboard` serves them.

  Read with TensorBoard's own loader (`plugin_event_accumulator`, which the server uses), with its purge of
  orphaned steps: after a resume, the resumed run's values (the legacy `EventAccumulator` does not purge TF2
  tensor summaries). Every summary comes back as a tensor tagged with its plugin; TF1 scalars are migrated.
  """
  from tensorboard.backend.event_processing import plugin_event_accumulator as accumulator
  from tensorboard.util import tensor_util

  # Size 1 keeps only the newest event of each tag (the reservoir always keeps
  # the last one), so memory stays small on long runs.
  acc = accumulator.EventAccumulator(
    os.path.join(model_dir, folder),
    size_guidance={accumulator.TENSORS: 1},
    tensor_size_guidance={},
    purge_orphaned_data=True,
  )
  acc.Reload()
  damaged = _damaged_event_files(os.path.join(model_dir, folder))
  scalars, texts, others = {}, {}, {}
  for tag in acc.Tags().get(accumulator.TENSORS, []):
    events = acc.Tensors(tag)
    if not events:
      continue
    e = events[-1]
    plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
    array = tensor_util.make_ndarray(e.tensor_proto)
    numeric = array.dtype.kind in "biuf" and array.size == 1
    if plugin == "scalars" or (not plugin and numeric):
      scalars[tag] = Point(e.step, e.wall_time, float(array.reshape(())))
    elif plugin == "text":
      texts[tag] = Point(e.step, e.wall_time)
    else:
      others[tag] = Point(e.step, e.wall_time)
  name = "." if folder == os.curdir else folder
  return ProgramSummaries(name, scalars, texts, others, damaged)


def _checkpoint_info(prefix: str, in_state: bool, note: str = "") -> CheckpointInfo:
  files = glob.glob(glob.escape(prefix) + ".*")
  size = sum(os.path.getsize(f) for f in files if os.path.isfile(f))
  index = prefix + ".index"
  mtime = max((os.path.getmtime(f) for f in files), default=None)
  step = None
  if not os.path.exists(index):
    note = note or "missing: its files are gone"
  else:
    try:
      step = _read_global_step(prefix)
    except Exception as e:  # A truncated or corrupt file fails in many ways.  # noqa: BLE001
      message = str(e).splitlines()[0] if str(e) else type(e).__name__
      note = note or f"unreadable: {message}"
  if step is None:
    step = _step_from_name(prefix)
  return CheckpointInfo(os.path.basename(prefix), step, mtime, size, in_state, note)


def _read_global_step(prefix: str) -> int | None:
  """The global step saved in a checkpoint, read from its files (no device op)."""
  import tensorflow as tf

  reader = tf.train.load_checkpoint(prefix)
  if not reader.has_tensor(_GLOBAL_STEP_KEY):
    return None
  return int(reader.get_tensor(_GLOBAL_STEP_KEY))


def _step_from_name(prefix: str) -> int | None:
  """N of `.../ckpt-N` (the executor numbers checkpoints by global step)."""
  tail = os.path.basename(prefix).rsplit("-", 1)[-1]
  return int(tail) if tail.isdigit() else None


def _lock_holder(model_dir: str) -> str:
  try:
    with open(os.path.join(model_dir, LOCK_NAME)) as f:
      return f.read().strip()
  except OSError:
    return ""


def _step_lines(checkpoints: list[CheckpointInfo], programs: list[ProgramSummaries], now: float) -> list[str]:
  listed = [c for c in checkpoints if c.in_state]
  if listed:
    latest = listed[-1]
    note = f"; {latest.note}" if latest.note else ""
    ckpt = f"{latest.step if latest.step is not None else '?'} (checkpoint {latest.name}{note})"
  else:
    ckpt = "none (no checkpoint)"
  newest = [(p.newest(), p.name) for p in programs if p.newest() is not None]
  if newest:
    point, name = max(newest, key=lambda pn: (pn[0].step, pn[0].wall_time))
    wall = max(pn[0].wall_time for pn in newest)
    summary = f"{point.step} (in {name}/); last event written {_time(wall)} ({_age(now - wall)} ago)"
  else:
    summary = "none (no summaries)"
  return [f"Latest checkpoint step: {ckpt}", f"Newest summary step: {summary}"]


def _checkpoint_lines(directory: str, checkpoints: list[CheckpointInfo], now: float) -> list[str]:
  if not checkpoints:
    return [f"Checkpoints: none in {directory}"]
  lines = [f"Checkpoints in {directory} (oldest first):"]
  width = max(len(c.name) for c in checkpoints)
  for c in checkpoints:
    step = str(c.step) if c.step is not None else "?"
    when = f"{_time(c.mtime)} ({_age(now - c.mtime)} ago)" if c.mtime is not None else "-"
    line = f"  {c.name:<{width}}  step {step:>8}  modified {when}  {_size(c.size)}"
    lines.append(line + (f"  [{c.note}]" if c.note else ""))
  return lines


def _summary_lines(programs: list[ProgramSummaries]) -> list[str]:
  if not programs:
    return ["Summaries: none"]
  lines = ["Summaries (last value and step of each scalar):"]
  for program in programs:
    lines.append(f"  {program.name}/")
    tags = [*program.scalars, *program.texts, *program.others]
    width = max([len(t) for t in tags] + [1])
    for tag, p in sorted(program.scalars.items()):
      lines.append(f"    {tag:<{width}}  {p.value:<14.7g}  step {p.step}")
    for kind, points in (("text", program.texts), ("other", program.others)):
      for tag, p in sorted(points.items()):
        lines.append(f"    {tag:<{width}}  {'(' + kind + ')':<14}  step {p.step}")
    if not tags:
      lines.append("    (no tags yet)")
    for note in program.damaged:
      lines.append(f"    DAMAGED: {note}: the values above stop before the damage")
  return lines


def _time(t: float) -> str:
  return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _age(secs: float) -> str:
  secs = max(secs, 0.0)
  if secs < 120:
    return f"{secs:.0f}s"
  if secs < 7200:
    return f"{secs / 60:.0f}m"
  if secs < 172800:
    return f"{secs / 3600:.1f}h"
  return f"{secs / 86400:.1f}d"


def _size(n: int) -> str:
  for unit in ("B", "KB", "MB", "GB"):
    if n < 1024 or unit == "GB":
      return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
    n /= 1024
  return f"{n} B"


def _damaged_event_files(folder: str) -> list[str]:
  """'<file>: <error>' for each event file of `folder` that cannot be read to its end (TensorBoard skips the rest)."""
  import tensorflow as tf

  damaged = []
  for path in sorted(glob.glob(os.path.join(glob.escape(folder), "*.tfevents.*"))):
    try:
      for _ in tf.data.TFRecordDataset(path):
        pass
    except tf.errors.OpError as e:
      what = " ".join(re.sub(r"\{\{.*?\}\}", "", e.message).split())[:120]
      damaged.append(f"event file '{path}' is damaged or cut short ({what})")
  return damaged
