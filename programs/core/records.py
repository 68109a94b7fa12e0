"""Record files (TFRecord shards) read in a shuffled order that resumes at any example in constant time.

An epoch reads the files in a new seeded order, one after the other, and shuffles each block of `block_size`
consecutive records of that stream with a seeded permutation: a block shuffle, as good as a shuffle buffer of
`block_size` records plus a global shuffle of the file order (`bench/input.py` measures it against a global
shuffle). Every choice is a stateless function of `(seed, epoch, block)`, so a restart needs only the position:
opening at example `k` skips whole epochs and whole files by arithmetic on the per-file record counts (the index)
and reads at most one file's records before the block that holds `k`. The cost does not grow with the run.

The index is a small JSON file, `records.index.json`, beside the files of each directory, written once by
`executor index FILES...` (`write_index`), never rebuilt on restart. It holds each file's record count and size;
a file whose size changed since it was indexed is refused, naming it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf

from programs.core.data import per_replica_batch, stream_pipelines
from programs.core.errors import ConfigError
from programs.core.op_errors import op_message
from programs.core.record_damage import tag

INDEX_NAME = "records.index.json"
_INDEX_FORMAT = 1


class InputError(ConfigError):
  """A damaged, missing or unindexed input file; the message names it."""


def count_records(path: str, compression: str = "") -> int:
  """Records in one record file, read once end to end.

  Raises:
    InputError: naming `path` if it is missing or damaged.
  """
  if not tf.io.gfile.exists(path):
    raise InputError(f"{path}: no such record file")
  ds = tf.data.TFRecordDataset(path, compression_type=compression, buffer_size=1 << 20)
  try:
    return int(ds.reduce(np.int64(0), lambda n, _: n + 1))
  except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as e:
    raise InputError(f"{path}: damaged record file ({op_message(e)})") from None


def write_index(files: Sequence[str], compression: str = "") -> list[str]:
  """Counts the records of `files` and writes (or updates) the index beside them, one per directory.

  Returns:
    The index files written.
  """
  by_dir: dict[str, dict[str, Any]] = {}
  for path in files:
    directory = os.path.dirname(os.path.abspath(path))
    entries = by_dir.setdefault(directory, _read_index_file(directory))
    entries[os.path.basename(path)] = {
      "records": count_records(path, compression),
      "bytes": tf.io.gfile.stat(path).length,
    }
  written = []
  for directory, entries in by_dir.items():
    index_path = os.path.join(directory, INDEX_NAME)
    text = json.dumps({"format": _INDEX_FORMAT, "files": dict(sorted(entries.items()))}, indent=1)
    tmp = index_path + ".tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
      f.write(text)
    tf.io.gfile.rename(tmp, index_path, overwrite=True)
    written.append(index_path)
  return written


def _read_index_file(directory: str) -> dict[str, Any]:
  path = os.path.join(directory, INDEX_NAME)
  if not tf.io.gfile.exists(path):
    return {}
  damaged = f"{path}: damaged record index; rebuild it with `executor index FILES...`"
  try:
    with tf.io.gfile.GFile(path) as f:
      entries = dict(json.load(f)["files"])
  except (ValueError, KeyError, TypeError, tf.errors.OpError):
    raise InputError(damaged) from None
  for name, entry in entries.items():
    counts = [entry.get(key) for key in ("records", "bytes")] if isinstance(entry, dict) else [None]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
      raise InputError(f"{damaged} (entry '{name}': {entry!r})")
  return entries


def record_counts(files: Sequence[str]) -> list[int]:
  """Each file's record count, from the index beside it (never by reading the files).

  Raises:
    InputError: naming the first file that is missing, unindexed, or changed since it was indexed.
  """
  indexes: dict[str, dict[str, Any]] = {}
  counts = []
  for path in files:
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in indexes:
      indexes[directory] = _read_index_file(directory)
    entry = indexes[directory].get(os.path.basename(path))
    if not tf.io.gfile.exists(path):
      raise InputError(f"{path}: no such record file")
    if entry is None:
      raise InputError(
        f"{path}: not in {os.path.join(directory, INDEX_NAME)}; run `executor index FILES...` once"
      )
    if tf.io.gfile.stat(path).length != entry["bytes"]:
      raise InputError(f"{path}: changed since it was indexed; run `executor index FILES...` again")
    counts.append(int(entry["records"]))
  return counts


class RecordFiles(NamedTuple):
  """Indexed record files and the `parse` of a batch of their serialized records (a `KerasTask` data source)."""

  files: Sequence[str]
  parse: Callable[[tf.Tensor], Any]


class StartPlan(NamedTuple):
  """Where an epoch's reading starts: what a restart costs, in records and files."""

  files: tf.Tensor  # The files still to open this epoch, in order.
  skip: tf.Tensor  # Records of the first of them read and dropped before the first block (< its count).


def _permutation(n, seed: int, epoch, salt) -> tf.Tensor:
  """A stateless random permutation of `range(n)` for `(seed, epoch, salt)`."""
  n = tf.cast(n, tf.int64)
  seeds = tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64), tf.cast(salt, tf.int64)])
  return tf.raw_ops.RandomIndexShuffle(index=tf.range(n), seed=seeds, max_index=n - 1, rounds=4)


def start_plan(files: Sequence[str], counts: Sequence[int], seed: int, epoch, first_record) -> StartPlan:
  """The files to read, and the records to drop, to start an epoch at `first_record` (a block start)."""
  order = _permutation(len(files), seed, epoch, 0)
  ordered_files = tf.gather(tf.constant(list(files)), order)
  ordered_counts = tf.gather(tf.constant(list(counts), tf.int64), order)
  ends = tf.cumsum(ordered_counts)
  first = tf.searchsorted(ends, tf.reshape(tf.cast(first_record, tf.int64), [1]), side="right")[0]
  skip = tf.cast(first_record, tf.int64) - (ends[first] - ordered_counts[first])
  return StartPlan(ordered_files[first:], skip)


class _Layout:
  """An epoch cut into lanes read side by side, and blocks taking `lane_block` records of each lane."""

  def __init__(self, per_epoch: int, block_size: int, lanes: int):
    self.per_epoch = per_epoch
    self.lanes = max(1, min(lanes, per_epoch))
    self.lane_block = max(1, block_size // self.lanes)
    self.bounds = [c * per_epoch // self.lanes for c in range(self.lanes + 1)]
    self.lengths = [hi - lo for lo, hi in zip(self.bounds, self.bounds[1:], strict=False)]
    self.blocks_per_epoch = -(-max(self.lengths) // self.lane_block)

  def locate(self, position: int) -> tuple[int, int, int]:
    """(epoch, block, offset in the block) of a stream position; O(1)."""
    epoch, position = divmod(position, self.per_epoch)
    full = self.lanes * self.lane_block  # Blocks are full until the shortest lane runs out.
    block = min(position // full, min(self.lengths) // self.lane_block)
    position -= block * full
    while True:  # At most two blocks past the full ones (lane lengths differ by at most one).
      size = sum(min(max(n - block * self.lane_block, 0), self.lane_block) for n in self.lengths)
      if position < size:
        return epoch, block, position
      position -= size
      block += 1

  def lane_starts(self, block):
    """Per lane: (the epoch record its reading starts at, the records it has left, from `block` on)."""
    starts = []
    for lo, hi in zip(self.bounds, self.bounds[1:], strict=False):
      begin = lo + block * self.lane_block
      starts.append((tf.minimum(begin, hi - 1), tf.maximum(hi - begin, 0)))
    return starts


def resume_reads(
  files: Sequence[str], start_example: int, seed: int = 0, block_size: int = 4096, lanes: int = 8
) -> int:
  """Records `record_dataset` reads and drops to open at `start_example`: what a restart costs.

  At most one file per lane plus one block, whatever the position (the constant-time claim, counted).
  """
  counts = record_counts(files)
  layout = _Layout(sum(counts), block_size, lanes)
  epoch, block, offset = layout.locate(start_example)
  skips = [start_plan(files, counts, seed, epoch, begin).skip for begin, _ in layout.lane_starts(block)]
  return int(sum(int(s) for s in skips)) + offset


def record_dataset(
  files: Sequence[str],
  parse: Callable[[tf.Tensor], Any],
  input_context: tf.distribute.InputContext,
  global_batch_size: int,
  train: bool,
  seed: int = 0,
  start_example: int = 0,
  block_size: int = 4096,
  lanes: int = 8,
  compression: str = "",
) -> tf.data.Dataset:
  """Per-replica batches of record files for one input pipeline, resumable at any example in O(one file).

  Args:
    files: Record files (TFRecord), indexed once with `executor index FILES...`.
    parse: Batch of serialized records (string [batch]) -> the batch's features, e.g. with `tf.io.parse_example`.
    input_context: The pipeline's context. With several pipelines, pipeline p reads files p, p + W, ...: the
      train split is one stream per pipeline of the run that started it. A run resumed on another count
      (`StreamInputContext.stream_pipelines`) reads on in the same order: global example g is record g // S of
      stream g % S (S streams), and pipeline p of W reads the examples g = p, p + W, ... of that order.
    global_batch_size: Examples per step over all replicas.
    train: True: endless, a new file order and block shuffle every epoch, whole batches, starting at
      `start_example`. False: one pass in file order (a partial last batch included).
    seed: Seed of the file orders and block shuffles.
    start_example: Examples of this pipeline's stream already read (train only).
    block_size: Records shuffled together (the quality of the shuffle; also the most a restart reads and
      drops inside the block).
    lanes: The epoch's stream is cut into `lanes` equal parts read side by side; a block takes
      `block_size // lanes` consecutive records of each, so it mixes records from all over the epoch.
    compression: The files' compression ("", "GZIP" or "ZLIB").

  Returns:
    The pipeline's dataset.

  Raises:
    InputError: naming a file that is missing, unindexed or changed since it was indexed, or files with no records.
    ConfigError: a per-replica batch of no examples.
  """
  pipelines, pipeline = input_context.num_input_pipelines, input_context.input_pipeline_id
  streams = stream_pipelines(input_context) if train else pipelines
  if not files:
    raise InputError("record_dataset: no record files given")
  if len(files) < streams:
    raise InputError(
      f"record_dataset: {len(files)} record file(s) for {streams} input pipelines; need one each"
    )
  files = list(files)
  counts = record_counts(files)
  batch = per_replica_batch("record_dataset", input_context, global_batch_size)
  if not train:
    files = files[pipeline::pipelines]
    _check_not_empty(files, counts[pipeline::pipelines])
    ds = tf.data.TFRecordDataset(files, compression_type=compression, buffer_size=1 << 20)
    ds = ds.batch(batch).map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)
    return tag(ds, files, compression)

  def blocks(stream: int, start: int) -> tf.data.Dataset:
    return _blocks(
      files[stream::streams], counts[stream::streams], seed, start, block_size, lanes, compression
    )

  if streams == pipelines:  # Each pipeline reads its own stream, a block at a time.
    read = files[pipeline::streams]
    ds = blocks(pipeline, start_example).rebatch(batch, drop_remainder=True)
  else:  # Each pipeline takes its examples of the streams, a record at a time.
    order, firsts, stride = _share(streams, pipelines, pipeline, start_example)
    records = []
    for stream in sorted(firsts):
      one = blocks(stream, firsts[stream]).unbatch()
      records.append(one.batch(stride).map(lambda r: r[0]) if stride > 1 else one)
    choice = tf.data.Dataset.from_tensor_slices(
      tf.constant([sorted(firsts).index(s) for s in order], tf.int64)
    )
    ds = tf.data.Dataset.choose_from_datasets(records, choice.repeat()).batch(batch, drop_remainder=True)
    read = [f for s in sorted(firsts) for f in files[s::streams]]
  ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)
  return tag(ds, read, compression)


def _check_not_empty(files: Sequence[str], counts: Sequence[int]) -> None:
  if sum(counts) == 0:
    raise InputError(
      f"record_dataset: the split is empty: its record files hold no records ({files[0]}, ...)"
    )


def _share(streams: int, pipelines: int, pipeline: int, start: int) -> tuple[list[int], dict[int, int], int]:
  """Where pipeline `pipeline` of `pipelines` finds its examples g = p + W * (start + i) in `streams` streams.

  Global example g is record g // S of stream g % S. Returns the streams of one period of its examples, in
  order (each once), the first record each is read from, and the records between two that it reads.
  """
  common = math.gcd(streams, pipelines)
  order, firsts = [], {}
  for i in range(streams // common):
    g = pipeline + pipelines * (start + i)
    order.append(g % streams)
    firsts[g % streams] = g // streams
  return order, firsts, pipelines // common


def _blocks(
  files: Sequence[str],
  counts: Sequence[int],
  seed: int,
  start_example: int,
  block_size: int,
  lanes: int,
  compression: str,
) -> tf.data.Dataset:
  """One stream's shuffled blocks (string vectors of records), endless, from its record `start_example` on."""
  _check_not_empty(files, counts)
  layout = _Layout(sum(counts), block_size, lanes)
  first_epoch, first_block, first_offset = layout.locate(start_example)

  def epoch_blocks(epoch):
    """The epoch's blocks, shuffled; the first epoch starts at the block (and record) of `start_example`."""
    is_first = tf.equal(epoch, first_epoch)
    block0 = tf.where(is_first, tf.constant(first_block, tf.int64), 0)
    offset = tf.where(is_first, tf.constant(first_offset, tf.int64), 0)
    parts = []
    for begin, left in layout.lane_starts(block0):
      plan = start_plan(files, counts, seed, epoch, begin)
      records = tf.data.TFRecordDataset(plan.files, compression_type=compression, buffer_size=1 << 18)
      lane = records.skip(plan.skip).take(left).batch(layout.lane_block)
      parts.append(lane.concatenate(tf.data.Dataset.from_tensors(tf.constant([], tf.string)).repeat()))
    blocks = tf.data.Dataset.zip((*parts, tf.data.Dataset.counter(block0))).take(
      layout.blocks_per_epoch - block0
    )

    def shuffle(*lanes_and_index):
      block, index = tf.concat(lanes_and_index[:-1], 0), lanes_and_index[-1]
      shuffled = tf.gather(block, _permutation(tf.size(block), seed, epoch, index + 1))
      return shuffled[tf.where(tf.equal(index, block0), offset, 0) :]

    return blocks.map(shuffle)

  return tf.data.Dataset.counter(first_epoch).flat_map(epoch_blocks)


def write_array_records(
  arrays: Mapping[str, np.ndarray], directory: str, shards: int, name: str = "train"
) -> list[str]:
  """Writes `{name: array[n, ...]}` as `shards` TFRecord files of `tf.train.Example`s and indexes them.

  Example i goes to shard `i * shards // n` (file order = example order). Floats are stored as float32, integers
  as int64; read them back with `array_parser(arrays)`.

  Returns:
    The files, `<directory>/<name>-<shard>-of-<shards>.tfrecord`.
  """
  n = len(next(iter(arrays.values())))
  tf.io.gfile.makedirs(directory)
  files = []
  for shard in range(shards):
    path = os.path.join(directory, f"{name}-{shard:05d}-of-{shards:05d}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
      for i in range(shard * n // shards, (shard + 1) * n // shards):
        writer.write(_example({k: v[i] for k, v in arrays.items()}))
    files.append(path)
  write_index(files)
  return files


def _example(row: Mapping[str, np.ndarray]) -> bytes:
  feature = {}
  for key, value in row.items():
    flat = np.asarray(value).reshape(-1)
    if np.issubdtype(flat.dtype, np.floating):
      feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=flat))
    else:
      feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=flat))
  return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def array_parser(arrays: Mapping[str, np.ndarray]) -> Callable[[tf.Tensor], dict[str, tf.Tensor]]:
  """The `parse` of records written by `write_array_records(arrays, ...)`: back to the arrays' dtypes."""
  spec = {}
  for key, value in arrays.items():
    dtype = tf.float32 if np.issubdtype(value.dtype, np.floating) else tf.int64
    spec[key] = (tf.io.FixedLenFeature(value.shape[1:], dtype), tf.as_dtype(value.dtype))

  def parse(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    features = tf.io.parse_example(serialized, {k: f for k, (f, _) in spec.items()})
    return {k: tf.cast(features[k], dtype) for k, (_, dtype) in spec.items()}

  return parse
