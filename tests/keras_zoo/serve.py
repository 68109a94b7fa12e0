"""Serves exports in a process that imports TensorFlow and numpy alone, as a serving binary would.

`python serve.py JOBS.json`: for each `[export_dir, inputs.npz, outputs.json]` job, loads the SavedModel, calls its
`serving_default` with the arrays of `inputs.npz` as keyword arguments (their names), and writes the outputs (or
the error), the signature's input names and any module of this repository or gin that got imported (none may) to
`outputs.json`.
"""

import json
import sys

import numpy as np
import tensorflow as tf


def serve(export_dir: str, inputs_file: str) -> dict:
  model = tf.saved_model.load(export_dir)
  result: dict = {"signatures": sorted(model.signatures)}
  if "serving_default" not in model.signatures:
    result["error"] = f"no serving_default signature (it has {sorted(model.signatures)})"
    return result
  signature = model.signatures["serving_default"]
  result["inputs"] = sorted(signature.structured_input_signature[1])
  feed = {name: tf.constant(value) for name, value in np.load(inputs_file).items()}
  try:
    outputs = signature(**feed)
  except Exception as e:  # noqa: BLE001  (what the client sees is the result)
    result["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:600]}"
    return result
  result["outputs"] = {name: value.numpy().tolist() for name, value in outputs.items()}
  return result


def main() -> None:
  for export_dir, inputs_file, outputs_file in json.load(open(sys.argv[1])):
    try:
      result = serve(export_dir, inputs_file)
    except Exception as e:  # noqa: BLE001
      result = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:600]}"}
    # `import tensorflow` imports parts of keras itself; this repository's packages and gin are never imported.
    result["modules"] = sorted({m.split(".")[0] for m in sys.modules} & {"executor", "programs", "gin"})
    with open(outputs_file, "w") as f:
      json.dump(result, f)


if __name__ == "__main__":
  main()
