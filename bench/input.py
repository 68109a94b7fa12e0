"""Input pipelines: throughput vs their plain tf.data counterparts, shuffle quality, and restart cost.

Usage: python bench/input.py [--repeats=N] [--batches=N]

Printed in one run (medians of `--repeats`, each pipeline measured alternately with its counterpart):
- `array_dataset` vs `from_tensor_slices(arrays).shuffle(n).repeat().batch()` on quickstart-sized arrays;
- `record_dataset` vs `interleave(TFRecordDataset).shuffle(4096).map(parse).batch().prefetch()` on 16
  TFRecord shards of `tf.train.Example`s written here;
- shuffle quality: the mean |id difference| of consecutive examples over an epoch, divided by its value under a
  global shuffle (n/3): 1.0 is as good as a global shuffle, 0.0 is file order;
- restart cost of each resumable pipeline at steps 0, 1e4 and 1e6 (batch 64): seconds to build the dataset and
  read its first batch, and the records the restart reads and drops (`resume_reads`).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import argparse  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from programs.core.data import array_dataset  # noqa: E402
from programs.core.records import record_dataset, resume_reads, write_index  # noqa: E402

BATCH = 64
FEATURES = {
  "x": tf.io.FixedLenFeature([32], tf.float32),
  "y": tf.io.FixedLenFeature([], tf.int64),
  "id": tf.io.FixedLenFeature([], tf.int64),
}
CTX = tf.distribute.InputContext(1, 0, 1)


def write_shards(directory: str, shards: int = 16, per_shard: int = 3999) -> list[str]:
  """`shards` TFRecord files of `tf.train.Example`s {x: float[32], y, id}; ids count from 0 in file order."""
  rng = np.random.default_rng(0)
  files, next_id = [], 0
  for s in range(shards):
    path = os.path.join(directory, f"train-{s:05d}.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
      for _ in range(per_shard):
        feature = {
          "x": tf.train.Feature(float_list=tf.train.FloatList(value=rng.random(32))),
          "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[next_id % 10])),
          "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[next_id])),
        }
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        next_id += 1
    files.append(path)
  return files


def batches_per_sec(ds: tf.data.Dataset, batches: int) -> float:
  it = iter(ds)
  for _ in range(5):
    next(it)
  start = time.perf_counter()
  for _ in range(batches):
    next(it)
  return batches / (time.perf_counter() - start)


def plain_records(files):
  ds = tf.data.Dataset.from_tensor_slices(files).repeat()
  ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=4, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.shuffle(4096).map(
    lambda r: tf.io.parse_single_example(r, FEATURES), num_parallel_calls=tf.data.AUTOTUNE
  )
  return ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)


def ours_records(files, start=0):
  parse = lambda r: tf.io.parse_example(r, FEATURES)  # noqa: E731
  return record_dataset(files, parse, CTX, BATCH, True, start_example=start)


def shuffle_quality(ds: tf.data.Dataset, n: int) -> float:
  ids = np.concatenate([b["id"].numpy() for b in ds.take(n // BATCH)])
  return float(np.mean(np.abs(np.diff(ids))) / (n / 3))


def restart_secs(make) -> float:
  start = time.perf_counter()
  next(iter(make()))
  return time.perf_counter() - start


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--batches", type=int, default=400)
  args = parser.parse_args()
  print(f"tf {tf.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

  n = 60000
  rng = np.random.default_rng(0)
  arrays = {"x": rng.random((n, 32), np.float32), "y": rng.integers(0, 10, n)}
  ours, plain = [], []
  for _ in range(args.repeats):
    ours.append(batches_per_sec(array_dataset(arrays, CTX, BATCH, True), args.batches))
    plain.append(
      batches_per_sec(
        tf.data.Dataset.from_tensor_slices(arrays).shuffle(n).repeat().batch(BATCH).prefetch(-1), args.batches
      )
    )
  ratios = [a / b for a, b in zip(ours, plain, strict=True)]
  print(
    f"array_dataset   {np.median(ours):8.0f} batches/s  plain {np.median(plain):8.0f}  "
    f"ratio {np.median(ratios):.2f} (median of {args.repeats})"
  )

  with tempfile.TemporaryDirectory() as directory:
    files = write_shards(directory)
    write_index(files)
    total = 16 * 3999
    ours, plain = [], []
    for _ in range(args.repeats):
      ours.append(batches_per_sec(ours_records(files), args.batches))
      plain.append(batches_per_sec(plain_records(files), args.batches))
    ratios = [a / b for a, b in zip(ours, plain, strict=True)]
    print(
      f"record_dataset  {np.median(ours):8.0f} batches/s  plain {np.median(plain):8.0f}  "
      f"ratio {np.median(ratios):.2f} (median of {args.repeats})"
    )
    print(
      f"shuffle quality (1.0 = global shuffle): record_dataset {shuffle_quality(ours_records(files), total):.2f}"
      f"  plain interleave+shuffle(4096) {shuffle_quality(plain_records(files), total):.2f}"
    )

    print("restart: seconds to build the dataset and read the first batch (median), records read and dropped")
    for steps in (0, 10**4, 10**6):
      start = steps * BATCH
      rec = np.median([restart_secs(lambda s=start: ours_records(files, s)) for _ in range(args.repeats)])
      arr = np.median(
        [restart_secs(lambda s=start: array_dataset(arrays, CTX, BATCH, True, 0, s)) for _ in range(3)]
      )
      skip = resume_reads(files, start)
      print(
        f"  step {steps:>9,}: record_dataset {rec:.3f} s (reads and drops {skip} records)  array_dataset {arr:.3f} s"
      )


if __name__ == "__main__":
  main()
