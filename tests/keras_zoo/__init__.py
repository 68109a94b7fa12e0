"""The Keras zoo: eight models written as keras.io users write them, each with the gin file that runs it.

`ZOO[name]` says how the tests run a model: its gin file, its `fit` arguments beyond the data, the precision its
runtime uses, and the inputs its export serves.
"""

import dataclasses
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class ZooModel:
  """One model of the zoo.

  Attributes:
    name: The module and gin file name.
    model_fn: The name of its model function (bound to `KerasTask.model_fn`).
    dataset_fn: The name of its dataset function.
    precision: The `Runtime.precision` its gin file sets.
    params: Extra gin bindings of this variant.
    eval_split: The split its eval program reads.
  """

  name: str
  model_fn: str
  dataset_fn: str
  precision: str = "float32"
  params: tuple[str, ...] = ()
  eval_split: str = "test"

  @property
  def gin_file(self) -> Path:
    return HERE / f"{self.name.split('@')[0]}.gin"

  @property
  def module(self) -> str:
    return f"keras_zoo.{self.name.split('@')[0]}"


MODELS = [
  ZooModel("structured", "heart_model", "heart_data"),
  ZooModel("multi_io", "ticket_model", "ticket_data"),
  ZooModel("gan", "blob_gan", "blob_images"),
  ZooModel("text", "review_model", "review_data"),
  ZooModel("conv_aug", "shape_classifier", "shape_images"),
  ZooModel("timeseries", "weather_lstm", "weather_windows"),
  ZooModel("imbalanced", "fraud_model", "fraud_data"),
  ZooModel("mixed", "digit_mlp", "digit_data", precision="mixed_float16"),
  ZooModel(
    "multi_io@bfloat16",
    "ticket_model",
    "ticket_data",
    precision="mixed_bfloat16",
    params=("Runtime.precision = 'mixed_bfloat16'",),
  ),
]
ZOO = {m.name: m for m in MODELS}
