"""A real `tensorboard` server in a subprocess, queried through its HTTP API as its dashboards query it."""

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest


def _free_port():
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# No proxy from the environment: the server is on 127.0.0.1.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class TensorBoard:
  """A real `tensorboard` server on 127.0.0.1 over one logdir."""

  def __init__(self, logdir, log_path):
    self.port = _free_port()
    self.log_path = log_path
    self._log = open(log_path, "wb")  # noqa: SIM115  (closed by stop())
    # --reload_task=blocking (with --reload_interval=0) loads every event file
    # before the server binds its port: once it answers, it serves all the data.
    self.proc = subprocess.Popen(
      [
        sys.executable,
        "-m",
        "tensorboard.main",
        f"--logdir={logdir}",
        "--host=127.0.0.1",
        f"--port={self.port}",
        "--load_fast=false",
        "--reload_interval=0",
        "--reload_task=blocking",
      ],
      stdout=self._log,
      stderr=subprocess.STDOUT,
      stdin=subprocess.DEVNULL,
    )

  def get(self, route, **params):
    """The decoded JSON of `route` (e.g. '/data/runs') with query `params`."""
    url = f"http://127.0.0.1:{self.port}{route}"
    if params:
      url += "?" + urllib.parse.urlencode(params)
    with _OPENER.open(url, timeout=120) as response:
      assert response.status == 200, url
      return json.loads(response.read())

  def wait_ready(self, timeout=600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if self.proc.poll() is not None:
        pytest.fail(f"tensorboard exited with {self.proc.returncode}:\n{self.log()}")
      try:
        return self.get("/data/runs")
      except (urllib.error.URLError, ConnectionError, TimeoutError):
        time.sleep(0.25)
    pytest.fail(f"tensorboard did not answer within {timeout}s:\n{self.log()}")

  def post(self, route, body):
    """The decoded JSON answer to `body` POSTed as JSON to `route` (as the HParams dashboard asks)."""
    request = urllib.request.Request(
      f"http://127.0.0.1:{self.port}{route}",
      data=json.dumps(body).encode(),
      headers={"Content-Type": "application/json"},
    )
    with _OPENER.open(request, timeout=120) as response:
      assert response.status == 200, route
      return json.loads(response.read())

  def hparams_experiment(self):
    """The HParams dashboard's columns: `hparamInfos` (with `differs`) and `metricInfos` (group, tag)."""
    return self.post("/data/plugin/hparams/experiment", {"experimentName": ""})

  def hparams_session_groups(self, experiment):
    """The HParams dashboard's table: one session group per run, with its hparam and metric values."""
    body = {
      "experimentName": "",
      "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
      "colParams": [{"hparam": h["name"], "includeInResult": True} for h in experiment["hparamInfos"]]
      + [{"metric": m["name"], "includeInResult": True} for m in experiment["metricInfos"]],
      "startIndex": 0,
      "sliceSize": 1000,
    }
    return self.post("/data/plugin/hparams/session_groups", body)

  def log(self):
    self._log.flush()
    with open(self.log_path, errors="replace") as f:
      return f.read()[-3000:]

  def stop(self):
    if self.proc.poll() is None:
      self.proc.terminate()
      try:
        self.proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        self.proc.kill()
        self.proc.wait(timeout=10)
    self._log.close()
