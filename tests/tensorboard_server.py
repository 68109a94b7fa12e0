"""A real `tensorboard` server in a subprocess, queried through its HTTP API as the dashboards query it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request

_URL = re.compile(r"(http://[^\s]+:\d+/)")


class TensorBoardServer:
  """`tensorboard --logdir=LOGDIR --port=0` (the OS picks the port); a context manager that stops it."""

  def __init__(self, logdir: str, start_timeout: float = 180.0):
    self.logdir = str(logdir)
    self.start_timeout = start_timeout
    self.url = ""
    self._proc: subprocess.Popen | None = None

  def __enter__(self) -> TensorBoardServer:
    tensorboard = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    self._proc = subprocess.Popen(
      [tensorboard, f"--logdir={self.logdir}", "--port=0", "--host=localhost", "--load_fast=false"],
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    # The server says where it listens ("TensorBoard 2.x at http://localhost:PORT/ ...") once it does.
    deadline = time.monotonic() + self.start_timeout
    lines = []
    while time.monotonic() < deadline:
      line = self._proc.stdout.readline()
      if not line:
        break
      lines.append(line)
      match = _URL.search(line)
      if match:
        self.url = match.group(1)
        return self
    self.__exit__(None, None, None)
    raise RuntimeError(f"tensorboard did not start: {''.join(lines)[-2000:]}")

  def __exit__(self, *exc) -> None:
    if self._proc is not None:
      self._proc.kill()
      self._proc.wait()
      self._proc.stdout.close()

  def get(self, path: str):
    """GETs `path` (relative to the server root); the decoded JSON."""
    with urllib.request.urlopen(self.url + path, timeout=60) as response:
      return json.loads(response.read())

  def post(self, path: str, body: dict):
    """POSTs `body` as JSON to `path`; the decoded JSON."""
    request = urllib.request.Request(
      self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
      return json.loads(response.read())

  def wait_for(self, fetch, ready, timeout: float = 180.0):
    """Calls `fetch()` until `ready(result)` (the server loads event files in the background); the result."""
    deadline = time.monotonic() + timeout
    while True:
      result = fetch()
      if ready(result) or time.monotonic() > deadline:
        return result
      time.sleep(0.5)

  def hparams_experiment(self) -> dict:
    """What the HParams dashboard shows as columns: `hparamInfos` and `metricInfos`."""
    return self.post("data/plugin/hparams/experiment", {"experimentName": ""})

  def hparams_session_groups(self, experiment: dict) -> dict:
    """The HParams dashboard's table: a session group per run, with hparam values and metric values."""
    body = {
      "experimentName": "",
      "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
      "colParams": [{"hparam": h["name"], "includeInResult": True} for h in experiment.get("hparamInfos", [])]
      + [{"metric": m["name"], "includeInResult": True} for m in experiment.get("metricInfos", [])],
      "startIndex": 0,
      "sliceSize": 1000,
    }
    return self.post("data/plugin/hparams/session_groups", body)
