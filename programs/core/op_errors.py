"""What a failed TensorFlow op says, without TensorFlow's decorations.

An op that fails inside a `tf.function` raises an `OpError` whose message is
`Graph execution error:`, `Detected at node <name> defined at (most recent call last):`, the Python stack that
defined the node, the reason, then the nodes around it (`[[{{node <name>}}]]`) and the function
(`[Op:__inference_...]`); an eager op's is the reason with `{{function_node ...}}` before and `[Op:<type>]` after.
An error inside an input pipeline's function adds `Error in user-defined function passed to <Dataset>:<id>
transformation with iterator: <iterator path>:` before the reason. These functions take the parts apart.
"""

from __future__ import annotations

import re

import tensorflow as tf

_DETECTED = re.compile(r"^Detected at node '?([^'\s]+)'? defined at")
_NODE = re.compile(r"\{\{node ([^}]+)\}\}")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_PIPELINE = re.compile(
  r"^Error in user-defined function passed to (\w+?)(?::\d+)? transformation with iterator: \S+: "
)
# An eager op's error ends "[Op:<type>] name: <name>".
_DECORATION = re.compile(r"\{\{.*?\}\}\s*|\s*\[Op:.*$")
_RECORD_OFFSET = re.compile(r"\b(?:corrupted|truncated) record at (\d+)")


def _reason_line(error: tf.errors.OpError) -> str:
  """The line of the message that says what went wrong (the first one after the node's stack)."""
  lines = error.message.splitlines()
  for line in lines:
    if not line.strip() or line[:1].isspace() or line == "Graph execution error:":
      continue
    if _DETECTED.match(line) or line == "<stack traces unavailable>":
      continue
    return line
  return lines[0] if lines else ""


def op_message(error: tf.errors.OpError) -> str:
  """The reason an op failed: the message's reason line without TensorFlow's decorations and pipeline prefix."""
  text = _DECORATION.sub("", _reason_line(error))
  text = _PIPELINE.sub("", text).replace("Name: <unknown>, ", "")
  return text.strip().rstrip(".")


def input_pipeline_dataset(error: tf.errors.OpError) -> str | None:
  """The dataset transformation whose function failed (e.g. 'MapDataset'), for an error inside an input pipeline."""
  match = _PIPELINE.match(_DECORATION.sub("", _reason_line(error)))
  return match.group(1) if match else None


def failed_node(error: tf.errors.OpError) -> str | None:
  """The name of the node that failed (e.g. 'ParseExample/ParseExampleV2'), when the message names one."""
  if error.node_def is not None and error.node_def.name:
    return error.node_def.name
  for line in error.message.splitlines():
    match = _DETECTED.match(line)
    if match:
      return match.group(1)
  match = _NODE.search(error.message)
  return match.group(1) if match else None


def defined_at(error: tf.errors.OpError) -> list[tuple[str, int]]:
  """The Python stack that defined the failing node, as (file, line), innermost last (empty when not given)."""
  frames = []
  for line in error.message.splitlines():
    match = _FRAME.match(line)
    if match:
      frames.append((match.group(1), int(match.group(2))))
  return frames


def damaged_record_offset(error: tf.errors.OpError) -> int | None:
  """The byte offset of the damaged record a record file reader reports ('corrupted record at <offset>')."""
  match = _RECORD_OFFSET.search(error.message) if isinstance(error, tf.errors.DataLossError) else None
  return int(match.group(1)) if match else None
