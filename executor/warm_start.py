"""Warm start: initialise variables from another checkpoint through name-mapping rules."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import gin
import tensorflow as tf
from absl import logging

from executor import checkpoint_files
from programs.core.analysis import unique_variables, variable_name
from programs.core.errors import ConfigError

_VALUE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


@dataclasses.dataclass
class WarmStartReport:
  """What a warm start did.

  Attributes:
    loaded: {our variable name: source name} of every variable loaded.
    not_loaded: Our variables that kept their initialisers, with the reason.
  """

  loaded: dict[str, str]
  not_loaded: dict[str, str]

  def text(self) -> str:
    """A readable report, one variable a line."""
    lines = [f"loaded {len(self.loaded)} variable(s):"]
    lines += [f"  {k} <- {v}" for k, v in sorted(self.loaded.items())]
    lines.append(f"not loaded {len(self.not_loaded)} variable(s):")
    lines += [f"  {k}: {v}" for k, v in sorted(self.not_loaded.items())]
    return "\n".join(lines) + "\n"


def source_names(checkpoint_path: str) -> dict[str, str]:
  """{readable name: checkpoint key} of the variables in a checkpoint.

  Checkpoints of this executor index model variables as `variables/<name>`;
  any other TF2 checkpoint is named by its object path.
  """
  indexed = {k: v for k, v in item_keys(checkpoint_path, "variables").items() if v is not None}
  if indexed:
    return indexed
  keys = [k for k, _ in tf.train.list_variables(checkpoint_path) if k.endswith(_VALUE_SUFFIX)]
  return {k[: -len(_VALUE_SUFFIX)]: k for k in keys}


def item_keys(checkpoint_path: str, item: str) -> dict[str, str | None]:
  """{child name: checkpoint key of its value, or None for a child that is no variable} of a top-level `item`.

  Read from the checkpoint's object graph, not from the key names: a variable two items share (a model's
  embedding, also in the `variables/` index) is written once, under the path TensorFlow met first, and the
  other item's child still names it.

  Raises:
    ValueError: the checkpoint's data cannot be read.
  """
  graph = checkpoint_files.object_graph(checkpoint_path)
  if graph is None:
    return {}
  node = next((c.node_id for c in graph.nodes[0].children if c.local_name == item), None)
  if node is None:
    return {}
  keys = {}
  for child in graph.nodes[node].children:
    values = [a.checkpoint_key for a in graph.nodes[child.node_id].attributes if a.name == "VARIABLE_VALUE"]
    keys[child.local_name] = values[0] if values else None
  return keys


@gin.configurable
class WarmStart:
  """Initialises a fresh run from another checkpoint (Lingvo's init_from_checkpoint_rules).

  Applied only when `model_dir` has no checkpoint of its own. Each rule is
  `(regex, format)`: a variable whose name fully matches `regex` loads the
  source variable named `format % groups` (e.g. `('(.*)', '%s')` loads
  same-named variables; `('encoder/(.*)', 'pretrained/enc/%s')` renames).
  The first matching rule wins; names matching an `ignore` pattern are not
  loaded.
  """

  def __init__(
    self,
    checkpoint_path: str = gin.REQUIRED,
    rules: Sequence[tuple[str, str]] = (("(.*)", "%s"),),
    ignore: Sequence[str] = (),
  ):
    """Configures the warm start.

    Args:
      checkpoint_path: Checkpoint prefix (or a folder: its latest checkpoint).
      rules: `(regex, format)` pairs mapping our names to source names.
      ignore: Regexes of our variable names never to load.
    """
    self.checkpoint_path = checkpoint_path
    self.rules = [(re.compile(pattern), fmt) for pattern, fmt in rules]
    self.ignore = [re.compile(pattern) for pattern in ignore]

  def resolve(self) -> str:
    """The checkpoint prefix to read.

    Raises:
      ConfigError: the path holds no readable checkpoint.
    """
    path = self.checkpoint_path
    if tf.io.gfile.isdir(path):
      path = tf.train.latest_checkpoint(path)
    if not path or not tf.io.gfile.exists(path + ".index"):
      raise ConfigError(f"WarmStart.checkpoint_path '{self.checkpoint_path}' holds no checkpoint")
    return path

  def apply(self, variables: Sequence[tf.Variable]) -> WarmStartReport:
    """Assigns the mapped source values to `variables`; returns the report."""
    path = self.resolve()
    reader = tf.train.load_checkpoint(path)
    sources = source_names(path)
    loaded, not_loaded = {}, {}
    for v in unique_variables(variables):
      name = variable_name(v)
      if any(p.fullmatch(name) for p in self.ignore):
        not_loaded[name] = "ignored"
        continue
      rule = next(((p, f) for p, f in self.rules if p.fullmatch(name)), None)
      if rule is None:
        not_loaded[name] = "no rule matches"
        continue
      pattern, fmt = rule
      source = fmt % pattern.fullmatch(name).groups()
      if source not in sources:
        not_loaded[name] = f"'{source}' is not in the checkpoint"
        continue
      value = reader.get_tensor(sources[source])
      if tuple(value.shape) != tuple(v.shape):
        not_loaded[name] = f"'{source}' has shape {list(value.shape)}, not {list(v.shape)}"
        continue
      v.assign(tf.cast(value, v.dtype))
      loaded[name] = source
    report = WarmStartReport(loaded, not_loaded)
    logging.info("Warm start from %s:\n%s", path, report.text())
    return report
