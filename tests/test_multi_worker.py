"""Two worker processes on 127.0.0.1 under MultiWorkerMirroredStrategy, one writer, resume."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf
from conftest import REPO, read_scalars
from holds import hold_params, wait_held

from executor.cli.main import run

PARAMS = [
  "TrainProgram.steps_per_loop = 20",
  "SimpleProgramSchedule.train_executions_per_eval = 3",
  "Checkpointer.save_interval_steps = 60",
  "DecodeProgram.num_batches = 2",
]
MW = ["Runtime.strategy_fn = @multi_worker_strategy"]


def free_ports(n):
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


class Cluster:
  """Two executor worker processes; worker 0 is the chief."""

  def __init__(self, model_dir, tmp, *params):
    ports = free_ports(2)
    workers = [f"127.0.0.1:{p}" for p in ports]
    self.procs, self.logs = [], []
    for index in range(2):
      log = open(tmp / f"worker{index}.{time.monotonic_ns()}.log", "w+")  # noqa: SIM115
      env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")]),
        TMPDIR=str(tmp / f"tmp{index}"),
        TF_CONFIG=json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}),
      )
      os.makedirs(env["TMPDIR"], exist_ok=True)
      args = [
        sys.executable,
        "-m",
        "executor.cli.main",
        "--gin_file=gin/spirals.gin",
        f"--model_dir={model_dir}",
        "--deterministic",
        *[f"--gin_param={p}" for p in [*PARAMS, *MW, *params]],
      ]
      self.procs.append(subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=log))
      self.logs.append(log)

  def log(self, index):
    self.logs[index].seek(0)
    return self.logs[index].read()

  def wait(self, timeout=900):
    deadline = time.monotonic() + timeout
    try:
      return [p.wait(timeout=max(1, deadline - time.monotonic())) for p in self.procs]
    finally:
      self.kill()

  def wait_held(self, folder, name):
    """Waits until every worker holds at `name` (tests/holds.py; `{pid}` in it is each worker's)."""
    for index, proc in enumerate(self.procs):
      wait_held(
        folder, name.format(pid=proc.pid), lambda p=proc: p.poll() is None, lambda i=index: self.log(i)
      )

  def kill(self):
    for p in self.procs:
      if p.poll() is None:
        p.kill()
        p.wait()


def losses(log):
  return [
    (int(s), float(v)) for s, v in re.findall(r"Progress: step (\d+)/\d+ .*\| loss ([\d.e+-]+) \|", log)
  ]


@pytest.mark.slow
def test_multi_worker_two_processes_agree_and_only_the_chief_writes(tmp_path):
  model_dir = tmp_path / "run"
  cluster = Cluster(model_dir, tmp_path, "Executor.max_steps = 240")
  codes = cluster.wait()
  assert codes == [0, 0], cluster.log(0)[-3000:] + cluster.log(1)[-3000:]
  chief, other = cluster.log(0), cluster.log(1)
  # Both workers ran the same steps with the same (all-reduced) losses.
  assert losses(chief) == losses(other)
  assert [s for s, _ in losses(chief)] == list(range(20, 260, 20))
  # One writer: every event file and checkpoint comes from the chief's process.
  chief_pid = cluster.procs[0].pid
  events = [p for p in model_dir.rglob("events.out.tfevents.*")]
  assert events and all(p.name.split(".")[-3] == str(chief_pid) for p in events)
  assert sorted(p.name for p in (model_dir / "checkpoints").glob("*.index")) == [
    "ckpt-120.index",
    "ckpt-180.index",
    "ckpt-240.index",
    "ckpt-60.index",
  ]
  assert len((model_dir / "decode_test" / "decoder_out_240.jsonl").read_text().splitlines()) == 2 * 64
  # The other worker's checkpoint copies went to its temporary folder and were removed.
  assert os.listdir(tmp_path / "tmp1") == []
  saved = re.findall(r"Saved (\S+)", other)
  assert len(saved) == 4 and all(path.startswith(str(tmp_path / "tmp1")) for path in saved)
  # The same global batch in one process reaches a comparable model.
  single = tmp_path / "single"
  run(str(single), ["gin/spirals.gin"], [*PARAMS, "Executor.max_steps = 240"])
  multi_acc = read_scalars(model_dir / "eval_test")["accuracy"][-1]
  single_acc = read_scalars(single / "eval_test")["accuracy"][-1]
  assert multi_acc[0] == single_acc[0] == 240
  assert abs(multi_acc[1] - single_acc[1]) < 0.1, (multi_acc, single_acc)


@pytest.mark.slow
def test_multi_worker_resumes_after_one_worker_is_killed(tmp_path):
  model_dir, holds = tmp_path / "run", tmp_path / "holds"
  # Both workers held after the train loop of step 120, before the save of step 120.
  hold = hold_params(holds, "train", 120, name="train-{pid}")
  cluster = Cluster(model_dir, tmp_path, "Executor.max_steps = 300", *hold)
  cluster.wait_held(holds, "train-{pid}")
  cluster.procs[1].send_signal(signal.SIGKILL)
  cluster.kill()  # The survivor would wait for its peer forever.
  latest = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
  saved = int(latest.rsplit("-", 1)[1])
  assert saved == 60
  cluster = Cluster(model_dir, tmp_path, "Executor.max_steps = 300")
  assert cluster.wait() == [0, 0], cluster.log(0)[-3000:] + cluster.log(1)[-3000:]
  for index in range(2):
    assert f"at step {saved}" in cluster.log(index)
  assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith("ckpt-300")
