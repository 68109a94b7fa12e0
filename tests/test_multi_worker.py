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

from executor.checkpoints import Checkpointer
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
        PYTHONPATH=str(REPO),
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

  def wait(self, timeout=300):
    deadline = time.monotonic() + timeout
    try:
      return [p.wait(timeout=max(1, deadline - time.monotonic())) for p in self.procs]
    finally:
      self.kill()

  def wait_for(self, index, pattern, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if re.search(pattern, self.log(index)):
        return
      if self.procs[index].poll() is not None:
        break
      time.sleep(0.2)
    self.kill()
    raise AssertionError(f"worker {index} never logged {pattern!r}:\n{self.log(index)[-3000:]}")

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
  model_dir = tmp_path / "run"
  cluster = Cluster(model_dir, tmp_path, "Executor.max_steps = 300")
  cluster.wait_for(0, r"Progress: step (1[2-9]\d|2\d\d)/")
  cluster.procs[1].send_signal(signal.SIGKILL)
  cluster.kill()  # The survivor would wait for its peer forever.
  latest = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
  saved = int(latest.rsplit("-", 1)[1])
  assert 60 <= saved < 300
  cluster = Cluster(model_dir, tmp_path, "Executor.max_steps = 300")
  assert cluster.wait() == [0, 0], cluster.log(0)[-3000:] + cluster.log(1)[-3000:]
  for index in range(2):
    assert f"at step {saved}" in cluster.log(index)
  assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith("ckpt-300")


def test_a_time_based_save_is_agreed_on_by_every_worker(tmp_path):
  # Each worker has its own clock: when another worker's interval has passed, this one saves too (the agreement is
  # `Runtime.any_worker`); before the fix the agreement was never asked, and workers saved at different steps.
  step = tf.Variable(0, dtype=tf.int64)
  asked = []

  def another_worker_says_now(flag):
    asked.append(flag)
    return True

  checkpointer = Checkpointer(save_interval_steps=None, save_interval_secs=3600)
  checkpointer.attach(str(tmp_path), step, {}, [tf.Variable([1.0])], agree=another_worker_says_now)
  step.assign(1)
  assert checkpointer.maybe_save()
  assert asked == [False]  # This worker's hour had not passed.
  assert [os.path.basename(p) for p in checkpointer.checkpoints()] == ["ckpt-1"]
  assert not checkpointer.due() and asked == [False]  # Nothing to agree on: this step is saved.
