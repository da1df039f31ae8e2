"""The ReferenceVM: executes a Schedule on the CPU with numpy float32, the oracle the CUDA VM must match.

It binds weight buffers to the ModelSpec's arrays, keeps the KV cache between steps (one decode step
per schedule), fills activations with NaN before each step (so a read of something not yet written
poisons the result instead of silently reading a stale value), runs the tasks honouring their waits,
and reads back the logits and the argmax token.

Execution order: by default the task list order (the global topological order), checking before each
task that its waits hold. ``run(..., executor=f)`` hands the order to another scheduler: ``f(schedule,
run_task)`` must call ``run_task(task)`` once per task in an order legal under the waits (for example
the interleaving executor, which walks the SM queues in random legal interleavings).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
from mosaic.errors import BadInput
from mosaic.records import GpuTarget

from mosaic_amk import rope_order
from mosaic_amk.config import ScheduleConfig
from mosaic_amk.lowering import LOGITS, NEXT_TOKEN, lower
from mosaic_amk.model import ModelSpec
from mosaic_amk.ops import KERNELS
from mosaic_amk.schedule import Schedule, Task

_NP = {"f32": np.float32, "i32": np.int32}
_QUANT = ("int8", "q8_0", "q4_1")  # quant.FORMATS: weight buffers bound to a quant.QuantizedTensor


class VMError(BadInput):
    """The schedule cannot be executed: an unknown op or buffer, a wait that does not hold in list order."""


@attrs.define
class StepResult:
    token: int
    logits: np.ndarray


Executor = Callable[[Schedule, Callable[[Task], None]], Any]


class ReferenceVM:
    """Runs schedules of one model; holds its KV cache between steps."""

    def __init__(self, model: ModelSpec, config: ScheduleConfig | None = None, gpu: GpuTarget | None = None):
        self.model = model
        self.config = config or ScheduleConfig()
        self.gpu = gpu
        self.kv: dict[str, np.ndarray] = {}
        self._schedules: dict[int, Schedule] = {}
        self._derived: dict[str, np.ndarray] = {}  # blocked RoPE-order weights (rope_order.resolve), made once

    def reset(self) -> None:
        """Forget the KV cache (a new sequence)."""
        self.kv.clear()

    def schedule(self, position: int) -> Schedule:
        if position not in self._schedules:
            if self.gpu is None:  # a library default (CPU-only): the commands pass the --gpu record
                from mosaic.gpus import DEFAULT_GPU
                from mosaic.plugins import host
                self.gpu = host().get("gpus", DEFAULT_GPU)
            self._schedules[position] = lower(self.model, self.config, self.gpu, position)
        return self._schedules[position]

    # --------------------------------------------------------------------------------------- buffers
    def _bind(self, schedule: Schedule, token: int) -> dict[str, np.ndarray]:
        arrays: dict[str, np.ndarray] = {}
        for buf in schedule.buffers:
            dtype = _NP.get(buf.dtype)
            if dtype is None and not (buf.dtype in _QUANT and buf.kind == "weight"):
                raise VMError(f"buffer {buf.name}: dtype {buf.dtype} is not run by the ReferenceVM (f32, i32; "
                              "int8 / q8_0 / q4_1 weights)")
            if buf.kind == "weight":
                w = self.model.weights.get(buf.name)
                if w is None and rope_order.split_name(buf.name):
                    w = self._derived.get(buf.name)
                    if w is None:
                        w = rope_order.resolve(self.model.weights.get, buf.name)
                        if w is not None:
                            self._derived[buf.name] = w
                if w is None or tuple(w.shape) != tuple(buf.shape) or getattr(w, "format", "f32") != buf.dtype:
                    raise VMError(f"weight buffer {buf.name} {buf.dtype} {list(buf.shape)} does not match the model")
                arrays[buf.name] = w
            elif buf.kind == "kv_cache":
                cache = self.kv.get(buf.name)
                if cache is None or cache.shape != tuple(buf.shape):
                    cache = self.kv[buf.name] = np.zeros(buf.shape, dtype)
                arrays[buf.name] = cache
            elif buf.kind == "input":
                arrays[buf.name] = np.full(buf.shape, token, dtype)
            else:
                fill = np.nan if dtype is np.float32 else -1
                arrays[buf.name] = np.full(buf.shape, fill, dtype)
        return arrays

    # --------------------------------------------------------------------------------------- running
    def run(self, schedule: Schedule, token: int, executor: Executor | None = None) -> StepResult:
        """Execute one step of ``schedule`` with input ``token``; returns the argmax token and logits."""
        arrays = self._bind(schedule, token)

        def run_task(task: Task) -> None:
            kernel = KERNELS.get(task.op)
            if kernel is None:
                raise VMError(f"task {task.id}: unknown op {task.op!r}")
            try:
                ins = [arrays[n] for n in task.inputs]
                outs = [arrays[n] for n in task.outputs]
            except KeyError as exc:
                raise VMError(f"task {task.id}: unknown buffer {exc.args[0]}") from None
            kernel(ins, outs, task.params)

        if executor is None:
            _list_order(schedule, run_task)
        else:
            executor(schedule, run_task)
        names = {b.name for b in schedule.buffers}
        if LOGITS not in names or NEXT_TOKEN not in names:
            raise VMError(f"schedule has no {LOGITS}/{NEXT_TOKEN} output buffers")
        return StepResult(int(arrays[NEXT_TOKEN][0]), arrays[LOGITS].copy())

    def step(self, token: int, position: int, executor: Executor | None = None) -> StepResult:
        if not 0 <= token < self.model.vocab_size:
            raise BadInput(f"token id {token} outside the vocabulary (0 .. {self.model.vocab_size - 1})")
        return self.run(self.schedule(position), token, executor)

    def generate(self, prompt: Sequence[int], n_tokens: int, executor: Executor | None = None
                 ) -> tuple[list[int], list[np.ndarray]]:
        """Greedy decode. Prefill runs the decode-step schedule once per prompt token (positions 0..n-1);
        returns the ``n_tokens`` generated ids and the logits each was chosen from."""
        if not prompt:
            raise BadInput("the prompt needs at least one token")
        self.reset()
        result = None
        for pos, tok in enumerate(prompt):
            result = self.step(int(tok), pos, executor)
        tokens, logits = [], []
        pos = len(prompt)
        for k in range(n_tokens):
            tokens.append(result.token)
            logits.append(result.logits)
            if k + 1 < n_tokens:
                result = self.step(result.token, pos, executor)
                pos += 1
        return tokens, logits


def _list_order(schedule: Schedule, run_task: Callable[[Task], None]) -> None:
    """Run the tasks in list order, checking each task's waits before it runs."""
    counters = np.zeros(schedule.num_counters, np.int64)
    for task in schedule.tasks:
        for w in task.waits:
            if not 0 <= w.counter < schedule.num_counters or counters[w.counter] < w.threshold:
                have = counters[w.counter] if 0 <= w.counter < schedule.num_counters else "out of bounds"
                raise VMError(f"task {task.id} waits for counter {w.counter} >= {w.threshold} but it is {have} "
                              "when reached in list order")
        run_task(task)
        if not 0 <= task.signal < schedule.num_counters:
            raise VMError(f"task {task.id} signals counter {task.signal}, out of bounds")
        counters[task.signal] += 1
