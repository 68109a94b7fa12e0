"""Text classification (keras.io "text classification from scratch" shape, end to end).

Raw strings in: a `TextVectorization` layer adapted on the train texts is the model's first layer, then an
Embedding, a Conv1D, pooling and a sigmoid.
"""

import gin
import keras
import numpy as np
import tensorflow as tf
from keras import layers

POSITIVE = ["great", "fine", "superb", "lovely", "good", "moving"]
NEGATIVE = ["awful", "dull", "boring", "poor", "bad", "weak"]
FILLER = ["the", "film", "was", "a", "plot", "and", "actors", "story", "really", "quite", "this", "it"]


def reviews(n, seed):
  """(texts, labels): short reviews whose sentiment words decide the label, generated offline."""
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 2, n)
  texts = []
  for label in labels:
    words = list(rng.choice(FILLER, rng.integers(4, 12)))
    for _ in range(rng.integers(1, 3)):
      words.insert(rng.integers(0, len(words) + 1), rng.choice(POSITIVE if label else NEGATIVE))
    if rng.uniform() < 0.3:  # Some noise: a word of the other side.
      words.insert(rng.integers(0, len(words) + 1), rng.choice(NEGATIVE if label else POSITIVE))
    texts.append(" ".join(words).capitalize() + ".")
  return np.array(texts), labels.astype("float32")


TRAIN = reviews(384, 0)
TEST = reviews(96, 1)


@gin.configurable
def review_data(split):
  texts, labels = TRAIN if split == "train" else TEST
  return tf.data.Dataset.from_tensor_slices((texts, labels))


@gin.configurable
def review_model(max_features=64, sequence_length=16, embedding_dim=16):
  vectorize_layer = layers.TextVectorization(
    max_tokens=max_features, output_mode="int", output_sequence_length=sequence_length
  )
  vectorize_layer.adapt(TRAIN[0])
  inputs = keras.Input(shape=(), dtype="string", name="text")
  x = vectorize_layer(inputs)
  x = layers.Embedding(max_features, embedding_dim)(x)
  x = layers.Dropout(0.5)(x)
  x = layers.Conv1D(16, 3, padding="valid", activation="relu")(x)
  x = layers.GlobalMaxPooling1D()(x)
  x = layers.Dense(16, activation="relu")(x)
  predictions = layers.Dense(1, activation="sigmoid", name="predictions")(x)
  model = keras.Model(inputs, predictions)
  model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
  return model
