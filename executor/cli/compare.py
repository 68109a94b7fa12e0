"""`executor report DIR DIR ...`: one table comparing runs (a sweep), from their files only.

Each run's hparams (the gin bindings it wrote for TensorBoard's HParams dashboard) that differ between the runs,
its last checkpoint's step, and the last and best value of every eval and decode metric.
"""

from __future__ import annotations

import os

from executor.cli.report import CHECKPOINTS, list_checkpoints
from programs.core.errors import ConfigError


def is_run(folder: str) -> bool:
  """Whether `folder` is a model_dir: it holds checkpoints, an operative config or event files of its own."""
  if not os.path.isdir(folder):
    return False
  names = os.listdir(folder)
  return CHECKPOINTS in names or "operative_config.gin" in names or any(".tfevents." in n for n in names)


def find_runs(paths: list[str]) -> list[str]:
  """The runs to compare: each path that is a run, and the runs directly inside each one that is not.

  Raises:
    ConfigError: a path does not exist, or no run is found.
  """
  runs = []
  for path in paths:
    if not os.path.isdir(path):
      raise ConfigError(f"report: '{path}' does not exist or is not a directory")
    if is_run(path):
      runs.append(path)
      continue
    inside = [os.path.join(path, n) for n in sorted(os.listdir(path)) if is_run(os.path.join(path, n))]
    if not inside:
      raise ConfigError(f"report: '{path}' is not a run (model_dir) and holds none")
    runs += inside
  return runs


def run_hparams(model_dir: str) -> dict[str, object]:
  """The hparams the run wrote for TensorBoard's HParams dashboard (its differing gin bindings); {} if none."""
  from tensorboard.backend.event_processing import plugin_event_accumulator as accumulator
  from tensorboard.plugins.hparams import metadata

  acc = accumulator.EventAccumulator(model_dir, size_guidance={accumulator.TENSORS: 1})
  acc.Reload()
  if metadata.SESSION_START_INFO_TAG not in acc.Tags().get(accumulator.TENSORS, []):
    return {}
  content = acc.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content
  info = metadata.parse_session_start_info_plugin_data(content)
  out = {}
  for name, value in info.hparams.items():
    kind = value.WhichOneof("kind")
    out[name] = getattr(value, kind) if kind else None
  return out


def compare(paths: list[str]) -> str:
  """One table comparing runs: the hparams that differ, the last step, the last and best eval/decode metrics.

  Args:
    paths: Runs (model_dirs), or folders of runs (a sweep).

  Returns:
    The table, lines ending in newlines. Best is the lowest value of losses and errors, the highest of others
    (`executor.hparams.lower_is_better`).
  """
  from executor.hparams import lower_is_better, metric_folders, metric_history

  runs = find_runs(paths)
  hparams = [run_hparams(r) for r in runs]
  names = sorted({n for h in hparams for n in h})
  differing = [n for n in names if len({repr(h.get(n)) for h in hparams}) > 1]
  rows, metrics = [], set()
  for run in runs:
    row = {}
    for folder in metric_folders(run):
      for tag, points in metric_history(run, folder).items():
        if tag.endswith("_secs") or tag.endswith("examples/sec"):
          continue
        values = [v for _, v in points if v == v]
        name = f"{folder}/{tag}"
        metrics.add(name)
        row[name] = (
          points[-1][1],
          (min(values) if lower_is_better(tag) else max(values)) if values else None,
        )
    listed = [c for c in list_checkpoints(os.path.join(run, CHECKPOINTS)) if c.in_state]
    row["step"] = listed[-1].step if listed else None
    rows.append(row)
  header = ["run", *differing, "step"]
  for m in sorted(metrics):
    header += [f"{m} last", f"{m} best"]
  table = [header]
  common = os.path.commonpath([os.path.abspath(r) for r in runs]) if len(runs) > 1 else ""
  for run, h, row in zip(runs, hparams, rows):
    label = os.path.relpath(os.path.abspath(run), common) if common else run
    cells = [label, *(_cell(h.get(n)) for n in differing), _cell(row["step"])]
    for m in sorted(metrics):
      last, best = row.get(m, (None, None))
      cells += [_cell(last), _cell(best)]
    table.append(cells)
  widths = [max(len(r[i]) for r in table) for i in range(len(header))]
  lines = [f"Runs compared: {len(runs)}" + (f" (in {common})" if common else "")]
  if not differing:
    lines.append(
      "Hparams: none differ between the runs" if hparams and any(hparams) else "Hparams: none recorded"
    )
  for r in table:
    lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
  return "\n".join(lines) + "\n"


def _cell(value) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.6g}"
  return str(value)
