"""Input pipelines that resume in constant time: example indices first, examples second.

A restarted run must read on exactly where the saved one stopped. Replaying the input (`ds.skip(n)`) costs time in
proportion to the steps already taken: tf.data produces and throws away every batch. An index-based pipeline
does not: the train split is an endless stream of positions `k = start, start + 1, ...`, each mapped to an example
index through a per-epoch permutation (`RandomIndexShuffle`, stateless), so it can start at any position in O(1)
and reads the same examples in the same order as a run that never stopped.

`Task.dataset(split, input_context, start_example)` receives the position (examples of this pipeline already
consumed); `array_dataset` is the ready-made pipeline over in-memory arrays. A task whose `dataset()` takes no
`start_example` resumes from its tf.data iterator state, saved in each checkpoint (`programs.core.input_state`),
where tf.data can save it; else it is replayed with `skip`, and the start-up log says what that costs.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import time
from collections.abc import Iterator, Mapping

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context as tf_context  # The global seed's state (no public getter).
from tensorflow.python.framework import random_seed  # The default graph seed of seeded ops.

from programs.core.errors import ConfigError


def array_dataset(
  arrays: Mapping[str, np.ndarray],
  input_context: tf.distribute.InputContext,
  global_batch_size: int,
  train: bool,
  seed: int = 0,
  start_example: int = 0,
) -> tf.data.Dataset:
  """Per-replica batches of in-memory arrays for one input pipeline.

  Args:
    arrays: `{name: array[num_examples, ...]}`, all of the same length.
    input_context: The pipeline's context (its id, the number of pipelines, the per-replica batch size).
    global_batch_size: Examples per step over all replicas.
    train: True: endless, reshuffled every epoch, whole batches only, starting at `start_example`. False: one
      pass in order (a partial last batch included).
    seed: Seed of the per-epoch permutations.
    start_example: Position in this pipeline's stream of the first example to read (train only).

  Returns:
    The pipeline's dataset. Pipeline p of W reads positions p, p + W, p + 2W, ... of the global stream.

  Raises:
    ConfigError: arrays of no examples, or a per-replica batch of none.
  """
  lengths = {len(v) for v in arrays.values()}
  if len(lengths) != 1:
    raise ValueError(f"array_dataset needs arrays of one length, got {sorted(lengths)}")
  (n,) = lengths
  batch = per_replica_batch("array_dataset", input_context, global_batch_size)
  if n == 0:
    raise ConfigError("array_dataset: the split is empty: its arrays hold no examples")
  pipelines, pipeline = input_context.num_input_pipelines, input_context.input_pipeline_id
  if not train:
    ds = tf.data.Dataset.from_tensor_slices(dict(arrays)).shard(pipelines, pipeline)
    return ds.batch(batch).prefetch(tf.data.AUTOTUNE)
  tensors = {k: tf.constant(v) for k, v in arrays.items()}

  def examples(positions):
    global_positions = pipeline + pipelines * positions
    epoch, index = global_positions // n, global_positions % n
    seeds = tf.stack([tf.fill(tf.shape(epoch), tf.constant(seed, tf.int64)), epoch, tf.zeros_like(epoch)], 1)
    shuffled = tf.raw_ops.RandomIndexShuffle(
      index=index, seed=seeds, max_index=tf.constant(n - 1, tf.int64), rounds=4
    )
    return {k: tf.gather(t, shuffled) for k, t in tensors.items()}

  # An endless stream (infinite cardinality, as a repeated split has) that opens at any position in O(1).
  # One element per batch (its positions made by `tf.range`, not batched one by one): per-batch, vectorised work.
  ds = tf.data.Dataset.counter(0).map(lambda i: tf.range(batch, dtype=tf.int64) + start_example + i * batch)
  return ds.map(examples, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)


class StreamInputContext(tf.distribute.InputContext):
  """An input pipeline's context that also says how many pipelines the run that started the stream had.

  A pipeline whose order depends on its count (`record_dataset` gives each pipeline its own files) reads the
  stream that count made, whatever the pipelines now: a run resumed on more or fewer workers reads on exactly
  (see `stream_pipelines`).

  Args:
    num_input_pipelines: Input pipelines now (one per worker).
    input_pipeline_id: This pipeline's index.
    num_replicas_in_sync: Replicas now, over all workers.
    stream_pipelines: Input pipelines of the run that started the stream (saved in checkpoints).
  """

  def __init__(
    self, num_input_pipelines: int, input_pipeline_id: int, num_replicas_in_sync: int, stream_pipelines: int
  ):
    super().__init__(num_input_pipelines, input_pipeline_id, num_replicas_in_sync)
    self.stream_pipelines = stream_pipelines


def stream_pipelines(input_context: tf.distribute.InputContext) -> int:
  """The input pipelines of the run that started the stream: the pipelines now, unless the context says."""
  return getattr(input_context, "stream_pipelines", input_context.num_input_pipelines)


def per_replica_batch(
  function: str, input_context: tf.distribute.InputContext, global_batch_size: int
) -> int:
  """The examples of one replica's batch; a ConfigError naming `function` when there are none or they do not divide.

  Raises:
    ConfigError: the global batch is not a positive multiple of the replica count.
  """
  replicas = input_context.num_replicas_in_sync
  if global_batch_size < replicas or global_batch_size % replicas:
    raise ConfigError(
      f"{function}: a global batch of {global_batch_size} example(s) does not divide into batches of at least "
      f"one example for {replicas} replica(s)"
    )
  return input_context.get_per_replica_batch_size(global_batch_size)


def takes_start(dataset_fn, split: str | None = None) -> bool:
  """Whether a task's `dataset` method opens `split` at `start_example` (and so resumes in constant time).

  It does if it takes `start_example`, unless its task has a `seekable(split)` method that says otherwise (a
  task whose data source decides, as `KerasTask`'s does).
  """
  if "start_example" not in inspect.signature(dataset_fn).parameters:
    return False
  seekable = getattr(getattr(dataset_fn, "__self__", None), "seekable", None)
  return seekable(split) if callable(seekable) else True


def replay_secs_per_batch(dataset: tf.data.Dataset, batches: int = 20) -> float:
  """Seconds one batch of `dataset` takes to produce (after the first), measured on `batches` batches."""
  iterator = iter(dataset)
  next(iterator)
  start = time.perf_counter()
  for _ in range(batches):
    next(iterator)
  return (time.perf_counter() - start) / batches


@contextlib.contextmanager
def pipeline_seed(seed: int) -> Iterator[None]:
  """Inside, TensorFlow seeds unseeded random ops from a sequence that starts at `seed`; seeded ops as outside.

  An op without a seed of its own (an unseeded `shuffle`, `Dataset.random`, a random op in a `map`) takes its
  seed from the global seed and from how many such ops the process made before it, or a random one when no
  global seed is set. A tf.data iterator's saved state holds a shuffle's buffer but not its seeds, which reshuffle
  every epoch, so a resumed run must build its pipeline with the seeds of the run it resumes, whatever else it
  built first: the runtime builds every input pipeline inside this scope, under a seed kept in the checkpoint.
  A seeded op gets the seeds it gets outside (from the global seed, or TensorFlow's default graph seed when none
  is set), and the process's global seed and sequence are as they were afterwards.
  """
  context = tf_context.context()
  # TensorFlow keeps the global seed and its op-seed sequence here (no public API to read or restore them).
  saved = context._seed, getattr(context, "_rng", None)  # noqa: SLF001
  context._seed = saved[0] if saved[0] is not None else random_seed.DEFAULT_GRAPH_SEED  # noqa: SLF001
  context._rng = random.Random(seed)  # noqa: SLF001
  try:
    yield
  finally:
    context._seed, context._rng = saved  # noqa: SLF001
