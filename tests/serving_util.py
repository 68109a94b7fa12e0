"""Serving a SavedModel as a client would: in a fresh Python process that imports TensorFlow and numpy alone, and
as `saved_model_cli show --all` lists it."""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np

# Runs in a fresh interpreter: TensorFlow and numpy only, never this package.
_SERVE = textwrap.dedent(
  """
  import json, sys
  import numpy as np
  import tensorflow as tf

  served = []
  for export, inputs in json.load(open(sys.argv[1])):
    model = tf.saved_model.load(export)
    serve = model.signatures["serving_default"]
    feed = {k: tf.constant(v) for k, v in np.load(inputs).items()}
    served.append({
      "outputs": {k: v.numpy().tolist() for k, v in serve(**feed).items()},
      "inputs": {k: str(v.dtype.name) for k, v in serve.structured_input_signature[1].items()},
      "signatures": sorted(model.signatures),
    })
  leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("executor", "programs"))
  json.dump({"served": served, "leaked": leaked}, open(sys.argv[2], "w"))
  """
)


def serve(exports, tmp_path):
  """Calls `serving_default(**inputs)` of each (export, inputs) in one fresh process with TensorFlow alone.

  Returns:
    What each call saw: its `outputs` (lists), its `inputs` ({name: dtype}) and the `signatures` of the export.
  """
  jobs = []
  for i, (export, inputs) in enumerate(exports):
    np.savez(tmp_path / f"inputs{i}.npz", **inputs)
    jobs.append([str(export), str(tmp_path / f"inputs{i}.npz")])
  (tmp_path / "jobs.json").write_text(json.dumps(jobs))
  out = tmp_path / "served.json"
  proc = subprocess.run(
    [sys.executable, "-c", _SERVE, str(tmp_path / "jobs.json"), str(out)],
    capture_output=True,
    text=True,
    timeout=300,
    cwd=tmp_path,
    env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  served = json.loads(out.read_text())
  assert served["leaked"] == []  # Only TensorFlow was imported.
  return served["served"]


def shown_signatures(export):
  """`saved_model_cli show --all` of `export`: {signature: {"inputs": {name: dtype}, "outputs": {name: dtype}}}."""
  shown = subprocess.run(
    [os.path.join(os.path.dirname(sys.executable), "saved_model_cli"), "show", "--all", "--dir", str(export)],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert shown.returncode == 0, shown.stderr[-2000:]
  signatures = {}
  for section in re.split(r"(?=^signature_def\[)", shown.stdout, flags=re.M)[1:]:
    name = re.match(r"signature_def\['(\w+)'\]", section).group(1)
    signatures[name] = {
      kind: dict(re.findall(rf"{kind}\['(\w+)'\] tensor_info:\s+dtype: (\w+)", section))
      for kind in ("inputs", "outputs")
    }
  return signatures
