"""The strategy factories: which `tf.distribute.Strategy` a run uses, chosen by gin (`Runtime.strategy_fn`).

No other module branches on the kind of device.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import gin
import tensorflow as tf
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2  # The heartbeat (no public setter).
from tensorflow.python.eager import context as tf_context  # The heartbeat (no public API).

from programs.core.errors import check_value


@gin.configurable
def default_strategy() -> tf.distribute.Strategy:
  """The default strategy: one device (the first GPU, else the CPU)."""
  return tf.distribute.get_strategy()


@gin.configurable
def mirrored_strategy(
  devices: Sequence[str] | None = None, num_logical_cpus: int = 0
) -> tf.distribute.Strategy:
  """Synchronous data parallelism over the devices of one host.

  Args:
    devices: Device names; all local GPUs (or the CPU) when None.
    num_logical_cpus: If > 0, split the CPU into that many logical devices and
      mirror over them: how tests and CPU-only machines run several replicas.
  """
  if num_logical_cpus > 0:
    configure_logical_cpus(num_logical_cpus)
    devices = devices or [f"/cpu:{i}" for i in range(num_logical_cpus)]
  return tf.distribute.MirroredStrategy(devices=devices)


@gin.configurable
def multi_worker_strategy(
  peer_timeout_secs: float = 60.0, collective_timeout_secs: float | None = None
) -> tf.distribute.Strategy:
  """Synchronous data parallelism over the workers named in `TF_CONFIG`.

  A worker that is killed, frozen or cut off does not leave the others waiting for it: once it stopped answering
  for `peer_timeout_secs`, their collective ops fail, and each ends with one line naming it (exit status 75, see
  `executor.preemption`). The same command on every worker then resumes from the latest checkpoint.

  Args:
    peer_timeout_secs: How long a worker may stop answering before the others give it up: the heartbeat
      timeout of the cluster's coordination service (a killed process is noticed sooner, when its connections
      drop). Heartbeats are sent by TensorFlow's own threads, so a worker busy in Python (a long checkpoint
      write, a decode's post-processing) still answers.
    collective_timeout_secs: Also fail a collective op (a step's all-reduce, an agreement on a stop) that waits
      longer than this for a worker that still answers (one stuck in its input pipeline or its own host code).
      None: no limit. TensorFlow holds a thread for this long for each collective op it runs, so this is for
      finding a hang, not for every run.
  """
  if "TF_CONFIG" not in os.environ:
    raise ValueError("multi_worker_strategy needs the TF_CONFIG environment variable")
  check_value("multi_worker_strategy.peer_timeout_secs", peer_timeout_secs, minimum=1)
  check_value(
    "multi_worker_strategy.collective_timeout_secs", collective_timeout_secs, above=0, optional=True
  )
  cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
  if cluster.as_dict() and tf_context.context().coordination_service is None:
    jobs = [job for job in ("chief", "worker") if job in cluster.jobs]
    # What MultiWorkerMirroredStrategy would configure, with the heartbeat timeout set.
    tf_context.context().configure_coordination_service(
      service_type="standalone",
      service_leader=f"/job:{jobs[0]}/replica:0/task:0",
      coordinated_jobs=[
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster.num_tasks(job)) for job in jobs
      ],
      heartbeat_timeout_in_ms=int(peer_timeout_secs * 1000),
    )
  options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout_secs)
  return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


@gin.configurable
def tpu_strategy(tpu: str = "") -> tf.distribute.Strategy:
  """A `TPUStrategy` over the TPU `tpu` (the local one when empty)."""
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
  tf.config.experimental_connect_to_cluster(resolver)
  tf.tpu.experimental.initialize_tpu_system(resolver)
  return tf.distribute.TPUStrategy(resolver)


def configure_logical_cpus(count: int) -> None:
  """Splits the first physical CPU into `count` logical devices (once per process)."""
  cpu = tf.config.list_physical_devices("CPU")[0]
  current = tf.config.get_logical_device_configuration(cpu)
  if current is not None and len(current) >= count:
    return
  try:
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
  except RuntimeError as e:
    raise RuntimeError(
      f"Cannot split the CPU into {count} logical devices: TensorFlow is already "
      "initialised in this process. Create the runtime before running any TF op."
    ) from e
