"""Writes the LM's train windows as indexed TFRecord shards: prepare once, train many times.

Usage: python -m executor.tasks.lm.prepare DIR [--sequence_length=128] [--shards=16] [--stdlib_dir=PATH]

Then train with `--gin_param="TransformerLM.train_files='DIR/train-*.tfrecord'"` (and the same
`TransformerLM.sequence_length`): the run reads the shards with `record_dataset` instead of packing the corpus
in memory at start-up, and resumes at any step in constant time. Each window is one `tf.train.Example` with an
int64 feature `windows` of `sequence_length + 1` token ids; `records.index.json` is written beside the shards.
"""

from __future__ import annotations

import argparse

from executor.tasks.lm.task import TransformerLM
from programs.core.records import write_array_records


def prepare(
  directory: str, sequence_length: int = 128, shards: int = 16, stdlib_dir: str | None = None
) -> list:
  """Packs the train split into windows and writes them to `shards` indexed files; returns the files."""
  task = TransformerLM(
    sequence_length=sequence_length, max_length=max(512, sequence_length), stdlib_dir=stdlib_dir
  )
  return write_array_records({"windows": task.windows("train")}, directory, shards)


def main() -> None:
  """The command line (see the module docstring)."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("directory")
  parser.add_argument("--sequence_length", type=int, default=128)
  parser.add_argument("--shards", type=int, default=16)
  parser.add_argument("--stdlib_dir", default=None)
  args = parser.parse_args()
  files = prepare(args.directory, args.sequence_length, args.shards, args.stdlib_dir)
  print(f"wrote {len(files)} shards and their index to {args.directory}")


if __name__ == "__main__":
  main()
