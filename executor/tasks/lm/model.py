"""The LM's model: a decoder-only Transformer with a key/value-cached step for decoding.

Pre-norm blocks of causal multi-head attention (within segments) and an MLP, a tied output embedding.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf


def _attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
  """Softmax attention (in float32) of q [b, t, h, d] over k, v [b, s, h, d]; mask broadcasts to [b, h, t, s]."""
  scale = 1.0 / math.sqrt(q.shape[-1])
  scores = tf.cast(tf.einsum("bthd,bshd->bhts", q, k), tf.float32) * scale
  scores = tf.where(mask, scores, tf.constant(-1e9, tf.float32))
  weights = tf.cast(tf.nn.softmax(scores, axis=-1), v.dtype)
  return tf.einsum("bhts,bshd->bthd", weights, v)


class DecoderBlock(keras.layers.Layer):
  """A pre-norm Transformer block: causal multi-head self-attention, then an MLP, each residual."""

  def __init__(self, model_dim: int, num_heads: int, mlp_dim: int, dropout_rate: float = 0.0, **kwargs):
    """Creates the sublayers.

    Args:
      model_dim: Width of the residual stream (divisible by `num_heads`).
      num_heads: Attention heads.
      mlp_dim: Hidden width of the MLP.
      dropout_rate: Dropout on the attention and MLP outputs in training.
      **kwargs: Passed to `keras.layers.Layer`.
    """
    super().__init__(**kwargs)
    self.model_dim, self.num_heads, self.head_dim = model_dim, num_heads, model_dim // num_heads
    init = keras.initializers.RandomNormal(stddev=0.02)
    self.attention_norm = keras.layers.LayerNormalization(epsilon=1e-6, name="attention_norm")
    self.qkv = keras.layers.Dense(3 * model_dim, kernel_initializer=init, name="qkv")
    self.attention_out = keras.layers.Dense(model_dim, kernel_initializer=init, name="attention_out")
    self.mlp_norm = keras.layers.LayerNormalization(epsilon=1e-6, name="mlp_norm")
    self.mlp_in = keras.layers.Dense(mlp_dim, activation="gelu", kernel_initializer=init, name="mlp_in")
    self.mlp_out = keras.layers.Dense(model_dim, kernel_initializer=init, name="mlp_out")
    self.dropout = keras.layers.Dropout(dropout_rate)

  def build(self, input_shape):
    shape = (None, None, self.model_dim)
    self.attention_norm.build(shape)
    self.qkv.build(shape)
    self.attention_out.build(shape)
    self.mlp_norm.build(shape)
    self.mlp_in.build(shape)
    self.mlp_out.build((None, None, self.mlp_in.units))
    self.built = True

  def _qkv(self, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    qkv = self.qkv(self.attention_norm(x))
    shape = tf.concat([tf.shape(x)[:2], [3, self.num_heads, self.head_dim]], 0)
    qkv = tf.reshape(qkv, shape)
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]

  def _finish(self, x: tf.Tensor, attended: tf.Tensor, training: bool) -> tf.Tensor:
    shape = tf.concat([tf.shape(attended)[:2], [self.model_dim]], 0)
    x = x + self.dropout(self.attention_out(tf.reshape(attended, shape)), training=training)
    return x + self.dropout(self.mlp_out(self.mlp_in(self.mlp_norm(x))), training=training)

  def call(self, x, attention_mask, training=False):
    """The block over whole sequences; returns (output, keys, values), keys/values [b, t, heads, head_dim]."""
    q, k, v = self._qkv(x)
    return self._finish(x, _attention(q, k, v, attention_mask), training), k, v

  def step(self, x: tf.Tensor, t: tf.Tensor, keys: tf.Tensor, values: tf.Tensor):
    """One position `t` of x [b, 1, dim] against the cache [b, length, heads, head_dim].

    Writes this position's key and value into the cache at `t` and attends
    over positions `<= t`. Returns (output [b, 1, dim], keys, values).
    """
    q, k, v = self._qkv(x)
    length = keys.shape[1]
    at_t = tf.equal(tf.range(length), t)[None, :, None, None]
    keys = tf.where(at_t, k, keys)
    values = tf.where(at_t, v, values)
    mask = (tf.range(length) <= t)[None, None, None, :]
    return self._finish(x, _attention(q, keys, values, mask), False), keys, values


class DecoderOnlyTransformer(keras.Model):
  """Token and position embeddings, `num_layers` pre-norm blocks, a final norm, tied output embedding."""

  def __init__(
    self,
    vocab_size: int,
    max_length: int,
    model_dim: int,
    num_heads: int,
    num_layers: int,
    mlp_dim: int,
    dropout_rate: float = 0.0,
    **kwargs,
  ):
    """Creates the layers; `build_all` creates every weight.

    Args:
      vocab_size: Token ids.
      max_length: Most positions (the position embedding's size).
      model_dim: Width of the residual stream.
      num_heads: Attention heads per block.
      num_layers: Blocks.
      mlp_dim: Hidden width of each block's MLP.
      dropout_rate: Dropout in training (embeddings, attention and MLP outputs).
      **kwargs: Passed to `keras.Model`.
    """
    super().__init__(**kwargs)
    self.vocab_size, self.max_length, self.model_dim = vocab_size, max_length, model_dim
    self.blocks = [
      DecoderBlock(model_dim, num_heads, mlp_dim, dropout_rate, name=f"block_{i}") for i in range(num_layers)
    ]
    self.final_norm = keras.layers.LayerNormalization(epsilon=1e-6, name="final_norm")
    self.dropout = keras.layers.Dropout(dropout_rate)

  def build(self, input_shape=None):
    init = keras.initializers.RandomNormal(stddev=0.02)
    self.token_embedding = self.add_weight(
      name="token_embedding", shape=(self.vocab_size, self.model_dim), initializer=init
    )
    self.position_embedding = self.add_weight(
      name="position_embedding", shape=(self.max_length, self.model_dim), initializer=init
    )
    for block in self.blocks:
      block.build((None, None, self.model_dim))
    self.final_norm.build((None, None, self.model_dim))
    self.built = True

  def _embed(self, tokens: tf.Tensor, positions: tf.Tensor, training: bool) -> tf.Tensor:
    x = tf.gather(self.token_embedding, tokens) + tf.gather(self.position_embedding, positions)
    return self.dropout(tf.cast(x, self.compute_dtype), training=training)

  def _logits(self, x: tf.Tensor) -> tf.Tensor:
    x = self.final_norm(x)
    embedding = tf.cast(self.token_embedding, x.dtype)
    return tf.cast(tf.einsum("btd,vd->btv", x, embedding), tf.float32)

  def call(self, tokens, segment_ids=None, positions=None, training=False):
    """Logits (float32 [b, t, vocab]) of every position of tokens [b, t].

    Without `segment_ids` every token is in one segment (plain causal
    attention); without `positions` they are 0..t-1.
    """
    length = tf.shape(tokens)[1]
    if positions is None:
      positions = tf.broadcast_to(tf.range(length)[None, :], tf.shape(tokens))
    index = tf.range(length)
    mask = (index[None, :] <= index[:, None])[None, None]
    if segment_ids is not None:
      mask = mask & tf.equal(segment_ids[:, None, :, None], segment_ids[:, None, None, :])
    x = self._embed(tokens, positions, training)
    for block in self.blocks:
      x, _, _ = block(x, mask, training=training)
    return self._logits(x)

  def prefill(
    self, tokens: tf.Tensor, cache_length: int
  ) -> tuple[tf.Tensor, list[tuple[tf.Tensor, tf.Tensor]]]:
    """Runs tokens [b, p] (positions 0..p-1) and returns (logits, per-block (keys, values)).

    The keys and values are padded to `cache_length` positions, the cache of `step`.
    """
    length = tokens.shape[1]
    index = tf.range(length)
    mask = (index[None, :] <= index[:, None])[None, None]
    x = self._embed(tokens, tf.broadcast_to(index[None, :], tf.shape(tokens)), False)
    cache = []
    padding = [[0, 0], [0, cache_length - length], [0, 0], [0, 0]]
    for block in self.blocks:
      x, k, v = block(x, mask)
      cache.append((tf.pad(k, padding), tf.pad(v, padding)))
    return self._logits(x), cache

  def step(self, tokens: tf.Tensor, t: tf.Tensor, cache: list[tuple[tf.Tensor, tf.Tensor]]):
    """Logits (float32 [b, vocab]) after tokens [b] at position `t`, and the updated cache."""
    positions = tf.fill(tf.shape(tokens), t)
    x = self._embed(tokens[:, None], positions[:, None], False)
    new_cache = []
    for block, (keys, values) in zip(self.blocks, cache):
      x, keys, values = block.step(x, t, keys, values)
      new_cache.append((keys, values))
    return self._logits(x)[:, 0], new_cache
