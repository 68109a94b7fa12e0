"""Layers shared by several tasks: how tasks share variables in a multi-task run."""

from __future__ import annotations

import gin
import keras


@gin.configurable
class SharedTrunk:
  """An MLP trunk built once and called by every task that holds this object.

  Bind one instance to several tasks with a gin singleton:
    TRUNK = @trunk/singleton()
    trunk/singleton.constructor = @SharedTrunk
    three/SpiralsClassifier.trunk = %TRUNK
  """

  def __init__(self, hidden_sizes: tuple[int, ...] = (64, 64), name: str = "shared_trunk"):
    """Configures the trunk.

    Args:
      hidden_sizes: Widths of its ReLU layers.
      name: Name of the trunk model (prefix of its variable names).
    """
    self.hidden_sizes = tuple(hidden_sizes)
    self.name = name
    self._layer: keras.Sequential | None = None

  def layer(self) -> keras.Sequential:
    """The trunk, created on first use (inside the strategy scope, by a task's build)."""
    if self._layer is None:
      layers = [
        keras.layers.Dense(n, activation="relu", name=f"hidden_{i}") for i, n in enumerate(self.hidden_sizes)
      ]
      self._layer = keras.Sequential(layers, name=self.name)
    return self._layer
