"""KerasTask: a compiled `keras.Model` (loss, metrics, optimizer) as a task, with no step code.

How Keras metrics reduce over loops and replicas. A Keras metric is stateful: `update_state` adds a batch to
its variables (AUC: true/false positive/negative counts per threshold; accuracy: a total and a count) and
`result()` computes the value from them. Its result is not a mean of per-batch values, so it cannot be a
`(value, weight)` pair. Instead the metric's variables are never touched on device: each step runs the metric's
update from a zero state (`keras.StatelessScope`), and the new state, the batch's contribution, is returned as
a metric component `(state, 1)`. Loops and replicas sum components elementwise (as they sum every metric), so
the host holds the state the metric would have after seeing every batch of the loop or run, on every replica;
`reduce_metrics` then computes the metric's `result()` from it, on the host. This needs a state that adds up
(its variables' `aggregation` is "sum", as for every built-in Keras metric) and resets to zeros; a metric
whose variables aggregate otherwise is refused when the task is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin
import keras
import numpy as np
import tensorflow as tf

from programs.core.data import array_dataset
from programs.core.errors import ConfigError
from programs.core.records import RecordFiles, record_dataset
from programs.core.task import Task

_STATE = "keras_metric_state/"  # Prefix of the summed metric-state components; never written as summaries.


@gin.configurable
class KerasTask(Task):
  """A task made of a `keras.Model` and a dataset function.

  `model_fn()` builds the model; if it also `compile`s it (loss, metrics, optimizer), that is what trains and
  evaluates; else the task compiles it with `loss`, `metrics` and `optimizer_fn`. Train steps minimise the
  compiled loss (with the model's regularisation losses); train and eval programs report `loss` and every
  compiled metric, reduced over loops and replicas as `model.evaluate` would over the same examples (see the
  module docstring); a decode program writes the model's predictions (and the labels) of every example.

  `dataset_fn(split)` returns the examples of a split, unbatched: a `tf.data.Dataset` of `(x, y)` or
  `(x, y, sample_weight)`, a tuple of arrays of that form, or `RecordFiles(files, parse)` (indexed TFRecord
  files; `parse` maps a batch of serialized records to such a tuple). The task shards them over the input
  pipelines, shuffles (seeded, so a resumed run reads the same batches), repeats and batches the train split,
  and batches the others. A resume opens arrays and record files at the saved example in constant time
  (`array_dataset`, `record_dataset`: a new permutation each epoch, `shuffle_buffer` unused); a
  `tf.data.Dataset` resumes from its saved iterator state where tf.data can save it, else it is replayed.
  """

  def __init__(
    self,
    model_fn: Callable[[], keras.Model],
    dataset_fn: Callable[[str], Any],
    splits: Sequence[str] = ("train", "test"),
    train_split: str = "train",
    loss: Any = None,
    metrics: Sequence[Any] = (),
    shuffle_buffer: int = 10000,
    seed: int = 0,
    callbacks: Sequence[Any] = (),
    **kwargs,
  ):
    """Configures the task; see `Task` for the shared arguments (`global_batch_size`, `optimizer_fn`, ...).

    Args:
      model_fn: Zero-argument callable returning the `keras.Model`, compiled or not; called once, under the
        strategy's scope.
      dataset_fn: `dataset_fn(split)` -> the split's examples, unbatched (see the class docstring).
      splits: The splits `dataset_fn` knows.
      train_split: The split that is shuffled, repeated forever and batched with `drop_remainder`.
      loss: For a model `model_fn` does not compile: the loss, as `model.compile` takes it.
      metrics: For a model `model_fn` does not compile: the metrics, as `model.compile` takes them.
      shuffle_buffer: Examples in the shuffle buffer of a `tf.data.Dataset` train split (0: no shuffling).
      seed: Seed of the shuffle.
      callbacks: Keras callbacks, as `fit` takes them: the executor runs each as its own mechanism (an action,
        its checkpoints, its summaries) or refuses it at start in one line naming what to use instead.
      **kwargs: `Task` arguments.
    """
    super().__init__(**kwargs)
    self.model_fn = model_fn
    self.dataset_fn = dataset_fn
    self.splits = tuple(splits)
    if train_split not in self.splits:
      raise ConfigError(f"KerasTask.train_split '{train_split}' is not one of the splits {self.splits}")
    self.train_split = train_split
    self.loss = loss
    self.compile_metrics = list(metrics)
    self.shuffle_buffer = shuffle_buffer
    self.seed = seed
    self.callbacks = list(callbacks)
    self._state_variables: list[Any] | None = None  # Metric variables a step updates, set at the first trace.

  # ----- Building -------------------------------------------------------------

  def build(self) -> None:
    model = self.model_fn()
    if not isinstance(model, keras.Model):
      raise ConfigError(f"KerasTask.model_fn must return a keras.Model, got {type(model).__name__}")
    if not model.compiled:
      if self.loss is None:
        raise ConfigError(
          "KerasTask: the model of model_fn is not compiled; compile it in model_fn or set KerasTask.loss"
        )
      model.compile(optimizer=self._optimizer_fn(), loss=self.loss, metrics=self.compile_metrics or None)
    self.model = model
    if model.optimizer is not None:
      self.optimizer = model.optimizer
    # Create every metric and loss variable now (Keras builds them lazily, from the first batch); the
    # steps only read their shapes. This is Keras' own build of compiled state, as fit and evaluate do it.
    model._symbolic_build(data_batch=self._example_spec(batched=True))
    for metric in model.metrics:
      for variable in metric.variables:
        if variable.aggregation != "sum":
          raise ConfigError(
            f"KerasTask: metric '{metric.name}' has a variable '{variable.path}' that aggregates by "
            f"'{variable.aggregation}', not 'sum'; its state cannot be summed over batches and replicas"
          )
    super().build()

  def _example_spec(self, batched: bool):
    spec = self._examples(self.train_split).element_spec
    if not batched:
      return spec
    return tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape], s.dtype), spec)

  # ----- Data -----------------------------------------------------------------

  def _examples(self, split: str) -> tf.data.Dataset:
    data = self.dataset_fn(split)
    if isinstance(data, tf.data.Dataset):
      return data
    if isinstance(data, RecordFiles):
      one = tf.data.TFRecordDataset(list(data.files)[:1]).take(1).batch(1)
      return one.map(data.parse).unbatch()  # Only its element_spec is used.
    if isinstance(data, (tuple, list)):
      return tf.data.Dataset.from_tensor_slices(tuple(data))
    raise ConfigError(
      f"KerasTask.dataset_fn('{split}') must return a tf.data.Dataset, a tuple of arrays or RecordFiles, got "
      f"{type(data).__name__}"
    )

  def seekable(self, split: str | None = None) -> bool:
    """Whether `dataset(split)` opens at `start_example` in constant time.

    Yes for arrays and `RecordFiles`; a `tf.data.Dataset` resumes from its saved iterator state (or replays).
    """
    return not isinstance(self.dataset_fn(split or self.train_split), tf.data.Dataset)

  def dataset(
    self, split: str, input_context: tf.distribute.InputContext, start_example: int = 0
  ) -> tf.data.Dataset:
    data = self.dataset_fn(split)
    batch = input_context.get_per_replica_batch_size(self.global_batch_size)
    train = split == self.train_split
    if isinstance(data, RecordFiles):
      return record_dataset(
        data.files, data.parse, input_context, self.global_batch_size, train, self.seed, start_example
      )
    if train and not isinstance(data, tf.data.Dataset):
      # Arrays: a new permutation each epoch, opened at any example in O(1) (`array_dataset`).
      arrays = {str(i): np.asarray(a) for i, a in enumerate(data)}
      ds = array_dataset(arrays, input_context, self.global_batch_size, True, self.seed, start_example)
      return ds.map(lambda d: tuple(d[str(i)] for i in range(len(arrays))))
    ds = self._examples(split).shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if train:
      if self.shuffle_buffer:
        ds = ds.shuffle(self.shuffle_buffer, seed=self.seed, reshuffle_each_iteration=True)
      ds = ds.repeat().batch(batch, drop_remainder=True)
    else:
      ds = ds.batch(batch)
    return ds.prefetch(tf.data.AUTOTUNE)

  # ----- Device steps ---------------------------------------------------------

  def compute_loss(self, batch, training):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    y_pred = self.model(x, training=training)
    loss = self.model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=training)
    # Keras losses come divided by the replica count (tf.distribute's convention); Task.train_step does that.
    num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if num_replicas > 1:
      loss = loss * num_replicas
    count = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], tf.float32)
    metrics = {"loss": (loss, count)}
    for i, state in enumerate(
      self._metric_states(x, y, tf.nest.map_structure(tf.stop_gradient, y_pred), sample_weight)
    ):
      metrics[f"{_STATE}{i}"] = (state, tf.constant(1.0))
    return loss, metrics, {}

  def _metric_states(self, x, y, y_pred, sample_weight) -> list[tf.Tensor]:
    """The compiled metrics' state after this batch alone (their update from zeros, without assigning)."""
    variables = self.model.metrics_variables
    zeros = [tf.zeros(v.shape, v.dtype) for v in variables]
    with keras.StatelessScope(state_mapping=list(zip(variables, zeros))) as scope:
      initial = [scope.get_current_value(v) for v in variables]
      self.model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    updated = [(v, scope.get_current_value(v)) for v in variables]
    updated = [(v, value) for (v, value), first in zip(updated, initial) if value is not first]
    names = [v.path for v, _ in updated]
    if self._state_variables is None:
      self._state_variables = [v for v, _ in updated]
    elif names != [v.path for v in self._state_variables]:
      raise RuntimeError(f"KerasTask: the metrics updated different variables in two traces: {names}")
    return [value for _, value in updated]

  def decode_step(self, batch):
    x, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
    y_pred = self.model(x, training=False)
    out = _named("prediction", y_pred)
    if y is not None:
      out.update(_named("label", y))
    return out

  # ----- Serving --------------------------------------------------------------

  def export(self, directory: str, split: str) -> list[str]:
    """Exports the model with Keras' own `model.export`: `serving_default` (and `serve`) is the model's call.

    The input signature is the features (`x`) of `split`'s examples with a polymorphic batch dimension; the
    output `output_0` is what a decode program writes as `prediction`.
    """
    x, _, _ = keras.utils.unpack_x_y_sample_weight(tuple(self._examples(split).element_spec))
    if isinstance(x, tf.TensorSpec):  # One input, named as Keras names a model's input.
      specs = tf.TensorSpec([None, *x.shape], x.dtype, name="inputs")
    else:
      specs = tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape], s.dtype), x)
    self.model.export(directory, format="tf_saved_model", verbose=False, input_signature=[specs])
    return ["serve", "serving_default"]

  # ----- Host -----------------------------------------------------------------

  def reduce_metrics(self, sums: Mapping[str, Any], weights: Mapping[str, float]) -> dict[str, float]:
    """`loss` (and the train step's own metrics) as weighted means; each Keras metric from its summed state."""
    plain = {k: v for k, v in sums.items() if not k.startswith(_STATE)}
    metrics = super().reduce_metrics(plain, weights)
    states = [
      sums[k] for k in sorted((k for k in sums if k.startswith(_STATE)), key=lambda k: int(k[len(_STATE) :]))
    ]
    if not states:
      return metrics
    variables = self._state_variables or []
    by_id = {id(v): tf.constant(np.asarray(s), dtype=v.dtype) for v, s in zip(variables, states)}
    mapping = [(v, by_id.get(id(v), tf.zeros(v.shape, v.dtype))) for v in self.model.metrics_variables]
    with keras.StatelessScope(state_mapping=mapping):
      for metric in self.model.metrics:
        if not any(id(v) in by_id for v in metric.variables):
          continue  # Not updated by compute_metrics: the loss tracker (loss is reported above).
        result = metric.result()
        results = result if isinstance(result, dict) else {metric.name: result}
        metrics.update({name: float(np.asarray(value)) for name, value in results.items()})
    return metrics


def _named(prefix: str, value) -> dict[str, tf.Tensor]:
  """`{prefix: tensor}`, or `{prefix/name: tensor}` for a model with several (dict or list) outputs."""
  if isinstance(value, Mapping):
    return {f"{prefix}/{k}": v for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return {f"{prefix}/{i}": v for i, v in enumerate(value)}
  return {prefix: value}
