"""What a `KerasTask` saves of a Keras model besides its variables: its optimizers, and what `adapt()` keeps.

Besides variables: every optimizer the model holds, and the state `adapt()` gives preprocessing layers outside
variables.

Optimizers: a model with its own `train_step` may hold several (a GAN's `d_optimizer` and `g_optimizer`, set in
its own `compile`). Each is saved by name (`OptimizerState`) under `model_optimizers/<attribute>`; the one the
task trains with is the task's `optimizer` item.

Preprocessing: what `adapt` computes is read by the layer's calls as constants, which traced functions capture:
a lookup layer (`StringLookup`, `IntegerLookup`, the one inside `TextVectorization`) keeps its vocabulary, and its
IDF weights in `tf_idf` mode, in a hash table and a constant; `Discretization` keeps its bin boundaries in a
Python list; `Normalization` keeps its mean and variance in variables, but calls read constants made from them
when `adapt` ends. Restoring variables after the trace would not reach those, and TensorFlow checkpoints do not
save the others. They are saved here (`PreprocessingState`, item `preprocessing/<layer name>`) and, on a resume, read back before the
programs are traced: state that `adapt()` computed is the checkpoint's (`adapt` in `model_fn` ran again; if it
gave another vocabulary, the log says so and the saved one is used, so no token maps to another row than the
model was trained with); state given to the layer's constructor is configuration, and a checkpoint whose state
differs is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from programs.core.optimizers import OptimizerState
from programs.core.saved_names import NamedChildren

_INDEX_LOOKUP = keras.src.layers.preprocessing.index_lookup.IndexLookup


def model_optimizers(model: keras.Model) -> dict[str, keras.optimizers.Optimizer]:
  """The optimizers the model holds as attributes (`optimizer`, and a custom model's own), by attribute name."""
  children = model._trackable_children("checkpoint")  # noqa: SLF001
  return {name: child for name, child in children.items() if isinstance(child, keras.optimizers.Optimizer)}


def build_step_optimizers(model: keras.Model, step: Callable[[Any], Any], batch_spec: Any) -> None:
  """Builds the optimizers the model's own `step` applies and that are not built yet, before any trace.

  Keras builds an optimizer at its first `apply`, in the first trace of the step; under a `MirroredStrategy` no
  variable can be made there, and a checkpoint read before the trace could not restore it. So the step is traced
  once in a scratch graph (never run), each unbuilt optimizer's `apply` recording the variables it is given instead
  of applying; then each is built with those, eagerly, under the strategy's scope, as `fit` builds `optimizer`.
  Call it under the strategy's scope.
  """
  optimizers = [o for o in model_optimizers(model).values() if not o.built]
  if not optimizers:
    return
  found: dict[int, list[Any]] = {id(o): [] for o in optimizers}

  def recorder(optimizer):
    def apply(grads, trainable_variables=None):
      del grads
      for variable in trainable_variables or ():
        if all(variable is not known for known in found[id(optimizer)]):
          found[id(optimizer)].append(variable)

    return apply

  for optimizer in optimizers:
    object.__setattr__(optimizer, "apply", recorder(optimizer))
  strategy = tf.distribute.get_strategy()
  try:
    scratch = tf.function(lambda batch: strategy.run(step, args=(batch,)), autograph=False)
    scratch.get_concrete_function(batch_spec)
  finally:
    for optimizer in optimizers:
      object.__delattr__(optimizer, "apply")
  for optimizer in optimizers:
    if found[id(optimizer)]:
      optimizer.build(found[id(optimizer)])


class ModelOptimizers(tf.__internal__.tracking.Trackable):
  """The state of every optimizer a model holds besides `excluded` (the task's), each by name.

  Its children are read when a checkpoint is written or read, so optimizers built by the first trace of a
  model's own `train_step` are included.
  """

  def __init__(self, model: keras.Model, excluded: list[Any]):
    self.model, self.excluded = model, excluded
    self._states: dict[
      int, OptimizerState
    ] = {}  # One per optimizer: a checkpoint walks children several times.

  def optimizers(self) -> dict[str, keras.optimizers.Optimizer]:
    """The model's built optimizers besides the excluded ones, by attribute name."""
    excluded = {id(o) for o in self.excluded if o is not None}
    excluded |= {id(getattr(o, "inner_optimizer", None)) for o in self.excluded if o is not None}
    return {
      name: optimizer
      for name, optimizer in model_optimizers(self.model).items()
      if id(optimizer) not in excluded and optimizer.built
    }

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    return {
      name: self._states.setdefault(id(optimizer), OptimizerState(optimizer))
      for name, optimizer in self.optimizers().items()
    }


_PREPROCESSING = (_INDEX_LOOKUP, keras.layers.Discretization, keras.layers.Normalization)


def preprocessing_layers(model: keras.Model) -> list[keras.layers.Layer]:
  """The model's layers whose `adapt` state traced functions capture as constants (see the module docstring)."""
  layers = model._flatten_layers(include_self=False)  # noqa: SLF001
  return [layer for layer in layers if isinstance(layer, _PREPROCESSING)]


def _adapted(layer) -> bool:
  """Whether the layer's state came from `adapt` (state) rather than its constructor (configuration)."""
  if isinstance(layer, keras.layers.Discretization):
    return layer.num_bins is not None
  if isinstance(layer, keras.layers.Normalization):
    return layer.input_mean is None
  return not layer._has_input_vocabulary  # noqa: SLF001


def layer_state(layer) -> dict[str, np.ndarray]:
  """The layer's state that its calls read as constants.

  `vocabulary` (special tokens included) and `idf_weights`, `bin_boundaries`, or `mean` and `variance`.
  """
  if isinstance(layer, keras.layers.Discretization):
    return {"bin_boundaries": np.asarray(layer.bin_boundaries or [], np.float64)}
  if isinstance(layer, keras.layers.Normalization):
    if getattr(layer, "mean", None) is None:  # Not built: nothing to save.
      return {}
    return {key: np.asarray(getattr(layer, key), np.float32).ravel() for key in ("mean", "variance")}
  vocabulary = layer.get_vocabulary(include_special_tokens=True)
  state = {"vocabulary": np.asarray(vocabulary, object if layer.vocabulary_dtype == "string" else np.int64)}
  if layer.output_mode == "tf_idf" and getattr(layer, "idf_weights_const", None) is not None:
    state["idf_weights"] = np.asarray(layer.idf_weights_const)[: len(vocabulary)]
  return state


def _set_layer_state(layer, state: dict[str, np.ndarray]) -> None:
  if isinstance(layer, keras.layers.Discretization):
    layer.bin_boundaries = [float(b) for b in state["bin_boundaries"]]
    return
  if isinstance(layer, keras.layers.Normalization):
    layer.adapt_mean.assign(np.reshape(state["mean"], layer.adapt_mean.shape))
    layer.adapt_variance.assign(np.reshape(state["variance"], layer.adapt_variance.shape))
    layer.finalize_state()  # The constants its calls read.
    return
  vocabulary = [v.decode() if isinstance(v, bytes) else v for v in state["vocabulary"].tolist()]
  layer.set_vocabulary(vocabulary, idf_weights=state.get("idf_weights"))


def _difference(saved: dict[str, np.ndarray], now: dict[str, np.ndarray]) -> str | None:
  """What differs, in words, or None."""
  for key, value in saved.items():
    other = now.get(key)
    if value.dtype == object:
      value = np.asarray([v.decode() if isinstance(v, bytes) else v for v in value.tolist()], object)
    if other is None or value.shape != other.shape:
      return f"{key}: {len(value)} entries in the checkpoint, {0 if other is None else len(other)} now"
    unequal = np.flatnonzero(value != other)
    if len(unequal):
      i = int(unequal[0])
      return f"{key}[{i}] is {_plain(value[i])!r} in the checkpoint, {_plain(other[i])!r} now"
  return None


def _plain(value):
  """A NumPy scalar as the Python value it holds (for messages)."""
  return value.item() if isinstance(value, np.generic) else value


class _LayerState(tf.__internal__.tracking.Trackable):
  """One preprocessing layer's state in a checkpoint; a restore applies it (see the module docstring)."""

  def __init__(self, layer):
    self.layer = layer
    self.refusal: str | None = None  # Set by a restore that found other configured state.

  def _serialize_to_tensors(self):
    return {key: tf.constant(value) for key, value in layer_state(self.layer).items()}

  def _restore_from_tensors(self, restored_tensors):
    saved = {key: t.numpy() for key, t in restored_tensors.items()}
    difference = _difference(saved, layer_state(self.layer))
    if difference is None:
      return tf.no_op()
    what = f"layer '{self.layer.name}' ({type(self.layer).__name__})"
    if not _adapted(self.layer):
      self.refusal = (
        f"{what} was given another state than the checkpoint's ({difference}): the model was trained with the "
        "checkpoint's; give the layer that state, or train in a new model_dir"
      )
      return tf.no_op()
    logging.warning(
      "KerasTask: adapt() gave %s another state than the checkpoint's (%s); the checkpoint's is used, as the model "
      "was trained with it",
      what,
      difference,
    )
    _set_layer_state(self.layer, saved)
    return tf.no_op()

  def _copy_trackable_to_cpu(self, object_map):
    object_map[self] = _Snapshot(self._serialize_to_tensors())


class _Snapshot(tf.__internal__.tracking.Trackable):
  """A layer's state as of an asynchronous save."""

  def __init__(self, tensors):
    self.tensors = tensors

  def _serialize_to_tensors(self):
    return self.tensors


class PreprocessingState(NamedChildren):
  """The constants of every preprocessing layer of a model (lookups, `Discretization`, `Normalization`), by name."""

  def __init__(self, model: keras.Model):
    self.layers = {layer.name: _LayerState(layer) for layer in preprocessing_layers(model)}

  def named_children(self) -> dict[str, Any]:
    return dict(self.layers)

  def refusals(self) -> list[str]:
    """What the last restore refused (configured state that differs from the checkpoint's); clears it."""
    found = [s.refusal for s in self.layers.values() if s.refusal]
    for state in self.layers.values():
      state.refusal = None
    return found
