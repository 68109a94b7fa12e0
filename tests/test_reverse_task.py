"""The digit-reversal example task: data, post-processing, and a short real run."""

import json

import gin
import numpy as np
import pytest
import tensorflow as tf
from conftest import read_scalars

from executor.tasks.reverse import BOS_ID, EOS_ID, FIRST_DIGIT_ID, PAD_ID, DigitReversal, make_reverse_data


@pytest.fixture
def fresh_gin():
  """The executor reads gin's global config: start and end each run with an empty one."""
  gin.clear_config()
  yield
  gin.clear_config()


def _ids(digits: str, length: int, end: bool) -> list[int]:
  ids = [FIRST_DIGIT_ID + int(d) for d in digits] + ([EOS_ID] if end else [])
  return ids + [PAD_ID] * (length - len(ids))


def test_make_reverse_data_targets_are_reversed_sources():
  source, target = make_reverse_data(200, 3, 8, seed=5)
  assert source.shape == (200, 8) and target.shape == (200, 9)
  again_source, again_target = make_reverse_data(200, 3, 8, seed=5)
  np.testing.assert_array_equal(source, again_source)
  np.testing.assert_array_equal(target, again_target)
  for src, tgt in zip(source, target):
    length = int(np.sum(src != PAD_ID))
    assert 3 <= length <= 8
    assert np.all(src[:length] >= FIRST_DIGIT_ID) and np.all(src[length:] == PAD_ID)
    np.testing.assert_array_equal(tgt[:length], src[:length][::-1])
    assert tgt[length] == EOS_ID and np.all(tgt[length + 1 :] == PAD_ID)


def test_postprocess_decode_exact_match():
  task = DigitReversal(max_length=5)
  rows = [
    # (source, target, decoded ids, correct)
    ("123", "321", _ids("321", 6, end=True), True),
    ("4567", "7654", _ids("7650", 6, end=True), False),  # a wrong digit
    ("89", "98", _ids("98", 6, end=True), True),
    ("12345", "54321", _ids("543210", 6, end=False), False),  # never ends: too long
    ("555", "555", _ids("55", 6, end=True), False),  # ends too early
    ("000", "000", _ids("000", 6, end=False), False),  # right digits, then padding instead of the end id
  ]
  per_example = {
    "source": np.array([_ids(s, 5, end=False) for s, _, _, _ in rows], np.int32),
    "target": np.array([_ids(t, 6, end=True) for _, t, _, _ in rows], np.int32),
    "decoded": np.array([d for _, _, d, _ in rows], np.int32),
  }
  records, metrics = task.postprocess_decode(per_example)
  assert metrics == {"exact_match": pytest.approx(2 / 6)}
  assert [r["correct"] for r in records] == [c for *_, c in rows]
  assert [r["source"] for r in records] == [s for s, *_ in rows]
  assert [r["target"] for r in records] == [t for _, t, *_ in rows]
  assert records[1]["decoded"] == "7650" and records[3]["decoded"] == "543210"
  json.dumps(records)  # JSON-serialisable


def test_postprocess_decode_empty():
  task = DigitReversal()
  empty = {k: np.zeros((0, n), np.int32) for k, n in (("source", 8), ("target", 9), ("decoded", 9))}
  records, metrics = task.postprocess_decode(empty)
  assert records == [] and np.isnan(metrics["exact_match"])


def test_step_decoding_matches_teacher_forcing():
  """The one-token decoder step and the full-sequence decoder share weights and agree."""
  task = DigitReversal(max_length=6, hidden_size=16, embedding_size=8)
  task.build()
  source, target = make_reverse_data(4, 3, 6, seed=2)
  decoder_input = np.concatenate([np.full((4, 1), BOS_ID, np.int32), target[:, :-1]], axis=1)
  full = task.model((tf.constant(source), tf.constant(decoder_input))).numpy()
  outputs, keys, mask, state = task.model.encode(tf.constant(source))
  for t in range(decoder_input.shape[1]):
    logits, state = task.model.decode_step(tf.constant(decoder_input[:, t]), state, outputs, keys, mask)
    np.testing.assert_allclose(logits.numpy(), full[:, t], atol=1e-5)


def test_short_run_writes_decoder_outputs(tmp_path, fresh_gin):
  from executor.cli.main import run

  model_dir = tmp_path / "m"
  num_test = 100  # 64 + a partial batch of 36
  step = run(
    model_dir=str(model_dir),
    gin_files=["gin/reverse.gin"],
    gin_params=[
      "Executor.max_steps=20",
      "TrainProgram.steps_per_loop=10",
      "DigitReversal.hidden_size=32",
      "DigitReversal.num_train_examples=2000",
      f"DigitReversal.num_test_examples={num_test}",
    ],
  )
  assert step == 20
  path = model_dir / "decode_test" / "decoder_out_20.jsonl"
  assert path.is_file()
  records = [json.loads(line) for line in path.read_text().splitlines()]
  assert len(records) == num_test
  expected_source, _ = make_reverse_data(num_test, 3, 8, seed=1 + 1000)
  for record, source in zip(records, expected_source):
    assert set(record) == {"source", "target", "decoded", "correct"}
    assert record["source"] == "".join(str(i - FIRST_DIGIT_ID) for i in source if i != PAD_ID)
    assert record["target"] == record["source"][::-1]
    assert record["decoded"] == "" or record["decoded"].isdigit()
    assert len(record["decoded"]) <= 9
    assert isinstance(record["correct"], bool)
    if record["correct"]:
      assert record["decoded"] == record["target"]
  assert (model_dir / "decode_test" / "decoder_out_10.jsonl").is_file()
  # The summary's exact match is the fraction of records marked correct.
  exact_match = dict(read_scalars(model_dir / "decode_test")["exact_match"])
  assert exact_match[20] == pytest.approx(np.mean([r["correct"] for r in records]))
