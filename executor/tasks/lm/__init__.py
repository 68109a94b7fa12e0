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

Modules: `data` (corpus, tokens, packing), `model` (the Transformer), `generate` (decoding on device), `task`
(`TransformerLM`, the gin-configurable task).
"""

from executor.tasks.lm.data import (
  BOS_ID,
  BYTE_OFFSET,
  DEFAULT_EXCLUDE_DIRS,
  DEFAULT_PROMPTS,
  PAD_ID,
  VOCAB_SIZE,
  decode,
  encode,
  encode_prompt,
  is_held_out,
  load_corpus,
  make_windows,
  pack_features,
  stdlib_files,
  stdlib_root,
)
from executor.tasks.lm.generate import generate, sampler
from executor.tasks.lm.model import DecoderBlock, DecoderOnlyTransformer
from executor.tasks.lm.task import TransformerLM

__all__ = [
  "BOS_ID",
  "BYTE_OFFSET",
  "DEFAULT_EXCLUDE_DIRS",
  "DEFAULT_PROMPTS",
  "PAD_ID",
  "VOCAB_SIZE",
  "DecoderBlock",
  "DecoderOnlyTransformer",
  "TransformerLM",
  "decode",
  "encode",
  "encode_prompt",
  "generate",
  "is_held_out",
  "load_corpus",
  "make_windows",
  "pack_features",
  "sampler",
  "stdlib_files",
  "stdlib_root",
]
