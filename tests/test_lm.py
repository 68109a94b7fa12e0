"""The Transformer LM task: real stdlib text, packing, padding-free metrics, cached decoding, sampling."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, read_scalars, ready_programs

from executor.tasks.lm import (
  BOS_ID,
  BYTE_OFFSET,
  DEFAULT_PROMPTS,
  PAD_ID,
  TransformerLM,
  decode,
  encode,
  generate,
  is_held_out,
  make_windows,
  pack_features,
  sampler,
  stdlib_files,
  stdlib_root,
)
from programs.core.errors import ConfigError
from programs.decode import DecodeProgram
from programs.eval import EvalProgram

TINY = dict(
  model_dim=32, num_heads=2, num_layers=2, mlp_dim=64, sequence_length=32, max_length=96, num_decode_tokens=40
)
TINY_GIN = [
  "TransformerLM.model_dim=32",
  "TransformerLM.num_heads=2",
  "TransformerLM.num_layers=1",
  "TransformerLM.mlp_dim=64",
  "TransformerLM.sequence_length=64",
  "TransformerLM.max_length=128",
  "TransformerLM.num_eval_sequences=32",
  "TransformerLM.num_decode_tokens=16",
  "TransformerLM.global_batch_size=16",
]


def _tiny_task(**kwargs):
  keras.utils.set_random_seed(0)
  task = TransformerLM(**{**TINY, **kwargs})
  task.build()
  return task


def test_stdlib_split_is_by_file_and_deterministic():
  root = stdlib_root()
  files = stdlib_files(root)
  assert files == stdlib_files(root) and "os.py" in files
  assert not any("site-packages" in f or "/test/" in f for f in files)
  held_out = [f for f in files if is_held_out(f, 10)]
  assert 0.03 < len(held_out) / len(files) < 0.2
  task = TransformerLM(**TINY)
  train, held, num_train, num_held = task.corpus()
  assert (num_train, num_held) == (len(files) - len(held_out), len(held_out))
  # Each file starts with the file-start id; the streams are whole files.
  assert np.sum(train == BOS_ID) == num_train and np.sum(held == BOS_ID) == num_held
  with open(f"{root}/{held_out[0]}", "rb") as f:
    first = f.read()
  np.testing.assert_array_equal(held[1 : 1 + len(first)], encode(first))


def test_windows_cover_the_stream_once_and_pad_the_end():
  stream = np.arange(2, 2 + 23).astype(np.uint16)
  windows = make_windows(stream, 5)
  assert windows.shape == (5, 6)
  # Targets (ids 1..) of all windows are the stream after its first id, then padding.
  targets = windows[:, 1:].reshape(-1)
  np.testing.assert_array_equal(targets[:22], stream[1:])
  assert np.all(targets[22:] == PAD_ID)
  np.testing.assert_array_equal(windows[1:, 0], windows[:-1, -1])


def test_pack_features_segments_and_positions():
  window = np.array([[5, 6, BOS_ID, 7, 8, 9, BOS_ID, 10, PAD_ID, PAD_ID, PAD_ID]], np.int32)
  f = {k: v.numpy()[0] for k, v in pack_features(tf.constant(window)).items()}
  np.testing.assert_array_equal(f["inputs"], window[0, :-1])
  np.testing.assert_array_equal(f["targets"], window[0, 1:])
  np.testing.assert_array_equal(f["segment_ids"], [1, 1, 2, 2, 2, 2, 3, 3, 0, 0])
  np.testing.assert_array_equal(f["positions"], [0, 1, 0, 1, 2, 3, 0, 1, 0, 0])


def test_decode_text_stops_at_end_of_file():
  ids = list(encode("héllo".encode()))
  assert decode(ids + [BOS_ID] + ids) == "héllo"
  assert decode(ids + [PAD_ID]) == "héllo"
  assert decode([BYTE_OFFSET + 0xFF]) == "\ufffd"


def test_sequence_length_above_the_model_maximum_is_a_config_error(tmp_path):
  with pytest.raises(
    ConfigError, match=r"TransformerLM.sequence_length = 600 .* TransformerLM.max_length = 512"
  ):
    TransformerLM(sequence_length=600)
  with pytest.raises(ConfigError, match=r"TransformerLM.num_decode_tokens"):
    TransformerLM(sequence_length=64, max_length=64, num_decode_tokens=64)
  with pytest.raises(ConfigError, match=r"TransformerLM.prompts: 'x{40}' is 40 bytes"):
    TransformerLM(prompts=["x" * 40])
  from executor.cli.main import run

  model_dir = tmp_path / "m"
  with pytest.raises(
    ConfigError, match=r"TransformerLM.sequence_length = 300 .* TransformerLM.max_length = 256"
  ):
    run(model_dir=str(model_dir), gin_files=["gin/lm.gin"], gin_params=["TransformerLM.sequence_length=300"])
  assert not model_dir.exists()


def _padding_heavy_windows(task, num, seed):
  """Windows of real stdlib ids, each keeping 1..length real tokens, then padding (about half padding)."""
  rng = np.random.default_rng(seed)
  train, _, _, _ = task.corpus()
  length = task.sequence_length + 1
  out = np.full([num, length], PAD_ID, np.int32)
  for i in range(num):
    start = rng.integers(0, len(train) - length)
    keep = rng.integers(2, length + 1)
    out[i, :keep] = train[start : start + keep]
  return out


def test_eval_metrics_ignore_padding_and_equal_numpy(tmp_path):
  class PaddedEval(TransformerLM):
    def dataset(self, split, input_context):
      if split != "eval":
        return super().dataset(split, input_context)
      ds = tf.data.Dataset.from_tensor_slices(self.padded)
      return ds.batch(input_context.get_per_replica_batch_size(self.global_batch_size)).map(pack_features)

  keras.utils.set_random_seed(0)
  task = PaddedEval(**TINY, global_batch_size=8)
  task.padded = _padding_heavy_windows(task, 20, seed=3)  # 8 + 8 + a partial batch of 4
  program = EvalProgram(task, split="eval", steps_per_loop=2)
  ready_programs(task, [program], tmp_path)
  metrics = program.run().metrics
  program.close()
  assert np.mean(task.padded[:, 1:] == PAD_ID) > 0.3

  sums = {"loss": 0.0, "token_accuracy": 0.0}
  total = 0
  for start in range(0, 20, 8):
    f = {k: v.numpy() for k, v in pack_features(tf.constant(task.padded[start : start + 8])).items()}
    logits = task.model(f["inputs"], f["segment_ids"], f["positions"]).numpy().astype(np.float64)
    real = f["targets"] != PAD_ID
    top = logits.max(-1, keepdims=True)
    log_probs = logits - top - np.log(np.sum(np.exp(logits - top), -1, keepdims=True))
    token_loss = -np.take_along_axis(log_probs, f["targets"][..., None], -1)[..., 0]
    n = real.sum()
    sums["loss"] += token_loss[real].sum()
    sums["token_accuracy"] += (logits.argmax(-1) == f["targets"])[real].sum()
    total += n
    # Padding does not change what real tokens see: each row's real part alone gives the same logits.
    row = int(np.argmax(real.sum(1) < real.shape[1] - 5))
    keep = int(np.sum(f["inputs"][row] != PAD_ID))
    alone = task.model(f["inputs"][row : row + 1, :keep]).numpy()
    np.testing.assert_allclose(alone[0], logits[row, :keep], atol=2e-4)
  for k in sums:
    assert metrics[k] == pytest.approx(sums[k] / total, rel=1e-5), k
  assert metrics["perplexity"] == pytest.approx(np.exp(sums["loss"] / total), rel=1e-5)


def _prompts(task, texts):
  task.prompts = tuple(texts)
  prompts, lengths = task.prompt_arrays()
  return tf.constant(prompts), tf.constant(lengths)


def test_cached_decode_equals_uncached_and_the_reference(tmp_path):
  task = _tiny_task(num_decode_tokens=40)
  prompts, lengths = _prompts(task, ["import os\n", "def f(x):", "", "class A(object):\n    def "])
  greedy = tf.constant([True, True, False, False, True, False, True, False])
  outputs = {}
  for cache in (True, False):
    task.generator.reset_from_seed(7)
    fn = tf.function(
      lambda p, n, c=cache: generate(
        task.model, p, n, 40, sampler(task.generator, greedy, temperature=1.0, top_k=20), cache=c
      )
    )
    outputs[cache] = fn(tf.tile(prompts, [2, 1]), tf.tile(lengths, [2])).numpy()
  np.testing.assert_array_equal(outputs[True], outputs[False])
  assert outputs[True].shape == (8, 40)
  # The greedy rows equal a plain reference: the argmax of the whole sequence's last logits, token by token.
  for row in (0, 1):
    seq = list(prompts[row, : lengths[row]].numpy())
    for _ in range(40):
      logits = task.model(tf.constant([seq])).numpy()[0, -1]
      logits[PAD_ID] = -np.inf
      seq.append(int(np.argmax(logits)))
      if seq[-1] == BOS_ID:
        break
    got = list(outputs[True][row])
    assert got[: len(seq) - int(lengths[row])] == seq[int(lengths[row]) :]


def _decode_once(program):
  result = program.run()
  program.wait()
  return result.per_example


def test_sampling_is_reproducible_from_seed_and_checkpoint(tmp_path):
  def decoder(seed, name):
    task = _tiny_task(seed=seed, num_samples=2, num_decode_tokens=24, global_batch_size=8)
    program = DecodeProgram(task, split="decode", name=name)
    ready_programs(task, [program], tmp_path / name)
    return task, program

  task, program = decoder(1, "a")
  first = _decode_once(program)
  ckpt = tf.train.Checkpoint(**task.checkpoint_items())
  path = ckpt.write(str(tmp_path / "ckpt"))
  second = _decode_once(program)
  assert first["samples"].shape == (len(DEFAULT_PROMPTS), 2, 24)
  # The generator moves on: the next decode samples other continuations; greedy ones stay.
  assert not np.array_equal(first["samples"], second["samples"])
  np.testing.assert_array_equal(first["greedy"], second["greedy"])
  program.close()

  again, again_program = decoder(1, "b")
  np.testing.assert_array_equal(_decode_once(again_program)["samples"], first["samples"])
  tf.train.Checkpoint(**again.checkpoint_items()).read(path).assert_consumed()
  np.testing.assert_array_equal(_decode_once(again_program)["samples"], second["samples"])
  again_program.close()

  _, other_program = decoder(2, "c")
  other = _decode_once(other_program)
  assert not np.array_equal(other["samples"], first["samples"])
  np.testing.assert_array_equal(other["greedy"], first["greedy"])
  other_program.close()


def test_short_run_loss_falls_and_writes_continuations(tmp_path):
  from executor.cli.main import run

  model_dir = tmp_path / "m"
  step = run(
    model_dir=str(model_dir),
    gin_files=["gin/lm.gin"],
    gin_params=[*TINY_GIN, "Executor.max_steps=60", "TrainProgram.steps_per_loop=20"],
  )
  assert step == 60
  loss = [v for _, v in read_scalars(model_dir / "train")["loss"]]
  assert loss[-1] < loss[0] - 1.0, loss
  eval_scalars = read_scalars(model_dir / "eval_eval")
  perplexity = [v for _, v in eval_scalars["perplexity"]]
  assert perplexity[-1] < perplexity[0] < 258, perplexity
  records = [
    json.loads(x) for x in (model_dir / "decode_decode" / "decoder_out_40.jsonl").read_text().splitlines()
  ]
  assert [r["prompt"] for r in records] == list(DEFAULT_PROMPTS)
  for r in records:
    assert isinstance(r["greedy"], str) and len(r["greedy"].encode()) <= 16 * 3
    assert len(r["samples"]) == 1 and isinstance(r["samples"][0], str)


def test_jit_compiled_train_step(tmp_path):
  from executor.cli.main import run

  model_dir = tmp_path / "m"
  step = run(
    model_dir=str(model_dir),
    gin_files=["gin/lm.gin"],
    gin_params=[
      *TINY_GIN,
      "Executor.max_steps=40",
      "TrainProgram.steps_per_loop=20",
      "TrainProgram.jit_compile=True",
      "SimpleProgramSchedule.eval_programs=[@EvalProgram]",
    ],
  )
  assert step == 40
  loss = [v for _, v in read_scalars(model_dir / "train")["loss"]]
  assert np.all(np.isfinite(loss)) and loss[-1] < loss[0], loss


def test_the_lm_reads_prepared_shards_each_epoch_a_permutation_of_its_windows(tmp_path):
  from executor.tasks.lm.prepare import prepare

  corpus = str(REPO / "executor")  # A small corpus: the package's own sources.
  files = prepare(str(tmp_path / "shards"), sequence_length=32, shards=3, stdlib_dir=corpus)
  task = TransformerLM(**TINY, stdlib_dir=corpus, train_files=str(tmp_path / "shards" / "train-*.tfrecord"))
  windows = task.windows("train")
  n = len(windows)
  assert len(files) == 3 and n > 8
  batch = task.global_batch_size
  ds = task.dataset("train", tf.distribute.InputContext(), start_example=0)
  seen = np.concatenate([b["inputs"].numpy() for b in ds.take(-(-n // batch))])[
    :n
  ]  # One epoch of the stream.
  assert sorted(map(tuple, seen.tolist())) == sorted(map(tuple, windows[:, :-1].tolist()))
  assert not np.array_equal(seen, windows[:, :-1])  # Shuffled.
  with pytest.raises(ConfigError, match="holds windows of 32 tokens, not TransformerLM.sequence_length = 16"):
    TransformerLM(**{**TINY, "sequence_length": 16}, stdlib_dir=corpus, train_files=files[0]).dataset(
      "train", tf.distribute.InputContext()
    )
