"""The runtime: the one `tf.distribute.Strategy` of the process and its state.

Every program closes over the variables that `Runtime.build` creates once under
the strategy's scope; that is the TF2 form of Lingvo's single TPU session.
The strategy is chosen by gin: bind `Runtime.strategy_fn` to one of the
factories of `programs.core.strategies`.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import gin
import keras
import numpy as np
import tensorflow as tf
from absl import logging
from tensorflow.python.eager import context as tf_context  # The global seed (no public getter).

from programs.core.data import StreamInputContext, pipeline_seed, takes_start
from programs.core.errors import ConfigError
from programs.core.host_counter import VALUE, HostCounter
from programs.core.strategies import (  # noqa: F401  (the factories' home before; tests and users import them here)
  configure_logical_cpus,
  default_strategy,
  mirrored_strategy,
  multi_worker_strategy,
  tpu_strategy,
)
from programs.core.task import Task

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


_INPUT_SEED_KEY = f"input_seed/.ATTRIBUTES/{VALUE}"


@gin.configurable
class Runtime:
  """Owns the strategy, the global step and the built tasks of the process."""

  def __init__(
    self,
    strategy_fn: Callable[[], tf.distribute.Strategy] = default_strategy,
    precision: str = "float32",
    initial_loss_scale: float = 2.0**15,
    loss_scale_growth_steps: int = 2000,
  ):
    """Creates the strategy.

    Args:
      strategy_fn: Factory of the `tf.distribute.Strategy`, e.g.
        `@mirrored_strategy` in gin.
      precision: The Keras dtype policy the tasks' layers are built with:
        'float32', 'mixed_bfloat16' or 'mixed_float16' (compute in 16 bits,
        variables in float32). With 'mixed_float16' each task's optimizer is
        a dynamic `LossScaleOptimizer` (its scale is checkpointed and written
        to `train/loss_scale`). Losses and metrics are reduced in float32.
      initial_loss_scale: With 'mixed_float16', the loss scale of the first
        step (halved at every step whose gradients overflow).
      loss_scale_growth_steps: With 'mixed_float16', the scale doubles after
        this many steps in a row without an overflow.
    """
    if precision not in PRECISIONS:
      raise ConfigError(f"Runtime.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if not initial_loss_scale > 0:
      raise ConfigError(f"Runtime.initial_loss_scale must be > 0, got {initial_loss_scale!r}")
    if type(loss_scale_growth_steps) is not int or loss_scale_growth_steps < 1:
      raise ConfigError(
        f"Runtime.loss_scale_growth_steps must be an integer >= 1, got {loss_scale_growth_steps!r}"
      )
    self.precision = precision
    self._loss_scale = (
      {"initial_scale": float(initial_loss_scale), "dynamic_growth_steps": loss_scale_growth_steps}
      if precision == "mixed_float16"
      else None
    )
    self.strategy = strategy_fn()
    self.global_step: tf.Variable | None = None
    # The host's copy of the global step; checkpoints save this, not the variable.
    self.step_counter: HostCounter | None = None
    # The seed input pipelines are built under (saved in checkpoints): see `pipeline_seed`.
    self.input_seed: HostCounter | None = None
    self._any_fn = None
    self._sum_fn = None
    self._gather_fn = None

  @property
  def num_replicas(self) -> int:
    """Replicas in sync across all workers."""
    return self.strategy.num_replicas_in_sync

  @property
  def num_workers(self) -> int:
    """Worker processes in the cluster (1 without one)."""
    resolver = getattr(self.strategy, "cluster_resolver", None)
    if resolver is None:
      return 1
    cluster = resolver.cluster_spec().as_dict()
    return max(1, len(cluster.get("chief", [])) + len(cluster.get("worker", [])))

  def any_worker(self, flag: bool) -> bool:
    """True on every worker if `flag` is true on any (a no-op on one worker)."""
    if self.num_workers == 1:
      return flag
    return self._sum_over_replicas(int(flag)) > 0

  def from_chief(self, value: int) -> int:
    """The chief's `value` on every worker (a no-op on one worker); `value` >= 0."""
    if self.num_workers == 1:
      return value
    total = self._sum_over_replicas(value if self.is_chief else 0)
    return total // (self.num_replicas // self.num_workers)  # The chief's replicas each added it once.

  def _sum_over_replicas(self, value: int) -> int:
    """The sum of `value` over every replica of every worker (each worker's replicas add its own value)."""
    if self._sum_fn is None:
      strategy = self.strategy

      @tf.function
      def sum_fn(x):
        per_replica = strategy.run(lambda: tf.identity(x))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

      self._sum_fn = sum_fn
    return int(self._sum_fn(tf.constant(value, tf.int64)).numpy())

  @property
  def is_chief(self) -> bool:
    """Whether this process writes summaries, files and checkpoints."""
    resolver = getattr(self.strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    if not cluster or resolver.task_type is None:
      return True
    if "chief" in cluster:
      return resolver.task_type == "chief"
    return resolver.task_type == "worker" and resolver.task_id == 0

  @property
  def worker_index(self) -> int:
    """This worker's index, which is its input pipeline's: the chief's 0, then the workers' in order."""
    resolver = getattr(self.strategy, "cluster_resolver", None)
    cluster = resolver.cluster_spec().as_dict() if resolver is not None else {}
    if not cluster or resolver.task_type is None:
      return 0
    if resolver.task_type == "chief":
      return 0
    return resolver.task_id + (1 if "chief" in cluster else 0)

  def all_workers(self, data: bytes) -> list[bytes]:
    """Every worker's `data`, in worker order, on every worker (`[data]` on one); every worker must call it."""
    if self.num_workers == 1:
      return [data]
    if self._gather_fn is None:
      strategy = self.strategy

      @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
      def gather_fn(x):
        return strategy.gather(strategy.run(lambda: tf.identity(x)), axis=0)

      self._gather_fn = gather_fn
    # Bytes go as int64 words, padded to the longest; each local replica adds its worker's once.
    local = self.num_replicas // self.num_workers
    sizes = self._gather_fn(tf.constant([len(data)], tf.int64)).numpy()[::local]
    words = -(-int(max(sizes)) // 8)
    padded = np.frombuffer(data.ljust(8 * words, b"\0"), np.int64)
    rows = self._gather_fn(tf.constant(padded)).numpy().reshape(-1, words)[::local]
    return [row.tobytes()[:size] for row, size in zip(rows, sizes)]

  def counter(self, name: str) -> tf.Variable:
    """A new int64 counter that device code changes (step, input position), starting at 0."""
    with self.strategy.scope():
      return tf.Variable(
        0, dtype=tf.int64, trainable=False, name=name, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
      )

  def build(self, tasks: Sequence[Task]) -> None:
    """Creates the global step and every task's variables, once, under the scope."""
    if self.global_step is not None:
      raise RuntimeError("Runtime.build was called twice")
    self.global_step = self.counter("global_step")
    self.step_counter = HostCounter(self.global_step)
    self.input_seed = HostCounter(value=self._first_input_seed())
    with self.strategy.scope():
      # Layers take the policy when they are created; the global policy is restored right after.
      previous = keras.config.dtype_policy()
      self._check_global_policy(previous.name, "")
      keras.config.set_dtype_policy(self.precision)
      try:
        for task in tasks:
          task.build()
          self._check_global_policy(keras.config.dtype_policy().name, f" in task '{task.name}'")
          task._build_optimizer_and_ema(loss_scale=self._loss_scale)  # noqa: SLF001
      finally:
        keras.config.set_dtype_policy(previous)
    logging.info(
      "Runtime built %d task(s) on %d replica(s) with %s",
      len(tasks),
      self.num_replicas,
      type(self.strategy).__name__,
    )

  def _check_global_policy(self, policy: str, where: str) -> None:
    """Refuses a global Keras dtype policy set in code (`set_global_policy`) that is not the run's precision."""
    if policy in ("float32", self.precision):
      return
    instead = f"'{policy}'" if policy in PRECISIONS else f"one of {', '.join(PRECISIONS)}"
    raise ConfigError(
      f"the global Keras dtype policy is '{policy}' (keras.mixed_precision.set_global_policy{where}), but the run "
      f"builds its tasks under Runtime.precision = '{self.precision}': set Runtime.precision = {instead} in gin "
      "(it also scales float16 losses) and drop the set_global_policy call"
    )

  def _first_input_seed(self) -> int:
    """The input seed of a run that starts afresh: the chief's, on every worker.

    TensorFlow's global seed where one is set (`--deterministic --seed=N`), else drawn at random.
    """
    global_seed = tf_context.global_seed()
    seed = int(global_seed) if global_seed is not None else random.SystemRandom().randrange(2**31)
    return self.from_chief(seed)

  def checkpoint_items(self) -> dict[str, Any]:
    """The runtime's state saved with the run besides the global step: the input seed."""
    return {"input_seed": self.input_seed}

  def resume_input_seed(self, checkpoint_path: str) -> None:
    """Takes the input seed saved in `checkpoint_path`, before any pipeline is built (kept if it has none)."""
    reader = tf.train.load_checkpoint(checkpoint_path)
    if reader.has_tensor(_INPUT_SEED_KEY):
      self.input_seed.value = int(reader.get_tensor(_INPUT_SEED_KEY))

  def pipeline_seed(self, split: str, input_pipeline_id: int) -> int:
    """The global seed the pipelines of `split` are built under, for input pipeline `input_pipeline_id`.

    A function of the run's input seed (saved in checkpoints), so a resumed run builds its pipelines with the
    seeds of the run it resumes (`programs.core.data.pipeline_seed`).
    """
    return zlib.crc32(f"{self.input_seed.value}/{split}/{input_pipeline_id}".encode()) & 0x7FFFFFFF

  def distribute_dataset(
    self, task: Task, split: str, start_example: int = 0, repeat_steps: int | None = None
  ) -> Any:
    """The distributed dataset of `task`'s `split`, one pipeline per worker.

    Args:
      task: The task whose `dataset` is called once per input pipeline.
      split: The split.
      start_example: Examples already read from this split, over all
        pipelines: each pipeline starts past its share of them, so a restored
        run reads on exactly where the saved one was (the task's data must be
        deterministic). A `dataset()` that takes `start_example` starts
        there in constant time (`programs.core.data`); any other is replayed with
        `skip` (see `replay_batches`).
      repeat_steps: Repeat the first `repeat_steps` steps of the data
        forever (the same batches for every eval run).
    """

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
      ds = self.pipeline(task, split, ctx, start_example)
      if repeat_steps is not None:
        ds = ds.take(repeat_steps * ctx.num_replicas_in_sync // ctx.num_input_pipelines).repeat()
      return ds

    options = tf.distribute.InputOptions(experimental_fetch_to_device=True)
    return self.strategy.distribute_datasets_from_function(dataset_fn, options=options)

  def worker_dataset(
    self, task: Task, split: str, start_example: int = 0, stream_pipelines: int | None = None
  ) -> tf.data.Dataset:
    """This worker's input pipeline of `split` (a plain dataset, whose iterator tf.data can save).

    Each step reads one element per local replica, in replica order, as a distributed dataset hands them out
    (`per_replica`). Arguments as `distribute_dataset`'s; `stream_pipelines`: the input pipelines of the run
    that started the split's stream (`programs.core.data.StreamInputContext`), this run's when None.
    """
    workers = self.num_workers
    context = StreamInputContext(workers, self.worker_index, self.num_replicas, stream_pipelines or workers)
    return self.pipeline(task, split, context, start_example)

  def pipeline(
    self, task: Task, split: str, ctx: tf.distribute.InputContext, start_example: int
  ) -> tf.data.Dataset:
    """Input pipeline `ctx.input_pipeline_id` of `split`, past its share of `start_example`, under its seeds."""
    seekable = takes_start(task.dataset, split)
    start = start_example // ctx.num_input_pipelines
    with pipeline_seed(self.pipeline_seed(split, ctx.input_pipeline_id)):
      ds = task.dataset(split, ctx, start_example=start) if seekable else task.dataset(split, ctx)
    if not seekable and start:
      ds = ds.skip(start // ctx.get_per_replica_batch_size(task.global_batch_size))
    return ds

  def per_replica(self, iterator: Any) -> Any:
    """One step's batches of this worker's `iterator` (in a trace): local replica r takes the r-th element."""
    if self.num_replicas == 1 and self.num_workers == 1:
      return iterator.get_next()
    return self.strategy.experimental_distribute_values_from_function(lambda _: iterator.get_next())

  @property
  def reads_worker_pipelines(self) -> bool:
    """Whether the train input reads `worker_dataset` (not on TPUs, whose loops take distributed iterators)."""
    return not isinstance(self.strategy, tf.distribute.TPUStrategy)

  def replay_batches(self, task: Task, start_example: int) -> int:
    """Batches each pipeline replays to reach `start_example`: 0 when `task.dataset` takes `start_example`."""
    if takes_start(task.dataset) or not start_example:
      return 0
    per_replica = task.global_batch_size // self.num_replicas
    return start_example // self.num_workers // per_replica

  def step(self) -> int:
    """The global step, as the host knows it (no device read).

    Train loops return the step they reached (`note_step`) and a restore sets it, so programs and the executor
    read the step between loops without waiting on the device.
    """
    return self.step_counter.value

  def note_step(self, step: int) -> None:
    """Records the global step a train loop returned."""
    self.step_counter.value = step


def enable_determinism(seed: int = 0) -> None:
  """Op determinism and fixed seeds, for bit-exact reproducibility on CPU."""
  tf.config.experimental.enable_op_determinism()
  keras.utils.set_random_seed(seed)
