"""Programs: units of compiled work over the runtime, traced once, run many times."""

from programs.core.results import LoopResult, ProgramResult
from programs.decode import DecodeProgram
from programs.eval import EvalProgram
from programs.loop import LoopOptions, build_loop_fn
from programs.program import Program
from programs.train import NonFiniteLossError, TrainProgram
from programs.train_and_decode import TrainAndDecodeProgram

__all__ = [
  "DecodeProgram",
  "EvalProgram",
  "LoopOptions",
  "LoopResult",
  "NonFiniteLossError",
  "Program",
  "ProgramResult",
  "TrainAndDecodeProgram",
  "TrainProgram",
  "build_loop_fn",
]
