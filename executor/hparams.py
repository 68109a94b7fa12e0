"""A run as one trial of a sweep: its hparams and best metrics, for TensorBoard's HParams dashboard and `report`.

Every training run writes, into `model_dir`'s own event files (the TensorBoard run of the model_dir, whose
sub-runs `train/`, `eval_<split>/`, `decode_<split>/` hold the metrics):
  - at start, an HParams session: the gin bindings the config sets (`gin_hparams`);
  - at the end, `best_metrics/` scalars: the best value so far of every eval and decode metric (`best_metrics`).
TensorBoard pointed at a folder of model_dirs then shows the sweep as a table and as parallel coordinates: the
hparams, the last value of every metric and the best ones (group `best_metrics`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import gin

BEST = "best_metrics"
# Metric names holding one of these are better when lower; the others when higher.
LOWER_IS_BETTER = ("loss", "error", "perplexity", "mse", "mae", "secs", "wer", "cer")


@gin.configurable("hparams")
def gin_hparams(names: Sequence[str] | None = None) -> dict[str, bool | int | float | str]:
  """The bindings the parsed gin config sets: what differs from the parameters' defaults.

  A binding that restates a default is kept (a sweep's run at the default value still shows it). With
  `names` (in gin: `hparams.names = ['Adam.learning_rate', 'TrainProgram.steps_per_loop']`), only those. Named `Configurable.param` (`scope/Configurable.param` when scoped; the full module path only when two
  configurables share a name); values that are not bool, int, float or str are shown as gin writes them.
  """
  config = gin.config._CONFIG  # noqa: SLF001  (gin has no public iterator over bindings)
  short: dict[str, set[str]] = {}
  for _, selector in config:
    short.setdefault(selector.rsplit(".", 1)[-1], set()).add(selector)
  out = {}
  for (scope, selector), params in config.items():
    name = selector.rsplit(".", 1)[-1]
    if len(short[name]) > 1:
      name = selector
    for param, value in params.items():
      key = f"{scope}/{name}.{param}" if scope else f"{name}.{param}"
      out[key] = value if isinstance(value, (bool, int, float, str)) else _gin_text(value)
  if names is not None:
    return {k: out[k] for k in sorted(names) if k in out}
  return dict(sorted(out.items()))


def write_hparams(model_dir: str, hparams: dict[str, Any], step: int) -> None:
  """Writes the HParams session of the run into `model_dir`'s own event files."""
  import tensorflow as tf
  from tensorboard.plugins.hparams import api as hp

  writer = tf.summary.create_file_writer(model_dir)
  with writer.as_default():
    hp.hparams(hparams, trial_id=os.path.basename(os.path.abspath(model_dir)), start_time_secs=None)
    writer.flush()
  writer.close()


def lower_is_better(metric: str) -> bool:
  """Whether `metric` (a tag such as `loss` or `eval_test/loss`) improves by going down."""
  name = metric.rsplit("/", 1)[-1].lower()
  return any(word in name for word in LOWER_IS_BETTER)


def metric_history(model_dir: str, folder: str) -> dict[str, list[tuple[int, float]]]:
  """{tag: [(step, value), ...]} of every scalar of `model_dir/folder`, as `tensorboard` serves them.

  Read with TensorBoard's own loader, purging what a killed run wrote past the step it resumed from.
  """
  from tensorboard.backend.event_processing import plugin_event_accumulator as accumulator
  from tensorboard.util import tensor_util

  acc = accumulator.EventAccumulator(
    os.path.join(model_dir, folder), size_guidance={accumulator.TENSORS: 0}, purge_orphaned_data=True
  )
  acc.Reload()
  out = {}
  for tag in acc.Tags().get(accumulator.TENSORS, []):
    if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
      continue
    values = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto).reshape(()))) for e in acc.Tensors(tag)]
    if values:
      out[tag] = values
  return out


def metric_folders(model_dir: str) -> list[str]:
  """The eval and decode summary folders of `model_dir` (`eval_<split>`, `decode_<split>`, ...), sorted."""
  if not os.path.isdir(model_dir):
    return []
  return sorted(
    name
    for name in os.listdir(model_dir)
    if name.startswith(("eval", "decode")) and os.path.isdir(os.path.join(model_dir, name))
  )


def best_metrics(model_dir: str, folders: Sequence[str] | None = None) -> dict[str, float]:
  """{`program/metric`: best value} of every eval and decode scalar (lowest for losses and errors)."""
  out = {}
  for folder in metric_folders(model_dir) if folders is None else folders:
    for tag, points in metric_history(model_dir, folder).items():
      if tag.endswith("_secs") or tag.endswith("examples/sec"):
        continue
      values = [v for _, v in points if not math.isnan(v)]
      if values:
        out[f"{folder}/{tag}"] = min(values) if lower_is_better(tag) else max(values)
  return out


def write_best(model_dir: str, step: int) -> dict[str, float]:
  """Writes `best_metrics` as scalars of `model_dir/best_metrics` at `step`; returns them."""
  import tensorflow as tf

  best = best_metrics(model_dir)
  if not best:
    return best
  writer = tf.summary.create_file_writer(os.path.join(model_dir, BEST))
  with writer.as_default():
    for tag, value in best.items():
      tf.summary.scalar(tag, value, step=step)
    writer.flush()
  writer.close()
  return best


def _gin_text(value: Any) -> str:
  if isinstance(value, (list, tuple)):
    inner = ", ".join(_gin_text(v) for v in value)
    return f"[{inner}]" if isinstance(value, list) else f"({inner})"
  if value is None:
    return "None"
  return str(value) if not isinstance(value, str) else repr(value)
