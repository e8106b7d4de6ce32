"""The fake engine timed like the target GPU: each step lasts the planner's roofline time for its batch.

`FakeEngine`'s contract (continuous batching, one token per running request per step, a finished slot
refilled at the next step), but a step of B running sequences takes

    step = (weight_bytes + B x kv_bytes_per_seq(context)) / bandwidth        (storage/planning/roofline.py)

on the target (Llama 3.1 70B FP8 on 8x H100 SXM by default: 4.3 ms at B = 32, 21.9 ms at B = 384). The step
sleeps out its time, so it costs almost no CPU and releases the GIL as a GPU step would: a 2-core machine
can show whether Backfill's own work between steps would leave an H100 node waiting. Selected by the model
registry: `{"path": "fake:gpu-timed", "max_num_seqs": 384}` (see `from_spec`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from storage.planning.roofline import (
    EXAMPLE_CONTEXT,
    GB,
    HARDWARE_PRESETS,
    LLAMA_70B_FP8,
    Hardware,
    ModelShape,
    step_seconds,
)
from storage.registry import ModelSpec
from worker.engine import EngineRequest, EngineResult
from worker.engine.fake import FakeEngine

PATH = "fake:gpu-timed"  # the registry path that selects this engine
_LEAD_WEIGHT = 0.1  # how fast the wake-up lead follows the measured lateness of `time.sleep`
_MAX_LEAD = 0.002  # `time.sleep` wakes 0.1-1 ms late on a busy 2-core machine; never wake > 2 ms early


@dataclass(frozen=True)
class StepRecord:
    """One step as it ran: when (perf_counter), how many sequences, and how many still waited for a slot."""

    started: float
    ended: float
    batch: int
    waiting: int
    roofline_seconds: float


class TimedFakeEngine(FakeEngine):
    """A `FakeEngine` whose every step takes the roofline time of its batch on `hardware`."""

    def __init__(
        self,
        model_name: str = "fake-gpu-timed",
        *,
        shape: ModelShape = LLAMA_70B_FP8,
        hardware: Hardware = HARDWARE_PRESETS["8xH100-SXM"],
        context: int = EXAMPLE_CONTEXT,
        max_num_seqs: int = 384,
        runner: str = "generate",
        max_model_len: int = 2 * EXAMPLE_CONTEXT,
        timeline_steps: int = 200_000,
    ) -> None:
        super().__init__(model_name, max_num_seqs=max_num_seqs, runner=runner, max_model_len=max_model_len)
        self.shape, self.hardware, self.context = shape, hardware, context
        self.timeline: deque[StepRecord] = deque(maxlen=timeline_steps)  # the benchmark reads it
        self.step_cpu_seconds = 0.0  # CPU the fake itself spent inside steps (not the runner's)
        self.last_added = 0.0  # perf_counter of the latest `add`
        self._lead = 0.0  # wake this much early: time.sleep oversleeps by ~0.1 ms here

    def add(self, request: EngineRequest) -> EngineResult | None:
        """`FakeEngine.add`, noting when work last arrived (until then the queue still had work)."""
        self.last_added = time.perf_counter()
        return super().add(request)

    def step_time(self, batch: int) -> float:
        """The roofline's decode step for `batch` running sequences (0 when nothing runs)."""
        return step_seconds(self.shape, self.hardware, self.context, batch) if batch else 0.0

    def step(self) -> list[EngineResult]:
        """Admit, decode one token each, then wait out the rest of the roofline step time."""
        started, cpu = time.perf_counter(), time.thread_time()
        self.steps += 1
        self._admit()
        batch, waiting = len(self._running), len(self._waiting)
        roofline = self.step_time(batch)
        finished = self._decode()
        self.step_cpu_seconds += time.thread_time() - cpu
        self._wait_until(started + roofline)
        self.timeline.append(StepRecord(started, time.perf_counter(), batch, waiting, roofline))
        return finished

    def _wait_until(self, deadline: float) -> None:
        """Sleep (no CPU, GIL released) until `deadline`, waking early by the lateness sleep has shown."""
        remaining = deadline - time.perf_counter() - self._lead
        if remaining <= 0:
            return
        time.sleep(remaining)
        # Learn only the timer's usual lateness: a longer stall (the OS, another thread holding the GIL) is
        # a real delay and must not be paid back by shorter steps afterwards.
        late = min(max(time.perf_counter() - deadline, -_MAX_LEAD), _MAX_LEAD)
        self._lead = min(max(0.0, self._lead + _LEAD_WEIGHT * late), _MAX_LEAD)


def from_spec(model: str, spec: ModelSpec) -> TimedFakeEngine:
    """The engine a registry entry with path `fake:gpu-timed` asks for.

    `hardware` (a planner preset), `max_num_seqs` and `runner` come from the entry; `extra` may override
    the model (`weights_gb`, `kv_bytes_per_token`) and the context the KV cache is sized for (`context`).
    """
    extra = spec.extra
    if spec.hardware not in HARDWARE_PRESETS:
        raise ValueError(f"hardware must be one of {', '.join(HARDWARE_PRESETS)}, got {spec.hardware!r}")
    shape = ModelShape(
        weight_bytes=float(extra.get("weights_gb", LLAMA_70B_FP8.weight_bytes / GB)) * GB,
        kv_bytes_per_token=float(extra.get("kv_bytes_per_token", LLAMA_70B_FP8.kv_bytes_per_token)),
    )
    context = int(extra.get("context", EXAMPLE_CONTEXT))
    return TimedFakeEngine(
        model,
        shape=shape,
        hardware=HARDWARE_PRESETS[spec.hardware],
        context=context,
        max_num_seqs=spec.resolved_max_num_seqs(),
        runner=spec.runner,
        max_model_len=spec.max_model_len or 2 * context,
    )
