"""bench/workload.py compares fairly: limit, Keras fit and ours start from the same weights and see the same batches."""

import json
import os
import sys

import pytest
from conftest import REPO

sys.path.append(str(REPO / "bench"))

import workload  # noqa: E402

TINY = {
  "lm": workload.Spec(
    "lm",
    "tokens",
    dict(
      sequence_length=16,
      max_length=64,
      model_dim=32,
      num_heads=2,
      num_layers=1,
      mlp_dim=64,
      global_batch_size=4,
      num_decode_tokens=8,
      # A small package of the standard library as the corpus: windowing the whole library takes seconds.
      stdlib_dir=os.path.dirname(json.__file__),
    ),
  ),
  "images": workload.Spec("images", "images", dict(widths=(8,), blocks_per_stage=1, global_batch_size=8)),
}


@pytest.mark.parametrize("name", sorted(TINY))
def test_contenders_see_the_same_first_batch_loss(name, tmp_path):
  spec = TINY[name]
  live = workload.contenders(spec, 1, "float32", False, str(tmp_path))
  assert not [c for c in live.values() if isinstance(c, str)], live
  losses = {k: c.first_loss for k, c in live.items()}
  assert losses["limit"] > 0.5, losses  # an untrained classifier's cross-entropy, not a stray zero
  assert losses["keras"] == pytest.approx(losses["limit"], rel=1e-5), losses
  assert losses["ours"] == pytest.approx(losses["limit"], rel=1e-5), losses
  # The second step (after one update, on the next batch of the same persistent input) matches too: the
  # optimizers and the input order are the same. (Keras' `fit` starts a new epoch iterator per call.)
  second_limit = float(live["limit"].run_loop(1))
  second_ours = live["ours"].program.run().metrics["loss"]
  assert second_ours == pytest.approx(second_limit, rel=1e-4)
  assert second_limit != pytest.approx(losses["limit"], rel=1e-6)
  assert int(live["ours"].runtime.global_step.numpy()) == 2


def test_flops_formulas():
  lm = TINY["lm"]
  d, m, s, tokens = 32, 64, 16, 4 * 16
  params = 4 * d * d + 2 * d * m + 258 * d
  assert lm.flops_per_step() == 6 * params * tokens + 12 * s * d * tokens
  # stem 8*8*9*1*8, one block of two 8x8 3x3 convs 8->8, dense 8->10.
  assert workload.cnn_macs_per_image((8,), 1) == 8 * 8 * 9 * 8 + 2 * 8 * 8 * 9 * 8 * 8 + 8 * 10
  assert workload.cnn_macs_per_image((32, 64), 1) == (
    8 * 8 * 9 * 32 + 2 * 8 * 8 * 9 * 32 * 32 + 4 * 4 * 9 * 32 * 64 + 2 * 4 * 4 * 9 * 64 * 64 + 64 * 10
  )
