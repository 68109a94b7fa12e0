"""KerasTask: a compiled `keras.Model` (losses, metrics, optimizer) as a task, with no step code.

What `compile()` and `fit()` users rely on runs as `fit` runs it: the compiled losses (several outputs,
`loss_weights`), `metrics` and `weighted_metrics` (named as `fit` names them in its logs, per-output losses
included), the model's own `compute_loss`/`compute_metrics` overrides, `class_weight`, sample weights as the
dataset's third element, and a model's own `train_step`/`test_step`. How metrics add up over loops and replicas:
`programs/core/keras_metrics.py`; what is saved besides the variables (every optimizer, the state `adapt()` leaves
outside variables): `programs/core/keras_state.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging

from programs.core import keras_metrics
from programs.core.data import array_dataset
from programs.core.errors import ConfigError, describe_spec, failing_line
from programs.core.keras_checks import batched_examples, defines_call, log_compile_arguments, no_call
from programs.core.keras_class_weight import check_class_weight, check_class_weight_fits, class_sample_weights
from programs.core.keras_export import export_model
from programs.core.keras_state import ModelOptimizers, PreprocessingState, build_step_optimizers
from programs.core.records import RecordFiles, record_dataset
from programs.core.saved_names import adopt_saved_names
from programs.core.task import Task


@gin.configurable
class KerasTask(Task):
  """A task made of a `keras.Model` and a dataset function.

  `model_fn()` builds the model; if it also `compile`s it (losses, metrics, optimizer), that is what trains and
  evaluates; else the task compiles it with `loss`, `metrics` and `optimizer_fn`. Train steps minimise the
  compiled loss (with the model's regularisation losses) as `fit` does, with `class_weight` as `fit` applies it;
  train and eval programs report what `fit` and `evaluate` log (`loss`, per-output losses, every compiled metric,
  under `fit`'s names), reduced over loops and replicas as `evaluate` would over the same examples (a train loop
  is the "epoch" of its metrics). A model that overrides `train_step` (or `test_step`) runs its own step as the
  program's step, its metric trackers counted from zero each loop or run as `fit` resets them each epoch
  (`programs/core/keras_metrics.py`). A decode program writes the model's predictions (and the labels) of every
  example.

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
    class_weight: Mapping[int, float] | None = None,
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
      class_weight: `{class index: weight}`, as `fit(class_weight=...)` takes it: train steps weigh each example
        by its label's class (classes not listed weigh 1), as `fit` does. As in `fit`, only for a model with one
        output and a train split without sample weights.
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
    self.class_weight = check_class_weight(class_weight)
    self.shuffle_buffer = shuffle_buffer
    self.seed = seed
    self.callbacks = list(callbacks)
    self._own_train_step = self._own_test_step = self._own_predict_step = False
    self._preprocessing: PreprocessingState | None = None

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
    self._own_train_step = _overrides(model, "train_step")
    self._own_test_step = _overrides(model, "test_step")
    self._own_predict_step = _overrides(model, "predict_step")
    spec = self._example_spec(batched=True)
    if self.class_weight is not None:
      check_class_weight_fits(spec, f"KerasTask '{self.name}'", self.train_split)
    log_compile_arguments(self.name, model)
    if defines_call(model):
      self._symbolic_build(spec)
    elif not self._own_train_step:
      raise ConfigError(no_call(self.name, model, "Keras' train_step calls", "override train_step"))
    # Else (keras.io's DCGAN) the model's own train_step builds what it uses, as in fit: traced below.
    keras_metrics.check_summable(model)
    if self._own_train_step:
      build_step_optimizers(model, lambda batch: model.train_step(self._class_weighted(batch)), spec)
    self._preprocessing = PreprocessingState(model)

  def _symbolic_build(self, spec) -> None:
    """Creates every metric and loss variable now, as fit and evaluate do (Keras builds them at the first batch).

    The steps only read their shapes.
    """
    try:
      self.model._symbolic_build(data_batch=spec)  # noqa: SLF001
    except (ValueError, TypeError, KeyError, IndexError, RuntimeError, tf.errors.InvalidArgumentError) as e:
      batched = batched_examples(self.name, self.train_split, self.model, self._example_spec(batched=False))
      if batched:
        raise ConfigError(batched) from e
      line = failing_line(e)
      where = "" if line == "an unknown line" else f" at {line}"
      raise ConfigError(
        f"KerasTask '{self.name}': the model of model_fn does not fit the examples of split '{self.train_split}' "
        f"({describe_spec(spec)}){where}: {type(e).__name__}: {' '.join(str(e).split())[:400]}"
      ) from e

  def _build_optimizer_and_ema(self, loss_scale: dict[str, Any] | None = None) -> None:
    super()._build_optimizer_and_ema(loss_scale)
    if not self._own_train_step:
      return
    # A model's own train_step applies `self.optimizer`: the one the runtime wrapped for float16 loss scaling.
    if self.model.optimizer is not None and self.model.optimizer is not self.optimizer:
      self.model.optimizer = self.optimizer
    if loss_scale is not None and tf.distribute.get_strategy().num_replicas_in_sync > 1:
      logging.warning(
        "KerasTask '%s': %s.train_step runs in float16 on several replicas: Keras' LossScaleOptimizer decides "
        "from the first replica's gradients alone whether a step overflowed (fit does the same), so an overflow on "
        "another replica can put Inf into the weights (the train program then stops); the program's own step "
        "(no train_step override) checks every replica",
        self.name,
        type(self.model).__name__,
      )

  @property
  def own_train_step(self) -> str | None:
    """The model's own `train_step` (`GAN.train_step`) where it overrides Keras', else None."""
    return f"{type(self.model).__name__}.train_step" if self._own_train_step else None

  def checkpoint_items(self) -> dict[str, Any]:
    """The task's items, the model's other optimizers and its preprocessing state (`programs/core/keras_state.py`).

    `model_optimizers`: every optimizer the model holds besides the task's; `preprocessing`: the state `adapt()`
    gave preprocessing layers outside variables.
    """
    items = super().checkpoint_items()
    if self.model is not None:
      items["model_optimizers"] = ModelOptimizers(self.model, [self.optimizer])
      if self._preprocessing is not None and self._preprocessing.layers:
        items["preprocessing"] = self._preprocessing
    return items

  def checkpoint_optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
    """The task's optimizer and every other built optimizer the model holds (`model_optimizers/<attribute>`)."""
    optimizers = super().checkpoint_optimizers()
    if self.model is not None:
      others = ModelOptimizers(self.model, [self.optimizer]).optimizers()
      optimizers.update({f"model_optimizers/{name}": o for name, o in others.items()})
    return optimizers

  def restore_before_trace(self, checkpoint_path: str, item_prefix: str = "") -> None:
    """Reads the checkpoint's preprocessing state (vocabularies, bin boundaries) into the model before tracing.

    Raises:
      ConfigError: a layer was given (not adapted to) another vocabulary or bins than the checkpoint's.
    """
    if self._preprocessing is None or not self._preprocessing.layers:
      return
    items = {f"{item_prefix}preprocessing": self._preprocessing}
    adopt_saved_names(items, checkpoint_path)  # Layers Keras named after others built in this process.
    tf.train.Checkpoint(**items).read(checkpoint_path).expect_partial()
    refusals = self._preprocessing.refusals()
    if refusals:
      raise ConfigError(f"KerasTask '{self.name}': checkpoint '{checkpoint_path}': " + "; ".join(refusals))

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
    """The compiled loss of a batch (as `fit`'s step computes it) and every metric's state from this batch."""
    if training:
      batch = self._class_weighted(batch)
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(batch)
    y_pred = self.model(x, training=training)
    loss, states = keras_metrics.stateless_loss_and_states(self.model, x, y, y_pred, sample_weight, training)
    # Keras losses come divided by the replica count (tf.distribute's convention); the train step does that.
    num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if num_replicas > 1:
      loss = loss * num_replicas
    count = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], tf.float32)
    return loss, {"loss": (loss, count), **states}, {}

  def train_step(self, batch):
    """The model's own `train_step` (run only when the model overrides it: `own_train_step`)."""
    logs, components = keras_metrics.own_step_states(
      self.model, self.model.train_step, self._class_weighted(batch)
    )
    loss = logs.get("loss")
    return (None if loss is None else tf.cast(loss, tf.float32)), components, {}

  def eval_step(self, batch):
    """The model's own `test_step` where it overrides it, else the compiled loss and metrics."""
    if self._own_test_step:
      return keras_metrics.own_step_states(self.model, self.model.test_step, batch)[1]
    if not defines_call(self.model):
      raise ConfigError(
        no_call(
          self.name, self.model, "Keras' test_step calls", "override test_step, or schedule no EvalProgram"
        )
      )
    return super().eval_step(batch)

  def _class_weighted(self, batch):
    """`batch` with each example weighted by its label's class (`class_weight`), as `fit` weighs it."""
    if self.class_weight is None:
      return batch
    x, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
    return x, y, class_sample_weights(y, self.class_weight)

  def decode_step(self, batch):
    """The model's predictions (its own `predict_step` where it overrides Keras') and the labels of a batch."""
    if not (self._own_predict_step or defines_call(self.model)):
      raise ConfigError(
        no_call(self.name, self.model, "a decode program calls", "override predict_step, or decode no split")
      )
    x, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
    y_pred = self.model.predict_step((x,)) if self._own_predict_step else self.model(x, training=False)
    out = _named("prediction", y_pred)
    if y is not None:
      out.update(_named("label", y))
    return out

  # ----- Serving --------------------------------------------------------------

  def export(self, directory: str, split: str) -> list[str]:
    """Exports the model's call: `serving_default` (and `serve`) takes the model's inputs alone, by their names.

    A model built on `keras.Input`s takes those (a dict of inputs by its keys: `serve(age=..., ca=...)`); one
    without (subclassed) takes the features `x` of `split`'s examples. The outputs are the model's, by their
    names (a decode program writes them as `prediction`); see `programs/core/keras_export.py`.
    """
    if not defines_call(self.model):
      raise ConfigError(
        no_call(
          self.name,
          self.model,
          "an export serves",
          "export the part you serve yourself (task.model.generator.export(path) after Executor.load_model())",
        )
      )
    # As `fit` unpacks an example: a tuple is `(x, y, sample_weight)`, anything else (a GAN's images) is `x` alone.
    x, _, _ = keras.utils.unpack_x_y_sample_weight(self._examples(split).element_spec)
    return export_model(self.model, directory, x)

  # ----- Host -----------------------------------------------------------------

  def reduce_metrics(self, sums: Mapping[str, Any], weights: Mapping[str, float]) -> dict[str, float]:
    """What `fit` logs, from what loops and replicas summed.

    `loss` as a weighted mean, each Keras metric from its summed state; for a model's own step, the logs it
    returns (a tracker's result where a log is one, else the mean over the steps and replicas).
    """
    special = (keras_metrics.STATE, keras_metrics.LOG)
    metrics = super().reduce_metrics({k: v for k, v in sums.items() if not k.startswith(special)}, weights)
    results = keras_metrics.metric_results(self.model, sums)
    logs = [k for k in sums if k.startswith(keras_metrics.LOG)]
    if not logs:
      metrics.update(results)
      return metrics
    for key in logs:
      name = key[len(keras_metrics.LOG) :]
      metrics[name] = (
        results[name]
        if name in results
        else super().reduce_metrics({name: sums[key]}, {name: weights[key]})[name]
      )
    return metrics


def _overrides(model: keras.Model, method: str) -> bool:
  """Whether the model's class overrides Keras' `method` (`train_step`, `test_step`)."""
  return getattr(type(model), method) is not getattr(keras.Model, method)


def _named(prefix: str, value) -> dict[str, tf.Tensor]:
  """`{prefix: tensor}`, or `{prefix/name: tensor}` for a model with several (dict or list) outputs."""
  if isinstance(value, Mapping):
    return {f"{prefix}/{k}": v for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return {f"{prefix}/{i}": v for i, v in enumerate(value)}
  return {prefix: value}
