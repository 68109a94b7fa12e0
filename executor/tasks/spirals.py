"""A classifier example: an MLP learns to tell the arms of interleaved spirals apart.

The data is generated deterministically (no download), hard enough that a
linear model fails and an MLP needs a few thousand steps: accuracy climbs from
chance (1/num_classes) to above 0.95.
"""

from __future__ import annotations

from collections.abc import Mapping

import gin
import keras
import numpy as np
import tensorflow as tf

from executor import ConfigError, Task, array_dataset, record_dataset
from executor.tasks.shared import SharedTrunk
from programs.core.records import array_parser, record_counts, write_array_records


def make_spirals(
  num_examples: int, num_classes: int, noise: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
  """Points on `num_classes` interleaved spiral arms, with Gaussian noise.

  Returns:
    (features float32 [n, 2], labels int32 [n]).
  """
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, size=num_examples)
  radius = rng.uniform(0.05, 1.0, size=num_examples)
  angle = 3.0 * np.pi * radius + 2.0 * np.pi * labels / num_classes
  points = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
  points += rng.normal(scale=noise, size=points.shape)
  return points.astype(np.float32), labels.astype(np.int32)


@gin.configurable
class SpiralsClassifier(Task):
  """Classifies 2-D points by spiral arm with an MLP.

  Splits: `train` (fresh points forever, shuffled), `test` (a fixed set).
  Metrics: `loss` and `accuracy`. Decoding writes each point, its label, the
  prediction and its probability.
  """

  splits = ("train", "test")
  serving_inputs = ("x",)  # What an export's serving_default takes: the model's inputs, no label.

  def __init__(
    self,
    num_classes: int = 3,
    hidden_sizes: tuple[int, ...] = (64, 64),
    dropout: float = 0.0,
    noise: float = 0.03,
    num_train_examples: int = 20000,
    num_test_examples: int = 2000,
    seed: int = 1,
    trunk: SharedTrunk | None = None,
    train_files: str = "",
    **kwargs,
  ):
    """Configures the task; see `Task` for the shared arguments.

    Args:
      num_classes: Spiral arms, hence classes.
      hidden_sizes: Widths of the MLP's hidden layers.
      dropout: Dropout rate after each hidden layer (0: none).
      noise: Standard deviation of the noise added to the points.
      num_train_examples: Size of the train split (repeated and reshuffled).
      num_test_examples: Size of the test split.
      seed: Seed of the data generation and shuffling.
      trunk: Hidden layers shared with other tasks (multi-task runs); the
        task then adds only its own output layer, `<task name>_logits`.
      train_files: A glob of indexed TFRecord files holding the train split (written by
        `python -m executor.tasks.spirals DIR`): read with `record_dataset` instead of from memory.
      **kwargs: `Task` arguments (name, global_batch_size, optimizer_fn, ...).
    """
    super().__init__(**kwargs)
    self.num_classes = num_classes
    self.hidden_sizes = tuple(hidden_sizes)
    self.dropout = dropout
    self.noise = noise
    self.num_train_examples, self.num_test_examples, self.seed = num_train_examples, num_test_examples, seed
    self.trunk = trunk
    self.train_files = train_files
    if train_files:
      record_counts(
        self._train_files()
      )  # Bad files are a one-line error now, before the run touches anything.

  def build(self) -> None:
    if self.trunk is not None:
      inputs = keras.Input((2,))
      logits = keras.layers.Dense(self.num_classes, name=f"{self.name}_logits")(self.trunk.layer()(inputs))
      self.model = keras.Model(inputs, logits, name=self.name)
    else:
      layers = [keras.Input((2,))]
      for i, n in enumerate(self.hidden_sizes):
        layers.append(keras.layers.Dense(n, activation="relu", name=f"hidden_{i}"))
        if self.dropout:
          layers.append(keras.layers.Dropout(self.dropout, name=f"dropout_{i}"))
      layers.append(keras.layers.Dense(self.num_classes, name="logits"))
      self.model = keras.Sequential(layers, name="mlp")

  def arrays(self, split: str) -> dict[str, np.ndarray]:
    """The points and labels of `split`: drawn from the seed (the test split from another one)."""
    train = split == "train"
    n = self.num_train_examples if train else self.num_test_examples
    features, labels = make_spirals(n, self.num_classes, self.noise, self.seed + (0 if train else 1000))
    return {"x": features, "y": labels}

  def _train_files(self) -> list[str]:
    files = sorted(tf.io.gfile.glob(self.train_files))
    if not files:
      raise ConfigError(f"SpiralsClassifier.train_files: no file matches {self.train_files!r}")
    return files

  def dataset(self, split: str, input_context: tf.distribute.InputContext, start_example: int = 0):
    if split == "train" and self.train_files:
      parse = array_parser(self.arrays("train"))
      return record_dataset(
        self._train_files(), parse, input_context, self.global_batch_size, True, self.seed, start_example
      )
    return array_dataset(
      self.arrays(split), input_context, self.global_batch_size, split == "train", self.seed, start_example
    )

  def _logits(self, batch, training):
    return self.model(batch["x"], training=training)

  def compute_loss(self, batch, training):
    logits = self._logits(batch, training)
    labels = batch["y"]
    per_example_loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    count = tf.cast(tf.shape(labels)[0], tf.float32)
    loss = tf.reduce_mean(per_example_loss)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), labels), tf.float32)
    metrics = {"loss": (loss, count), "accuracy": (tf.reduce_mean(correct), count)}
    return loss, metrics, {"loss": per_example_loss}

  def decode_step(self, batch):
    probs = tf.nn.softmax(self._logits(batch, False))
    return {
      "x": batch["x"],
      "label": batch["y"],
      "prediction": tf.argmax(probs, -1, output_type=tf.int32),
      "probability": tf.reduce_max(probs, -1),
    }

  def postprocess_decode(self, per_example: Mapping[str, np.ndarray]):
    records = [
      {
        "x": [round(float(v), 4) for v in x],
        "label": int(y),
        "prediction": int(p),
        "probability": round(float(q), 4),
      }
      for x, y, p, q in zip(
        per_example["x"], per_example["label"], per_example["prediction"], per_example["probability"]
      )
    ]
    accuracy = float(np.mean(per_example["label"] == per_example["prediction"])) if records else float("nan")
    return records, {"accuracy": accuracy}


def main(argv: list[str]) -> None:
  """`python -m executor.tasks.spirals DIR [SHARDS]`: writes the default train split as indexed TFRecord shards."""
  directory, shards = argv[1], int(argv[2]) if len(argv) > 2 else 4
  for path in write_array_records(SpiralsClassifier().arrays("train"), directory, shards):
    print(path)


if __name__ == "__main__":
  import sys

  main(sys.argv)
