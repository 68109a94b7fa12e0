"""How a `KerasTask`'s Keras metrics add up over loops and replicas, and come back named as `fit` names them.

A Keras metric is stateful: `update_state` adds a batch to its variables (AUC: true/false positive/negative counts
per threshold; accuracy: a total and a count) and `result()` computes the value from them. Its result is not a mean
of per-batch values, so it cannot be a `(value, weight)` pair. Instead each step returns the state a batch alone
gives every metric variable (its update from zeros) as a metric component `(state, 1)` named
`keras_metric_state/<index in model.metrics_variables>`. Loops and replicas sum components elementwise (as they
sum every metric), so the host holds the state the metrics would have after seeing every batch of the loop or run,
on every replica, and computes each metric's `result()` from it (`metric_results`): over a train loop, what `fit`
reports for an epoch of those steps; over an eval run, what `evaluate` reports. This needs a state that adds up
(its variables aggregate by "sum", as every built-in Keras metric's do) and starts from zeros; a metric whose
variables aggregate otherwise is refused when the task is built (`check_summable`).

Two ways to get a batch's state:
- The model's own `compute_loss` and `compute_metrics` (overridden or not) run in a `keras.StatelessScope` that
  maps every metric variable to zeros: nothing is assigned, and the scope holds the new state
  (`stateless_loss_and_states`). The compiled loss's per-output trackers (`out_a_loss`) update there too.
- A model's own `train_step` or `test_step` updates its trackers as it would under `fit`: the step first zeroes
  every metric variable of its replica, then reads them after the model's step (`own_step_states`). Its logs come
  back as `keras_log/<name>` components: a log that is a tracker's result is reported from the summed state, any
  other value as its mean over the steps and replicas (`fit` shows the last batch's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from programs.core.errors import ConfigError

STATE = "keras_metric_state/"  # Summed metric-state components; never written as summaries.
LOG = "keras_log/"  # What a model's own step returns, by name.


def check_summable(model: keras.Model) -> None:
  """Refuses a metric whose state does not add up over batches and replicas (see the module docstring)."""
  for metric in model.metrics:
    for variable in metric.variables:
      if variable.aggregation != "sum":
        raise ConfigError(
          f"KerasTask: metric '{metric.name}' has a variable '{variable.path}' that aggregates by "
          f"'{variable.aggregation}', not 'sum'; its state cannot be summed over batches and replicas"
        )


def stateless_loss_and_states(
  model: keras.Model, x, y, y_pred, sample_weight, training: bool
) -> tuple[tf.Tensor, dict[str, tuple[tf.Tensor, tf.Tensor]]]:
  """The model's loss of a batch (`model.compute_loss`), and the state its metrics get from this batch alone.

  Metric variables read zeros and are never assigned; any other variable the model's `compute_loss` or
  `compute_metrics` assigns (an override that calls a layer with a seed or moving statistics) is assigned as
  usual afterwards.
  """
  metric_variables = model.metrics_variables
  metric_ids = {id(v) for v in metric_variables}
  zeros = [tf.zeros(v.shape, v.dtype) for v in metric_variables]
  mapping = list(zip(metric_variables, zeros))
  # Regularisers read their weights through the scope: map those to themselves (reads the tape watches).
  mapping += [(v, v) for v in model.trainable_weights if getattr(v, "regularizer", None) is not None]
  with keras.StatelessScope(state_mapping=mapping) as scope:
    initial = {id(v): scope.get_current_value(v) for v, _ in mapping}
    loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)  # noqa: SLF001
    model.compute_metrics(x, y, tf.nest.map_structure(tf.stop_gradient, y_pred), sample_weight=sample_weight)
  for variable in model.variables:  # Updates of model state inside the scope are applied, not dropped.
    value = scope.get_current_value(variable)
    if id(variable) not in metric_ids and value is not None and value is not initial.get(id(variable)):
      variable.assign(value)
  states = {}
  for i, variable in enumerate(metric_variables):
    value = scope.get_current_value(variable)
    if value is not initial[id(variable)]:
      states[f"{STATE}{i}"] = (value, tf.constant(1.0))
  return loss, states


def own_step_states(
  model: keras.Model, step: Callable[[Any], Any], batch
) -> tuple[dict[str, Any], dict[str, tuple[tf.Tensor, tf.Tensor]]]:
  """Runs the model's own `step` (`model.train_step` or `model.test_step`) on one replica's batch.

  Returns:
    (logs, components): the step's logs, and every metric variable's state from this batch alone
    (`keras_metric_state/<i>`) with each scalar log (`keras_log/<name>`).
  """
  variables = model.metrics_variables
  for variable in variables:
    variable.assign(tf.zeros(variable.shape, variable.dtype))
  logs = step(batch)
  if not isinstance(logs, Mapping):
    raise ConfigError(
      f"{type(model).__name__}.{step.__name__} returns {type(logs).__name__}, not a dict of logs as fit expects"
    )
  components = {f"{STATE}{i}": (tf.identity(v.value), tf.constant(1.0)) for i, v in enumerate(variables)}
  flat = {}
  for name, value in logs.items():  # A metric whose result is a dict (compiled metrics) logs each entry.
    flat.update(value if isinstance(value, Mapping) else {name: value})
  for name, value in flat.items():
    value = tf.convert_to_tensor(value)
    if value.shape.rank != 0:
      raise ConfigError(
        f"{type(model).__name__}.{step.__name__} returns the log '{name}' of shape {value.shape}; the executor "
        "reports scalar logs (return a metric's result, or reduce it to a scalar)"
      )
    components[f"{LOG}{name}"] = (value, tf.constant(1.0))
  return flat, components


def metric_results(model: keras.Model, sums: Mapping[str, Any]) -> dict[str, float]:
  """Each metric's `result()` from the summed states in `sums`, named as `fit` names it in its logs.

  A metric none of whose variables has a state in `sums` (not updated by the steps) is left out.
  """
  variables = model.metrics_variables
  states = {int(k[len(STATE) :]): v for k, v in sums.items() if k.startswith(STATE)}
  if not states:
    return {}
  index = {id(v): i for i, v in enumerate(variables)}
  mapping = [
    (v, tf.constant(np.asarray(states[i]), dtype=v.dtype) if i in states else tf.zeros(v.shape, v.dtype))
    for i, v in enumerate(variables)
  ]
  results = {}
  with keras.StatelessScope(state_mapping=mapping):
    for metric in model.metrics:
      if not any(index[id(v)] in states for v in metric.variables):
        continue
      result = metric.result()
      values = result if isinstance(result, dict) else {metric.name: result}
      results.update({name: float(np.asarray(value)) for name, value in values.items()})
  return results
