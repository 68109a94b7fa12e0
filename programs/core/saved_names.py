"""Checkpoint items named after Keras' made-up names, matched to a checkpoint written in another process.

Keras names a layer it was given no name for with a process-wide counter (`dense`, `dense_1`, ...), and its
variables and optimizer slots after it (`dense_1/kernel`, `dense_1_kernel_momentum`). A model built a second time
in one process (a notebook that looked at the model first, a test session) gets `dense_8` where the run that wrote
the checkpoint had `dense_1`. The model itself is saved by structure (its layers by position), which such names do
not change; the items saved by name are not: the index of variables (`variables/`), optimizer state
(`OptimizerState`) and preprocessing state (`PreprocessingState`). Those are `NamedChildren`, and take the
checkpoint's names when they are read from it (`adopt_saved_names`), so a restore reads each value into the object
that wrote it, and the next save writes the same names again.

Names are matched (`pair_names`) when they differ only in Keras' counters (`_<n>` after a word): within each
group of names that are alike without them, in the order the counters give, which is the order the model's code
made the objects in, and only where both sides have as many names. Names left unmatched (another model) stay
as they are, so a checkpoint of another model is still told apart by its names.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow.core.protobuf import trackable_object_graph_pb2

_PARTS = re.compile(r"([/_])")


def _without_counters(name: str) -> tuple[str, tuple[int, ...]]:
  """`name` without Keras' counters, and the counter after each of its words (-1 where none).

  `block_1/dense_2/kernel` -> (`block/dense/kernel`, `(1, 2, -1)`).
  """
  parts = _PARTS.split(name)
  words, counters = [parts[0]], [-1]
  for separator, word in zip(parts[1::2], parts[2::2]):
    if separator == "_" and word.isdigit() and words[-1]:
      counters[-1] = int(word)
    else:
      words.append(separator + word)
      counters.append(-1)
  return "".join(words), tuple(counters)


def pair_names(ours: Iterable[str], theirs: Iterable[str]) -> dict[str, str]:
  """`{our name: their name}` for the names that are the same but for Keras' counters (see the module docstring).

  Equal name sets pair each name with itself. A name whose group differs in size on the two sides is paired only
  with the same name.
  """
  ours, theirs = list(ours), list(theirs)
  if set(ours) == set(theirs):
    return {name: name for name in ours}
  groups: dict[str, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
  for side, names in enumerate((ours, theirs)):
    for name in names:
      groups[_without_counters(name)[0]][side].append(name)
  pairs = {}
  for mine, saved in groups.values():
    if len(mine) == len(saved):
      order = lambda name: _without_counters(name)[1]  # noqa: E731
      pairs.update(zip(sorted(mine, key=order), sorted(saved, key=order)))
    else:
      pairs.update({name: name for name in mine if name in saved})
  return pairs


class NamedChildren(tf.__internal__.tracking.Trackable):
  """A trackable whose children are named after Keras objects; it can take a checkpoint's names for them."""

  # {our name: the checkpoint's}, set by `adopt_saved_names`.
  saved_names: Mapping[str, str] = MappingProxyType({})

  def named_children(self) -> dict[str, Any]:
    """The children under this process' names."""
    raise NotImplementedError

  def _trackable_children(self, save_type="checkpoint", **kwargs):
    return {self.saved_names.get(name, name): child for name, child in self.named_children().items()}


def adopt_saved_names(items: Mapping[str, Any], checkpoint_path: str) -> None:
  """Gives each `NamedChildren` of `items` (or of an item's children) the names the checkpoint has for them.

  Args:
    items: The items a `tf.train.Checkpoint` is about to read `checkpoint_path` into, by item name.
    checkpoint_path: The checkpoint. One that cannot be read changes nothing (its restore says why).
  """
  graph = _object_graph(checkpoint_path)
  if graph is None:
    return
  found = [(name, trackable, 0) for name, trackable in items.items()]
  for depth in range(2):  # The items, then their children (`model_optimizers/<attribute>`).
    below = []
    for name, trackable, parent in found:
      node = next((c.node_id for c in graph.nodes[parent].children if c.local_name == name), None)
      if node is None:
        continue
      if isinstance(trackable, NamedChildren):
        saved = [c.local_name for c in graph.nodes[node].children]
        pairs = pair_names(trackable.named_children(), saved)
        trackable.saved_names = {ours: theirs for ours, theirs in pairs.items() if ours != theirs}
      elif depth == 0 and isinstance(trackable, tf.__internal__.tracking.Trackable):
        children = trackable._trackable_children(save_type="checkpoint")  # noqa: SLF001
        below += [(n, child, node) for n, child in children.items()]
    found = below


def _object_graph(checkpoint_path: str) -> trackable_object_graph_pb2.TrackableObjectGraph | None:
  try:
    reader = tf.train.load_checkpoint(checkpoint_path)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
  except (tf.errors.OpError, ValueError, IndexError, DecodeError):
    return None
  return graph
