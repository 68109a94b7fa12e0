"""TransformerLM: the task that ties the LM's data, model and decoding together (`gin/lm.gin`)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import gin
import numpy as np
import tensorflow as tf

from executor import ConfigError, Task, array_dataset, record_dataset
from executor.tasks.lm.data import (
  BOS_ID,
  BYTE_OFFSET,
  DEFAULT_EXCLUDE_DIRS,
  DEFAULT_PROMPTS,
  PAD_ID,
  VOCAB_SIZE,
  decode,
  encode_prompt,
  load_corpus,
  make_windows,
  pack_features,
  stdlib_root,
)
from executor.tasks.lm.generate import generate, sampler
from executor.tasks.lm.model import DecoderOnlyTransformer
from programs.core.records import array_parser, record_counts


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
  serving_inputs = ("prompt", "length")

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
    train_files: str = "",
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
      train_files: A glob of the TFRecord shards of the train windows, written once by
        `python -m executor.tasks.lm.prepare DIR` (same `sequence_length`); read with `record_dataset`.
        Empty: the windows are packed in memory at start-up.
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
    self.train_files = train_files
    if train_files:
      self._train_shards()  # Bad shards are a one-line error now, before the run touches anything.
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

  def _train_shards(self):
    """The train shards and the parse of their windows, checked against `sequence_length`."""
    cls = type(self).__name__
    files = sorted(tf.io.gfile.glob(self.train_files))
    if not files:
      raise ConfigError(f"{cls}.train_files: no file matches {self.train_files!r}")
    record_counts(files)  # Unindexed, changed or missing: InputError naming the file.
    parse = array_parser({"windows": np.zeros([1, self.sequence_length + 1], np.uint16)})
    example = tf.train.Example.FromString(next(iter(tf.data.TFRecordDataset(files[0]).take(1))).numpy())
    length = len(example.features.feature["windows"].int64_list.value)
    if length != self.sequence_length + 1:
      raise ConfigError(
        f"{cls}.train_files: {files[0]} holds windows of {length - 1} tokens, not {cls}.sequence_length = "
        f"{self.sequence_length}; prepare them again with --sequence_length={self.sequence_length}"
      )
    return files, parse

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
    if split == "train" and self.train_files:
      # Shards written once by `executor.tasks.lm.prepare`: record_dataset, resumable in O(one file).
      files, parse = self._train_shards()
      ds = record_dataset(files, parse, input_context, self.global_batch_size, True, self.seed, start_example)
      return ds.map(lambda batch: pack_features(batch["windows"])).prefetch(tf.data.AUTOTUNE)
    # Windows in a per-epoch random order, resumable at any example in constant time (executor.array_dataset).
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

  def serving_functions(self):
    """`serving_default` continues prompts (`decode_step`); no `score`: the decode split holds no targets."""
    return {"serving_default": self.decode_step}

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
