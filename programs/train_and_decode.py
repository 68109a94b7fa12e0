"""TrainAndDecodeProgram: train steps and a decode pass in one compiled call (the MLPerf pattern)."""

from __future__ import annotations

import time

import gin

from programs.core.errors import ConfigError
from programs.core.results import ProgramResult
from programs.core.task import Task
from programs.decode import DecodeProgram
from programs.loop import compile_loops
from programs.program import Program
from programs.train import TrainProgram

# Upper bound of decode steps when the decode split runs to its end.
_UNTIL_THE_END = 2**30


@gin.configurable
class TrainAndDecodeProgram(TrainProgram):
  """A train loop, then one decode pass, in one `tf.function`: one host round trip per run.

  The decode half reads its split afresh each run and its outputs go through
  the same host post-processing as a `DecodeProgram` (records, metrics and
  summaries in `decode_<split>/`). With a quality target, the run ends once a
  decode reaches it.
  """

  def __init__(
    self,
    task: Task,
    split: str = "train",
    steps_per_loop: int = 100,
    decode_split: str = "test",
    decode_num_batches: int | None = None,
    target_metric: str | None = None,
    target_value: float | None = None,
    target_mode: str = "max",
    non_finite_policy: str = "stop",
    jit_compile: bool | None = None,
    clip_gradient_norm: float | None = None,
    name: str = "train",
  ):
    """Configures the program.

    Args:
      task: The task to train and decode with.
      split: The split to train on.
      steps_per_loop: Train steps per call.
      decode_split: The split decoded after each train loop (finite unless
        `decode_num_batches` is set).
      decode_num_batches: Batches per decode; None runs until the split ends.
      target_metric: A decode metric that ends training once it reaches
        `target_value`.
      target_value: See `target_metric`.
      target_mode: 'max': reached when >= target; 'min': when <= target.
      non_finite_policy: As for `TrainProgram`.
      jit_compile: Compile with XLA.
      clip_gradient_norm: As for `TrainProgram`.
      name: Summary folder name of the train half.
    """
    super().__init__(
      task,
      split=split,
      steps_per_loop=steps_per_loop,
      jit_compile=jit_compile,
      non_finite_policy=non_finite_policy,
      clip_gradient_norm=clip_gradient_norm,
      name=name,
    )
    if (target_metric is None) != (target_value is None) or target_mode not in ("min", "max"):
      raise ConfigError(
        f"TrainAndDecodeProgram '{self.name}': set both target_metric and target_value (or neither), "
        f"and target_mode to 'min' or 'max'; got {target_metric!r}, {target_value!r}, {target_mode!r}"
      )
    self.decoder = DecodeProgram(task, split=decode_split, num_batches=decode_num_batches)
    self.target_metric, self.target_value, self.target_mode = target_metric, target_value, target_mode
    self.host_calls = 0
    self.last_decode: ProgramResult | None = None

  def validate(self, runtime):
    super().validate(runtime)
    self.decoder.validate(runtime)

  def setup(self, runtime, model_dir):
    super().setup(runtime, model_dir)
    self.decoder.setup(runtime, model_dir)

  def _compile_loops(self) -> None:
    train = self.loop_body("train")
    decode = self.decoder.loop_body("decode", on_trace=self._count_trace)
    self._fused = compile_loops([train, decode], on_trace=self._count_trace)

  def run(self, num_steps: int | None = None) -> ProgramResult:
    """Trains `num_steps` (default `steps_per_loop`) steps, then decodes, in one call."""
    num_steps = self.steps_per_loop if num_steps is None else min(num_steps, self.steps_per_loop)
    decode_iterator, decode_steps = self.decoder._run_input()
    start = time.perf_counter()
    first = self.runtime.step() + 1
    what = f"the train loop of steps {first}-{first + num_steps - 1} or the decode after it"
    with self._failures_named(what, [self.split, self.decoder.split]):
      trained, decoded = self._fused(
        self.input.iterator, num_steps, decode_iterator, decode_steps or _UNTIL_THE_END
      )
    self.host_calls += 1
    secs = time.perf_counter() - start
    result = self._report(trained, secs)
    self.last_decode = self.decoder.postprocess(decoded.per_example, decoded.steps, result.step, secs)
    return result

  def stop_reason(self) -> str | None:
    """Why training should end: the decode reached the quality target."""
    if self.target_metric is None:
      return None
    self.decoder.wait()
    value = (self.decoder.last_metrics or {}).get(self.target_metric)
    if value is None:
      return None
    reached = value >= self.target_value if self.target_mode == "max" else value <= self.target_value
    if not reached:
      return None
    return f"quality target reached: {self.decoder.name}/{self.target_metric} = {value:.6g} (target {self.target_value})"

  def wait(self) -> None:
    self.decoder.wait()

  def busy(self) -> bool:
    return self.decoder.busy()

  def parts(self) -> list[Program]:
    return [self, self.decoder]

  def close(self) -> None:
    super().close()
    self.decoder.close()
