"""A decoder-only Transformer language model on the Python standard library's own sources.

The text is real and ships with every Python: the `.py` files of the standard
library (found with `sysconfig`, else next to `os.__file__`), split into train
and held-out BY FILE (a hash of each file's path decides, so the split is
deterministic and does not move when other files come or go).

Vocabulary: bytes. Id 0 is padding, id 1 starts every file (so predicting it
after a file's last byte means "end of file"), and byte `b` is id `b + 2`.

Packing: the files of a split are concatenated, each starting with the
file id, and cut into windows of `sequence_length + 1` ids (inputs and
targets shifted by one), the last one padded. A window can hold the end of
one file and the start of the next: its tokens carry segment ids (one per
file, 0 for padding) and positions that restart at each file, and attention
never crosses a segment. Loss and metrics weigh real target tokens only.

Decoding generates continuations of fixed prompts on device in one
`tf.while_loop`: greedy and temperature/top-k sampling from a
`tf.random.Generator` the task owns and checkpoints. With `cache=True` the
keys and values of past positions are kept in a fixed-size buffer, so each
new token costs one position; with `cache=False` every step recomputes the
whole prefix (for the benchmark and the equality test).
"""

from __future__ import annotations

import functools
import math
import os
import sysconfig
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin
import keras
import numpy as np
import tensorflow as tf

from core.data import array_dataset
from core.errors import ConfigError
from core.task import Task

PAD_ID = 0
BOS_ID = 1
BYTE_OFFSET = 2
VOCAB_SIZE = 256 + BYTE_OFFSET

DEFAULT_PROMPTS = (
  "import os\n",
  "def main():\n    ",
  "class ",
  "    def __init__(self, ",
  "if __name__ == ",
  "        for i in range(",
  '"""',
  "        return ",
)

DEFAULT_EXCLUDE_DIRS = ("site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test")


# ----- Data ---------------------------------------------------------------------


def stdlib_root() -> str:
  """The folder of the running Python's standard library."""
  root = sysconfig.get_paths().get("stdlib")
  if root and os.path.isfile(os.path.join(root, "os.py")):
    return root
  return os.path.dirname(os.__file__)


def stdlib_files(root: str, exclude_dirs: Sequence[str] = DEFAULT_EXCLUDE_DIRS) -> list[str]:
  """Paths (relative, `/`-separated, sorted) of every `.py` file under `root`, minus `exclude_dirs`."""
  exclude = set(exclude_dirs)
  out = []
  for folder, dirs, files in os.walk(root):
    dirs[:] = sorted(d for d in dirs if d not in exclude)
    rel = os.path.relpath(folder, root)
    for name in files:
      if name.endswith(".py"):
        out.append(name if rel == "." else f"{rel.replace(os.sep, '/')}/{name}")
  return sorted(out)


def is_held_out(path: str, held_out_percent: int) -> bool:
  """Whether the file at relative `path` belongs to the held-out split (a hash of the path decides)."""
  return zlib.crc32(path.encode("utf-8")) % 100 < held_out_percent


def encode(data: bytes) -> np.ndarray:
  """Token ids (uint16) of raw bytes."""
  return np.frombuffer(data, np.uint8).astype(np.uint16) + BYTE_OFFSET


def decode(ids: Sequence[int] | np.ndarray) -> str:
  """The text of token ids, up to the first padding or file-start id (invalid UTF-8 is replaced)."""
  out = bytearray()
  for i in np.asarray(ids).tolist():
    if i < BYTE_OFFSET:
      break
    out.append(i - BYTE_OFFSET)
  return out.decode("utf-8", errors="replace")


def encode_prompt(text: str) -> np.ndarray:
  """The ids of a prompt: the file-start id, then the text's UTF-8 bytes."""
  return np.concatenate([[BOS_ID], encode(text.encode("utf-8"))]).astype(np.int32)


@functools.lru_cache(maxsize=4)
def load_corpus(
  root: str, exclude_dirs: tuple[str, ...], held_out_percent: int
) -> tuple[np.ndarray, np.ndarray, int, int]:
  """The train and held-out streams of token ids (uint16), each file preceded by `BOS_ID`.

  Returns:
    (train stream, held-out stream, train files, held-out files).
  """
  parts: dict[bool, list[np.ndarray]] = {False: [], True: []}
  for path in stdlib_files(root, exclude_dirs):
    with open(os.path.join(root, path), "rb") as f:
      data = f.read()
    parts[is_held_out(path, held_out_percent)].append(
      np.concatenate([[BOS_ID], encode(data)]).astype(np.uint16)
    )
  streams = [np.concatenate(parts[h]) if parts[h] else np.zeros([0], np.uint16) for h in (False, True)]
  return streams[0], streams[1], len(parts[False]), len(parts[True])


def make_windows(stream: np.ndarray, sequence_length: int) -> np.ndarray:
  """Windows of `sequence_length + 1` ids with stride `sequence_length` (each id is a target once).

  The last window is padded with `PAD_ID`. Returns uint16 [num_windows, sequence_length + 1].
  """
  n = max(1, math.ceil((len(stream) - 1) / sequence_length))
  padded = np.full([n * sequence_length + 1], PAD_ID, np.uint16)
  padded[: len(stream)] = stream
  return np.lib.stride_tricks.sliding_window_view(padded, sequence_length + 1)[::sequence_length].copy()


def pack_features(windows: tf.Tensor) -> dict[str, tf.Tensor]:
  """The model's features of a batch of windows [batch, length + 1] of ids.

  Returns:
    `inputs` and `targets` (int32 [batch, length]), `segment_ids` (one per
    file in the window, counting from 1; 0 on padding) and `positions`
    (restarting at 0 at each file start).
  """
  windows = tf.cast(windows, tf.int32)
  inputs, targets = windows[:, :-1], windows[:, 1:]
  segments = tf.cumsum(tf.cast(tf.equal(inputs, BOS_ID), tf.int32), axis=1) + 1
  # Segments are sorted along each row: a segment starts at its first index.
  starts = tf.searchsorted(segments, segments, side="left", out_type=tf.int32)
  positions = tf.range(tf.shape(inputs)[1])[None, :] - starts
  real = tf.not_equal(inputs, PAD_ID)
  return {
    "inputs": inputs,
    "targets": targets,
    "segment_ids": tf.where(real, segments, 0),
    "positions": tf.where(real, positions, 0),
  }


# ----- Model --------------------------------------------------------------------


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


def generate(
  model: DecoderOnlyTransformer,
  prompts: tf.Tensor,
  lengths: tf.Tensor,
  num_new_tokens: int,
  choose: Callable[[tf.Tensor], tf.Tensor],
  cache: bool = True,
  timestamps: bool = False,
) -> tf.Tensor | tuple[tf.Tensor, tf.Tensor]:
  """Continues right-padded prompts by `num_new_tokens` tokens each, on device, in one `tf.while_loop`.

  Every row advances in lockstep from the end of the shortest prompt: while a
  row is still inside its prompt the next token is the prompt's, afterwards
  it is `choose(logits)`; after a row generates `BOS_ID` (end of file) it
  emits `PAD_ID`. With `cache`, the prompts run in one pass that fills a
  key/value buffer of `prompt length + num_new_tokens` positions and each
  step then costs one position; without, each step runs the whole prefix.

  Args:
    model: The model.
    prompts: int32 [b, p], each row `BOS_ID` and the prompt's bytes, then `PAD_ID`.
    lengths: int32 [b], the real length of each prompt (>= 1).
    num_new_tokens: Tokens generated per row (static).
    choose: logits float32 [b, vocab] -> int32 [b]: greedy or sampling; called once per step.
    cache: Use the key/value cache.
    timestamps: Also return the wall time (`tf.timestamp`) after each step (for the benchmark).

  Returns:
    int32 [b, num_new_tokens] (and float64 [steps] timestamps if asked).
  """
  prompt_length = prompts.shape[1]
  total = prompt_length + num_new_tokens
  buffer = tf.pad(prompts, [[0, 0], [0, num_new_tokens]])
  start = tf.reduce_min(lengths) - 1
  batch = tf.shape(prompts)[0]
  kv = model.prefill(prompts, total)[1] if cache else []
  times = tf.TensorArray(tf.float64, size=0, dynamic_size=True)

  def body(t, buffer, finished, kv, times):
    if cache:
      logits, kv = model.step(buffer[:, t], t, kv)
    else:
      logits = model(buffer[:, : t + 1])[:, -1]
    chosen = choose(logits)
    forced = t + 1 < lengths
    token = tf.where(forced, buffer[:, t + 1], tf.where(finished, PAD_ID, chosen))
    finished = finished | (~forced & tf.equal(chosen, BOS_ID))
    buffer = tf.where(tf.equal(tf.range(total), t + 1)[None, :], token[:, None], buffer)
    if timestamps:
      with tf.control_dependencies([token]):
        times = times.write(t - start, tf.timestamp())
    return t + 1, buffer, finished, kv, times

  _, buffer, _, _, times = tf.while_loop(
    lambda t, *_: t < total - 1,
    body,
    (start, buffer, tf.zeros([batch], tf.bool), kv, times),
    parallel_iterations=1,
  )
  index = lengths[:, None] + tf.range(num_new_tokens)[None, :]
  out = tf.gather(buffer, index, batch_dims=1)
  return (out, times.stack()) if timestamps else out


def sampler(
  generator: tf.random.Generator, greedy: tf.Tensor, temperature: float, top_k: int
) -> Callable[[tf.Tensor], tf.Tensor]:
  """A `choose` function for `generate`: argmax where `greedy` [b] is true, else a sample.

  Samples are drawn by the Gumbel-max trick from `generator` (one uniform
  draw of [b, vocab] per step, for every row), restricted to the `top_k`
  most likely tokens (0: all) at `temperature`. Padding is never chosen.
  """

  def choose(logits):
    vocab = logits.shape[-1]
    logits = tf.where(tf.equal(tf.range(vocab), PAD_ID)[None, :], tf.constant(-1e9, logits.dtype), logits)
    best = tf.argmax(logits, -1, output_type=tf.int32)
    scaled = logits / temperature
    if 0 < top_k < vocab:
      kth = tf.math.top_k(logits, top_k).values[:, -1:]
      scaled = tf.where(logits >= kth, scaled, tf.constant(-1e9, scaled.dtype))
    uniform = generator.uniform(tf.shape(logits), minval=1e-9, maxval=1.0, dtype=tf.float32)
    sampled = tf.argmax(scaled - tf.math.log(-tf.math.log(uniform)), -1, output_type=tf.int32)
    return tf.where(greedy, best, sampled)

  return choose


# ----- Task ---------------------------------------------------------------------


@gin.configurable
class TransformerLM(Task):
  """A byte-level decoder-only Transformer LM on the standard library's sources.

  Splits: `train` (packed windows of the train files, shuffled, forever),
  `eval` (the first `num_eval_sequences` windows of the held-out files, spread
  evenly over them), `decode` (the fixed `prompts`). Metrics: `loss` (per
  real target token), `token_accuracy`, `perplexity` (exp of the run's loss
  per real token), all weighted by real target tokens, padding excluded.
  Decoding writes each prompt with its greedy continuation and its sampled
  ones.
  """

  splits = ("train", "eval", "decode")

  def __init__(
    self,
    sequence_length: int = 128,
    max_length: int = 512,
    model_dim: int = 128,
    num_heads: int = 4,
    num_layers: int = 4,
    mlp_dim: int = 512,
    dropout_rate: float = 0.0,
    held_out_percent: int = 10,
    num_eval_sequences: int = 256,
    exclude_dirs: Sequence[str] = DEFAULT_EXCLUDE_DIRS,
    stdlib_dir: str | None = None,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    max_prompt_length: int = 32,
    num_decode_tokens: int = 128,
    greedy: bool = True,
    num_samples: int = 1,
    temperature: float = 0.8,
    top_k: int = 40,
    cache: bool = True,
    seed: int = 1,
    **kwargs,
  ):
    """Configures the task; see `Task` for the shared arguments.

    Args:
      sequence_length: Tokens per training and eval window (<= `max_length`).
      max_length: Positions the model can see (its position embedding).
      model_dim: Width of the residual stream.
      num_heads: Attention heads (divide `model_dim`).
      num_layers: Transformer blocks.
      mlp_dim: Hidden width of each block's MLP.
      dropout_rate: Dropout in training.
      held_out_percent: Percent of the files (by a hash of their path) held out for `eval`.
      num_eval_sequences: Windows of the held-out files in `eval` (spread evenly over them).
      exclude_dirs: Folder names skipped when collecting the standard library's files.
      stdlib_dir: Where the text comes from; default the running Python's standard library.
      prompts: The fixed prompts of `decode`.
      max_prompt_length: Bytes of prompt room (+1 for the file-start id); longer prompts are an error.
      num_decode_tokens: Tokens generated per continuation.
      greedy: Decode a greedy continuation of each prompt.
      num_samples: Sampled continuations per prompt.
      temperature: Sampling temperature (> 0).
      top_k: Sample from the `top_k` most likely tokens (0: from all).
      cache: Decode with the key/value cache (False recomputes the prefix at each step).
      seed: Seed of the train shuffle and of the sampling generator.
      **kwargs: The `Task` arguments (`name`, `global_batch_size`, `optimizer_fn`, ...).

    Raises:
      ConfigError: A length above the model's maximum, a prompt too long, bad sizes.
    """
    super().__init__(**kwargs)
    cls = type(self).__name__
    if sequence_length < 1 or sequence_length > max_length:
      raise ConfigError(
        f"{cls}.sequence_length = {sequence_length} must be between 1 and the model's maximum "
        f"{cls}.max_length = {max_length}"
      )
    if max_prompt_length + 1 + num_decode_tokens > max_length:
      raise ConfigError(
        f"{cls}.max_prompt_length + 1 + {cls}.num_decode_tokens = {max_prompt_length} + 1 + "
        f"{num_decode_tokens} exceeds the model's maximum {cls}.max_length = {max_length}"
      )
    if model_dim % num_heads:
      raise ConfigError(f"{cls}.model_dim = {model_dim} does not divide by {cls}.num_heads = {num_heads}")
    if num_decode_tokens < 1 or num_samples < 0 or not (greedy or num_samples):
      raise ConfigError(
        f"{cls}: decoding needs num_decode_tokens >= 1 and greedy or num_samples >= 1, got "
        f"num_decode_tokens={num_decode_tokens}, greedy={greedy}, num_samples={num_samples}"
      )
    if temperature <= 0 or top_k < 0:
      raise ConfigError(f"{cls}.temperature must be > 0 and {cls}.top_k >= 0, got {temperature}, {top_k}")
    if not 0 < held_out_percent < 100 or num_eval_sequences < 1:
      raise ConfigError(
        f"{cls}.held_out_percent must be in 1..99 and {cls}.num_eval_sequences >= 1, got "
        f"{held_out_percent}, {num_eval_sequences}"
      )
    if not prompts:
      raise ConfigError(f"{cls}.prompts is empty")
    for p in prompts:
      if len(p.encode("utf-8")) > max_prompt_length:
        raise ConfigError(
          f"{cls}.prompts: {p!r} is {len(p.encode('utf-8'))} bytes, more than "
          f"{cls}.max_prompt_length = {max_prompt_length}"
        )
    root = stdlib_dir or stdlib_root()
    if not os.path.isdir(root):
      raise ConfigError(f"{cls}.stdlib_dir: {root} is not a folder")
    self.stdlib_dir = root
    self.sequence_length, self.max_length = sequence_length, max_length
    self.model_dim, self.num_heads, self.num_layers, self.mlp_dim = model_dim, num_heads, num_layers, mlp_dim
    self.dropout_rate = dropout_rate
    self.held_out_percent, self.num_eval_sequences = held_out_percent, num_eval_sequences
    self.exclude_dirs = tuple(exclude_dirs)
    self.prompts = tuple(prompts)
    self.max_prompt_length, self.num_decode_tokens = max_prompt_length, num_decode_tokens
    self.greedy, self.num_samples, self.temperature, self.top_k = greedy, num_samples, temperature, top_k
    self.cache = cache
    self.seed = seed
    self.generator: tf.random.Generator | None = None

  def build(self) -> None:
    self.model = DecoderOnlyTransformer(
      VOCAB_SIZE,
      self.max_length,
      self.model_dim,
      self.num_heads,
      self.num_layers,
      self.mlp_dim,
      self.dropout_rate,
      name="transformer",
    )
    self.model.build()
    # The sampling generator: created here (under the strategy scope) and checkpointed.
    self.generator = tf.random.Generator.from_seed(self.seed)
    super().build()

  def checkpoint_items(self) -> dict[str, Any]:
    items = super().checkpoint_items()
    if self.generator is not None:
      items["decode_generator"] = self.generator
    return items

  # ----- Data -----

  def corpus(self) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(train stream, held-out stream, train files, held-out files); read once per process."""
    return load_corpus(self.stdlib_dir, self.exclude_dirs, self.held_out_percent)

  def windows(self, split: str) -> np.ndarray:
    """The packed windows (uint16 [n, sequence_length + 1]) of `train` or `eval`."""
    train, held_out, _, _ = self.corpus()
    if split == "train":
      return make_windows(train, self.sequence_length)
    windows = make_windows(held_out, self.sequence_length)
    n = min(self.num_eval_sequences, len(windows))
    return windows[np.linspace(0, len(windows) - 1, n).round().astype(int)]

  def prompt_arrays(self) -> tuple[np.ndarray, np.ndarray]:
    """The prompts as (int32 [n, max_prompt_length + 1] right-padded ids, int32 [n] lengths)."""
    ids = [encode_prompt(p) for p in self.prompts]
    out = np.full([len(ids), self.max_prompt_length + 1], PAD_ID, np.int32)
    for i, row in enumerate(ids):
      out[i, : len(row)] = row
    return out, np.array([len(r) for r in ids], np.int32)

  def dataset(
    self, split: str, input_context: tf.distribute.InputContext, start_example: int = 0
  ) -> tf.data.Dataset:
    batch = input_context.get_per_replica_batch_size(self.global_batch_size)
    if split == "decode":
      prompts, lengths = self.prompt_arrays()
      ds = tf.data.Dataset.from_tensor_slices(
        {"prompt": prompts, "length": lengths, "index": np.arange(len(lengths), dtype=np.int32)}
      )
      ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
      return ds.batch(batch)
    # Windows in a per-epoch random order, resumable at any example in constant time (core.data).
    arrays = {"windows": self.windows(split)}
    ds = array_dataset(
      arrays, input_context, self.global_batch_size, split == "train", self.seed, start_example
    )
    ds = ds.map(lambda batch: pack_features(batch["windows"]))
    return ds.prefetch(tf.data.AUTOTUNE)

  # ----- Device -----

  def compute_loss(self, batch, training):
    logits = self.model(batch["inputs"], batch["segment_ids"], batch["positions"], training=training)
    targets = batch["targets"]
    weights = tf.cast(tf.not_equal(targets, PAD_ID), tf.float32)
    token_loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    num_tokens = tf.reduce_sum(weights)
    loss = tf.math.divide_no_nan(tf.reduce_sum(token_loss * weights), num_tokens)
    correct = tf.cast(tf.equal(tf.argmax(logits, -1, output_type=tf.int32), targets), tf.float32) * weights
    metrics = {
      "loss": (loss, num_tokens),
      "token_accuracy": (tf.math.divide_no_nan(tf.reduce_sum(correct), num_tokens), num_tokens),
    }
    return loss, metrics, {}

  def reduce_metrics(self, sums, weights):
    """The weighted means, and `perplexity`: exp of the mean loss per real token of the whole run."""
    metrics = super().reduce_metrics(sums, weights)
    metrics["perplexity"] = math.exp(min(metrics["loss"], 700.0))
    return metrics

  def decode_step(self, batch):
    """Greedy and sampled continuations of each prompt, on device, in one generation loop."""
    prompts, lengths = batch["prompt"], batch["length"]
    copies = int(self.greedy) + self.num_samples
    batch_size = tf.shape(prompts)[0]
    greedy = tf.repeat(tf.range(copies) < int(self.greedy), batch_size)
    out = generate(
      self.model,
      tf.tile(prompts, [copies, 1]),
      tf.tile(lengths, [copies]),
      self.num_decode_tokens,
      sampler(self.generator, greedy, self.temperature, self.top_k),
      cache=self.cache,
    )
    out = tf.transpose(tf.reshape(out, [copies, batch_size, self.num_decode_tokens]), [1, 0, 2])
    per_example = {"index": batch["index"], "prompt": prompts, "length": lengths}
    if self.greedy:
      per_example["greedy"] = out[:, 0]
    if self.num_samples:
      per_example["samples"] = out[:, int(self.greedy) :]
    return per_example

  # ----- Host -----

  def postprocess_decode(
    self, per_example: Mapping[str, np.ndarray]
  ) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One record per prompt: the prompt, its greedy continuation and its samples, as text.

    Metrics: `continuation_bytes` (mean bytes before the end-of-file id or
    the end) and `ended_fraction` (continuations that generated an end of file).
    """
    records, lengths, ended = [], [], []
    for i in range(len(per_example["index"])):
      prompt_ids = per_example["prompt"][i][1 : per_example["length"][i]]
      record: dict[str, Any] = {"index": int(per_example["index"][i]), "prompt": decode(prompt_ids)}
      outputs = []
      if "greedy" in per_example:
        outputs.append(per_example["greedy"][i])
        record["greedy"] = decode(per_example["greedy"][i])
      if "samples" in per_example:
        outputs.extend(per_example["samples"][i])
        record["samples"] = [decode(s) for s in per_example["samples"][i]]
      for ids in outputs:
        stops = np.flatnonzero(np.asarray(ids) < BYTE_OFFSET)
        lengths.append(int(stops[0]) if len(stops) else len(ids))
        ended.append(bool(len(stops)) and int(ids[stops[0]]) == BOS_ID)
      records.append(record)
    if not records:
      return records, {}
    return records, {"continuation_bytes": float(np.mean(lengths)), "ended_fraction": float(np.mean(ended))}
