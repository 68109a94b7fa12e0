"""The digits residual-CNN task: split, on-device augmentation, eval against numpy, top-k decoding."""

import json
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, read_scalars, ready_programs

from executor.tasks.images import DigitsClassifier, crop, load_digits_split
from programs.decode import DecodeProgram
from programs.eval import EvalProgram
from programs.train import TrainProgram

TINY = dict(widths=(8, 16), blocks_per_stage=1, global_batch_size=16)


def _task(**kwargs):
  keras.utils.set_random_seed(0)
  return DigitsClassifier(**{**TINY, **kwargs})


def test_split_is_deterministic_and_disjoint():
  (train_x, train_y, train_i), (test_x, test_y, test_i) = load_digits_split(0.2, seed=1)
  (_, _, again_i), _ = load_digits_split(0.2, seed=1)
  np.testing.assert_array_equal(train_i, again_i)
  assert len(train_i) + len(test_i) == 1797 and len(test_i) == 359
  assert not set(train_i) & set(test_i)
  assert train_x.shape == (1438, 8, 8, 1) and 0.0 <= train_x.min() and train_x.max() <= 1.0
  assert set(test_y) == set(range(10))


def test_crop_equals_numpy():
  rng = np.random.default_rng(0)
  images = rng.random((5, 8, 8, 1)).astype(np.float32)
  offsets = rng.integers(0, 5, size=(5, 2)).astype(np.int32)
  got = crop(tf.constant(images), tf.constant(offsets), 2).numpy()
  padded = np.pad(images, [(0, 0), (2, 2), (2, 2), (0, 0)])
  for i, (r, c) in enumerate(offsets):
    np.testing.assert_array_equal(got[i], padded[i, r : r + 8, c : c + 8])


@pytest.mark.parametrize("jit", [False, True])
def test_augmentation_runs_on_device_and_differs_per_step(tmp_path, jit):
  task = _task(crop_padding=2)
  train = TrainProgram(task, steps_per_loop=4, jit_compile=jit)
  ready_programs(task, [train], tmp_path)
  first = train.run().per_example["crop_offset"]
  assert first.shape == (4 * 16, 2) and first.min() >= 0 and first.max() <= 4
  steps = first.reshape(4, 16, 2)
  # Different images of a step and the same image slot in different steps get different crops.
  assert len({tuple(map(tuple, s)) for s in steps}) == 4
  assert all(len({tuple(o) for o in s}) > 1 for s in steps)
  # The offsets come from the checkpointed generator: a restore replays them.
  path = tf.train.Checkpoint(generator=task.generator).write(str(tmp_path / "ckpt"))
  second = train.run().per_example["crop_offset"]
  assert not np.array_equal(first, second)
  tf.train.Checkpoint(generator=task.generator).read(path).assert_consumed()
  np.testing.assert_array_equal(train.run().per_example["crop_offset"], second)
  assert np.isfinite(train.run().metrics["loss"])
  train.close()


def test_eval_accuracy_equals_numpy_and_decode_writes_top_k(tmp_path):
  task = _task(top_k=3, optimizer_fn=lambda: keras.optimizers.Adam(0.005))
  train = TrainProgram(task, steps_per_loop=80)
  evaluate = EvalProgram(task, split="test", steps_per_loop=7)  # 359 = 22 * 16 + a partial batch of 7
  decode = DecodeProgram(task, split="test", async_postprocess=False)
  ready_programs(task, [train, evaluate, decode], tmp_path)
  train.run()
  metrics = evaluate.run().metrics
  _, (test_x, test_y, test_i) = task.data()
  logits = task.model(test_x).numpy().astype(np.float64)
  top = logits.max(-1, keepdims=True)
  log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
  accuracy = np.mean(logits.argmax(-1) == test_y)
  assert (
    0.2 < accuracy < 1.0
  )  # trained a little: neither chance nor perfect, so the comparison means something
  assert metrics["accuracy"] == pytest.approx(accuracy, abs=1e-6)
  assert metrics["loss"] == pytest.approx(-np.mean(log_probs[np.arange(len(test_y)), test_y]), rel=1e-5)

  decode.run()
  records = [json.loads(x) for x in open(decode.output_path(80)).read().splitlines()]
  assert [r["index"] for r in records] == test_i.tolist()
  for r, row in zip(records, log_probs):
    assert [c["class"] for c in r["top_k"]] == list(np.argsort(-row)[:3])
    probs = [c["probability"] for c in r["top_k"]]
    assert probs == sorted(probs, reverse=True)
    np.testing.assert_allclose(probs, np.exp(np.sort(row)[::-1][:3]), atol=1e-5)
  assert decode.last_metrics["accuracy"] == pytest.approx(accuracy)
  assert decode.last_metrics["top_3_accuracy"] >= accuracy
  for p in (train, evaluate, decode):
    p.close()


def test_missing_scikit_learn_is_a_config_error_naming_the_extra():
  code = (
    "import sys; sys.modules['sklearn'] = None\n"
    "from programs.core.errors import ConfigError\n"
    "from executor.tasks.images import DigitsClassifier\n"
    "try:\n  DigitsClassifier()\nexcept ConfigError as e:\n  print(e)\n"
  )
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert "DigitsClassifier needs scikit-learn" in out.stdout and "tf-executor[images]" in out.stdout, out


def test_short_jit_compiled_run_learns(tmp_path):
  from executor.cli.main import run

  model_dir = tmp_path / "m"
  step = run(
    model_dir=str(model_dir),
    gin_files=["gin/images.gin"],
    deterministic=True,
    gin_params=[
      "DigitsClassifier.widths=(8, 16)",
      "Executor.max_steps=120",
      "TrainProgram.steps_per_loop=60",
      "TrainProgram.jit_compile=True",
    ],
  )
  assert step == 120
  loss = [v for _, v in read_scalars(model_dir / "train")["loss"]]
  assert loss[-1] < loss[0], loss
  accuracy = dict(read_scalars(model_dir / "eval_test")["accuracy"])
  assert accuracy[120] > 0.5, accuracy
  assert len((model_dir / "decode_test" / "decoder_out_120.jsonl").read_text().splitlines()) == 359
