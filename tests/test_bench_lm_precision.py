"""bench/lm_precision.py runs gin/lm.gin per precision and reads the held-out loss back from the event files."""

import os
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.slow
def test_a_short_comparison_prints_a_row_per_precision_and_the_ratio():
  env = dict(os.environ, PYTHONPATH=str(REPO))
  proc = subprocess.run(
    [sys.executable, str(REPO / "bench" / "lm_precision.py"), "--seeds=0", "--max_steps=3"],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("   0  ")]
  assert [r[1] for r in rows] == ["float32", "mixed_bfloat16"]
  losses = [float(r[2]) for r in rows]
  # Three steps from the same seeded weights: near the untrained loss (ln 258 = 5.55), and close across precisions.
  assert all(3.0 < x < 6.0 for x in losses), losses
  assert abs(losses[1] / losses[0] - 1) < 0.02
  assert proc.stdout.splitlines()[-1].startswith("mixed_bfloat16/float32: median=")
