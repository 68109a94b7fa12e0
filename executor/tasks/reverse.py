"""A sequence-to-sequence example: a GRU encoder-decoder with attention reverses strings of digits.

The data is generated deterministically (no download): strings of
`min_length`..`max_length` random digits, and the same digits reversed as the
target. The model trains with teacher forcing and decodes greedily on device,
one token at a time for a fixed number of steps, so the decode program
compiles to one graph with static shapes.

Token ids: 0 is padding, 1 starts the decoder input, 2 ends the target and the
digits 0-9 are ids 3-12. Sources are right-padded to `max_length`, targets
(the reversed digits, then the end id) to `max_length + 1`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gin
import keras
import numpy as np
import tensorflow as tf

from executor import Task, array_dataset

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
FIRST_DIGIT_ID = 3
VOCAB_SIZE = FIRST_DIGIT_ID + 10


def make_reverse_data(
  num_examples: int, min_length: int, max_length: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
  """Random digit strings and their reversals, as padded token ids.

  Returns:
    (source int32 [n, max_length], target int32 [n, max_length + 1]). Each
    target holds the source's digits in reverse order, then `EOS_ID`; both are
    padded with `PAD_ID`.
  """
  rng = np.random.default_rng(seed)
  lengths = rng.integers(min_length, max_length + 1, size=num_examples)
  digits = rng.integers(0, 10, size=(num_examples, max_length)) + FIRST_DIGIT_ID
  positions = np.arange(max_length)
  source = np.where(positions < lengths[:, None], digits, PAD_ID)
  # target[i, t] = source[i, length_i - 1 - t] for t < length_i.
  index = np.clip(lengths[:, None] - 1 - positions, 0, max_length - 1)
  reversed_digits = np.where(positions < lengths[:, None], np.take_along_axis(digits, index, axis=1), PAD_ID)
  target = np.concatenate([reversed_digits, np.full((num_examples, 1), PAD_ID)], axis=1)
  target[np.arange(num_examples), lengths] = EOS_ID
  return source.astype(np.int32), target.astype(np.int32)


def ids_to_string(ids: np.ndarray) -> str:
  """The digits of a row of token ids, up to the first non-digit (end, padding)."""
  out = []
  for i in ids.tolist():
    if not FIRST_DIGIT_ID <= i < FIRST_DIGIT_ID + 10:
      break
    out.append(str(i - FIRST_DIGIT_ID))
  return "".join(out)


class Seq2Seq(keras.Model):
  """Bidirectional GRU encoder, GRU decoder with dot-product attention.

  `call` runs the decoder over a whole (teacher-forced) input sequence;
  `decode_step` advances it by one token with the same weights, for greedy
  decoding.
  """

  def __init__(self, vocab_size: int, embedding_size: int, hidden_size: int, **kwargs):
    """Creates the layers; weights come when the model is first called.

    Args:
      vocab_size: Number of token ids.
      embedding_size: Width of the token embeddings (shared by both sides).
      hidden_size: Width of the encoder outputs and the decoder state.
      **kwargs: Passed to `keras.Model` (e.g. `name`).
    """
    super().__init__(**kwargs)
    if hidden_size % 2:
      raise ValueError(f"hidden_size must be even (two encoder directions), got {hidden_size}")
    self.hidden_size = hidden_size
    self.embedding = keras.layers.Embedding(vocab_size, embedding_size, name="embedding")
    self.encoder = keras.layers.Bidirectional(
      keras.layers.GRU(hidden_size // 2, return_sequences=True), name="encoder"
    )
    self.init_state = keras.layers.Dense(hidden_size, activation="tanh", name="init_state")
    self.decoder = keras.layers.GRU(hidden_size, return_sequences=True, name="decoder")
    self.attention_keys = keras.layers.Dense(hidden_size, use_bias=False, name="attention_keys")
    self.attention_out = keras.layers.Dense(hidden_size, activation="tanh", name="attention_out")
    self.logits = keras.layers.Dense(vocab_size, name="logits")

  def encode(
    self, source: tf.Tensor, training: bool = False
  ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """Encodes source ids [batch, src_len].

    Returns:
      (encoder outputs [b, s, h], attention keys [b, s, h], source mask
      [b, s] bool, initial decoder state [b, h]).
    """
    mask = tf.not_equal(source, PAD_ID)
    outputs = self.encoder(self.embedding(source), mask=mask, training=training)
    weights = tf.cast(mask, outputs.dtype)[:, :, None]
    mean = tf.reduce_sum(outputs * weights, 1) / tf.maximum(tf.reduce_sum(weights, 1), 1.0)
    return outputs, self.attention_keys(outputs), mask, self.init_state(mean)

  def _attend(self, queries, outputs, keys, mask):
    """Dot-product attention of decoder states [b, t, h] over the source; returns logits [b, t, v]."""
    scores = tf.einsum("bth,bsh->bts", queries, keys) / float(np.sqrt(self.hidden_size))
    scores = tf.where(mask[:, None, :], scores, tf.constant(-1e9, scores.dtype))
    context = tf.einsum("bts,bsh->bth", tf.nn.softmax(scores, axis=-1), outputs)
    return self.logits(self.attention_out(tf.concat([queries, context], axis=-1)))

  def call(self, inputs, training=False):
    """Teacher-forced logits [b, t, vocab] of `(source, decoder_input)` ids."""
    source, decoder_input = inputs
    outputs, keys, mask, state = self.encode(source, training=training)
    queries = self.decoder(self.embedding(decoder_input), initial_state=state, training=training)
    return self._attend(queries, outputs, keys, mask)

  def decode_step(self, token, state, outputs, keys, mask):
    """One decoder step from previous token ids [b] and state [b, h]; returns (logits [b, v], state)."""
    query, _ = self.decoder.cell(self.embedding(token), state, training=False)
    return self._attend(query[:, None, :], outputs, keys, mask)[:, 0], query


@gin.configurable
class DigitReversal(Task):
  """Reverses strings of digits with a GRU encoder-decoder and attention.

  Splits: `train` (a fixed set, reshuffled and repeated forever), `test` (a
  fixed, finite set). Metrics: `loss` (per target token), `token_accuracy`
  (weighted by target tokens, end id included) and `sequence_accuracy`
  (weighted by examples). Decoding is greedy, on device; post-processing
  writes `source`, `target`, `decoded` and `correct` per example and reports
  `exact_match`.
  """

  splits = ("train", "test")
  serving_inputs = ("source",)  # What an export's serving_default takes: the model's inputs, no label.

  def __init__(
    self,
    min_length: int = 3,
    max_length: int = 8,
    embedding_size: int = 32,
    hidden_size: int = 128,
    num_train_examples: int = 50000,
    num_test_examples: int = 1000,
    seed: int = 1,
    **kwargs,
  ):
    """Configures the task; see `Task` for the shared arguments.

    Args:
      min_length: Shortest source string.
      max_length: Longest source string; targets have one more token (end).
      embedding_size: Width of the token embeddings.
      hidden_size: Width of the encoder outputs and the decoder state (even).
      num_train_examples: Size of the train split (repeated and reshuffled).
      num_test_examples: Size of the test split.
      seed: Seed of the data generation and shuffling.
      **kwargs: The `Task` arguments (`name`, `global_batch_size`,
        `optimizer_fn`, `ema_decay`).
    """
    super().__init__(**kwargs)
    if not 1 <= min_length <= max_length:
      raise ValueError(f"DigitReversal needs 1 <= min_length <= max_length, got {min_length}, {max_length}")
    if hidden_size < 2 or hidden_size % 2:
      raise ValueError(f"DigitReversal.hidden_size must be even and >= 2, got {hidden_size}")
    self.min_length, self.max_length = min_length, max_length
    self.embedding_size, self.hidden_size = embedding_size, hidden_size
    self.num_train_examples, self.num_test_examples, self.seed = num_train_examples, num_test_examples, seed

  @property
  def target_length(self) -> int:
    """Padded target length, and the number of greedy decoding steps."""
    return self.max_length + 1

  def build(self) -> None:
    self.model = Seq2Seq(VOCAB_SIZE, self.embedding_size, self.hidden_size, name="seq2seq")
    # Creates every weight now: programs trace the steps and must not make variables.
    self.model((tf.zeros((1, self.max_length), tf.int32), tf.zeros((1, self.target_length), tf.int32)))

  def arrays(self, split: str) -> dict[str, np.ndarray]:
    """The examples of `split`: generated from the seed (the test split from another one)."""
    train = split == "train"
    n = self.num_train_examples if train else self.num_test_examples
    source, target = make_reverse_data(
      n, self.min_length, self.max_length, self.seed + (0 if train else 1000)
    )
    return {"source": source, "target": target}

  def dataset(self, split: str, input_context: tf.distribute.InputContext, start_example: int = 0):
    return array_dataset(
      self.arrays(split), input_context, self.global_batch_size, split == "train", self.seed, start_example
    )

  def compute_loss(self, batch, training):
    source, target = batch["source"], batch["target"]
    decoder_input = tf.concat([tf.fill([tf.shape(target)[0], 1], BOS_ID), target[:, :-1]], axis=1)
    logits = self.model((source, decoder_input), training=training)
    weights = tf.cast(tf.not_equal(target, PAD_ID), tf.float32)
    token_loss = keras.losses.sparse_categorical_crossentropy(target, logits, from_logits=True)
    num_tokens = tf.reduce_sum(weights)
    loss = tf.math.divide_no_nan(tf.reduce_sum(token_loss * weights), num_tokens)
    token_correct = (
      tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), target), tf.float32) * weights
    )
    sequence_correct = tf.cast(
      tf.equal(tf.reduce_sum(token_correct, 1), tf.reduce_sum(weights, 1)), tf.float32
    )
    num_examples = tf.cast(tf.shape(target)[0], tf.float32)
    metrics = {
      "loss": (loss, num_tokens),
      "token_accuracy": (tf.math.divide_no_nan(tf.reduce_sum(token_correct), num_tokens), num_tokens),
      "sequence_accuracy": (
        tf.math.divide_no_nan(tf.reduce_sum(sequence_correct), num_examples),
        num_examples,
      ),
    }
    return loss, metrics, {}

  def decode_step(self, batch):
    """Greedy decoding for `target_length` steps; only digits and the end id can be emitted."""
    source = batch["source"]
    batch_size = tf.shape(source)[0]
    outputs, keys, mask, state = self.model.encode(source)
    # Padding and the start id are never valid outputs.
    allowed = tf.constant([i not in (PAD_ID, BOS_ID) for i in range(VOCAB_SIZE)])
    token = tf.fill([batch_size], BOS_ID)
    finished = tf.zeros([batch_size], tf.bool)
    decoded = []
    # A fixed number of steps, unrolled in the trace: static shapes, no host round trip.
    for _ in range(self.target_length):
      logits, state = self.model.decode_step(token, state, outputs, keys, mask)
      logits = tf.where(allowed, logits, tf.constant(-1e9, logits.dtype))
      token = tf.argmax(logits, -1, output_type=tf.int32)
      token = tf.where(finished, PAD_ID, token)
      decoded.append(token)
      finished = finished | tf.equal(token, EOS_ID)
    return {"source": source, "target": batch["target"], "decoded": tf.stack(decoded, axis=1)}

  def postprocess_decode(
    self, per_example: Mapping[str, np.ndarray]
  ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Turns ids into digit strings; a decode is correct when it equals the target string.

    A decode's string is its digits up to the first other id; it is correct
    only if that id is the end id (a decode that never ends, or stops at
    padding, is wrong).
    """
    records = []
    for source, target, decoded in zip(per_example["source"], per_example["target"], per_example["decoded"]):
      target_str, decoded_str = ids_to_string(target), ids_to_string(decoded)
      ended = len(decoded_str) < len(decoded) and decoded[len(decoded_str)] == EOS_ID
      records.append(
        {
          "source": ids_to_string(source),
          "target": target_str,
          "decoded": decoded_str,
          "correct": bool(ended and decoded_str == target_str),
        }
      )
    exact_match = float(np.mean([r["correct"] for r in records])) if records else float("nan")
    return records, {"exact_match": exact_match}
