"""What device steps and loops produce, and what programs hand to the executor: the metric and result types."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

# {name: (value, weight)}: reduced to sum(value * weight) / sum(weight) over
# steps and replicas.
Metrics = dict[str, tuple[tf.Tensor, tf.Tensor]]
# {name: Tensor[batch, ...]}: collected over a loop and handed to the host.
PerExample = dict[str, tf.Tensor]


@dataclasses.dataclass
class LoopResult:
  """What one loop call hands to the host (numpy values).

  Attributes:
    steps: Steps actually run (fewer than asked when the data ended).
    metric_sums: `sum(value * weight)` per metric over steps and replicas (an array for a metric whose value
      is not a scalar).
    metric_weights: `sum(weight)` per metric.
    per_example: `{name: array[examples, ...]}` in step, then replica order.
    tail: What the tail function returned, `{name: numpy scalar}`.
  """

  steps: int
  metric_sums: dict[str, float | np.ndarray]
  metric_weights: dict[str, float]
  per_example: dict[str, np.ndarray]
  tail: dict[str, Any] = dataclasses.field(default_factory=dict)

  def means(self) -> dict[str, float]:
    """Weighted means of the metrics (NaN where no weight was seen)."""
    return {k: _safe_div(self.metric_sums[k], self.metric_weights[k]) for k in self.metric_sums}


class MetricAccumulator:
  """Adds up `LoopResult`s on the host (float64) into weighted means."""

  def __init__(self):
    self.steps = 0
    self._sums: dict[str, float] = {}
    self._weights: dict[str, float] = {}
    self._per_example: dict[str, list[np.ndarray]] = {}

  def add(self, result: LoopResult) -> None:
    """Accumulates one loop's sums, weights and per-example rows."""
    self.steps += result.steps
    for k, v in result.metric_sums.items():
      self._sums[k] = self._sums.get(k, 0.0) + host_value(v)
      self._weights[k] = self._weights.get(k, 0.0) + float(result.metric_weights[k])
    for k, v in result.per_example.items():
      self._per_example.setdefault(k, []).append(v)

  def means(self) -> dict[str, float]:
    """Weighted means over everything added."""
    return {k: _safe_div(self._sums[k], self._weights[k]) for k in self._sums}

  @property
  def sums(self) -> dict[str, float | np.ndarray]:
    """`sum(value * weight)` per metric over everything added (float64)."""
    return dict(self._sums)

  @property
  def weights(self) -> dict[str, float]:
    """`sum(weight)` per metric over everything added."""
    return dict(self._weights)

  def per_example(self) -> dict[str, np.ndarray]:
    """Per-example rows of every loop added, concatenated."""
    return {k: np.concatenate(v, axis=0) for k, v in self._per_example.items()}


def _safe_div(num, den: float):
  if np.ndim(num):
    return np.asarray(num, np.float64) / float(den) if den else np.full(np.shape(num), np.nan)
  return float(num) / float(den) if den else float("nan")


def host_value(value) -> float | np.ndarray:
  """A metric sum on the host: a float, or a float64 array for a metric whose value is not a scalar."""
  return np.asarray(value, np.float64) if np.ndim(value) else float(value)


@dataclasses.dataclass
class ProgramResult:
  """What one `Program.run` produced, on the host.

  Attributes:
    step: Global step the results belong to (after the run, for training).
    steps: Device steps run.
    metrics: Weighted means over the run.
    per_example: Per-example outputs collected over the run.
    secs: Wall time of the run.
    examples: Examples processed (train runs).
  """

  step: int
  steps: int
  metrics: dict[str, float]
  per_example: dict[str, np.ndarray]
  secs: float
  examples: int = 0


class MetricsText:
  """Metrics as `name value` pairs for a log line, formatted only if the line is written (`%s`)."""

  def __init__(self, metrics: dict[str, float]):
    self.metrics = metrics

  def __str__(self) -> str:
    return ", ".join(f"{k} {v:.5g}" for k, v in sorted(self.metrics.items()))
