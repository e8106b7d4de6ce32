"""The fake engine timed like the target GPU: each step lasts the planner's step time for what it carried.

`FakeEngine`'s contract (continuous batching, a finished slot refilled at the next step), plus prefill:
a new request's prompt is prefilled in chunks inside the step's token budget (`max_num_batched_tokens`,
16,384 by default as vLLM on an H100), mixed with the decodes (chunked prefill, Sarathi-Serve's
stall-free order: every decoding sequence first, then the prompts already being prefilled, then new ones
while a slot and budget remain). The step that prefills a prompt's last chunk yields its first token, as
vLLM's does; every later step decodes one. A step that decodes B sequences and prefills P prompt tokens
lasts (storage/planning/step_time.py)

    max((weights + B x KV(context) + KV x (P + earlier chunks read)) / bandwidth,
        2 x parameters x (B + P) / (FLOP/s x efficiency))

on the target (Llama 3.1 70B FP8 on 8x H100 SXM by default: 4.2 ms at B = 32, 21.9 ms at B = 384,
292 ms for a full 16,384-token prefill step). Prompt tokens a prefix cache already holds are not
prefilled. The step sleeps out its time, so it costs almost no CPU and releases the GIL as a GPU step
would: a 2-core machine can show whether Backfill's own work between steps would leave an H100 node
waiting. Each request's TTFT and TPOT are kept in `requests` (the benchmark reads them). Selected by the
model registry: `{"path": "fake:gpu-timed", "max_num_seqs": 384}` (see `from_spec`).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from storage.planning.node import EXAMPLE_CONTEXT, GB, HARDWARE_PRESETS, LLAMA_70B_FP8, Hardware, ModelShape
from storage.planning.step_time import DEFAULT_MAX_NUM_BATCHED_TOKENS, StepLoad, step_seconds
from storage.registry import ModelSpec
from worker.engine import EngineRequest, EngineResult
from worker.engine.decode_ledger import DecodeLedger, ledger_from_extra
from worker.engine.fake import FakeEngine, _Sequence

PATH = "fake:gpu-timed"  # the registry path that selects this engine
_LEAD_WEIGHT = 0.1  # how fast the wake-up lead follows the measured lateness of `time.sleep`
_MAX_LEAD = 0.002  # `time.sleep` wakes 0.1-1 ms late on a busy 2-core machine; never wake > 2 ms early


@dataclass(frozen=True)
class StepRecord:
    """One step as it ran: when (perf_counter), how many sequences it carried, how many still waited for a
    slot, its formula time, the prompt tokens it prefilled and the output tokens it yielded."""

    started: float
    ended: float
    batch: int
    waiting: int
    roofline_seconds: float
    prefill_tokens: int = 0
    tokens: int = 0


@dataclass(frozen=True)
class RequestTiming:
    """One finished request's clocks (perf_counter): added, first token, last token."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    added: float
    first_token: float
    finished: float

    @property
    def ttft(self) -> float:
        """Time to first token: from `add` (queueing for a slot included) to the end of its last prefill step."""
        return self.first_token - self.added

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (None for a single-token output)."""
        if self.output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.output_tokens - 1)


class TimedFakeEngine(FakeEngine):
    """A `FakeEngine` with chunked prefill whose every step takes the step-time formula's time on `hardware`.

    `timed=False` never sleeps: the timeline then holds what the formula says a perfectly fed engine
    takes for the requests added (the benchmark's engine limit)."""

    def __init__(
        self,
        model_name: str = "fake-gpu-timed",
        *,
        shape: ModelShape = LLAMA_70B_FP8,
        hardware: Hardware = HARDWARE_PRESETS["8xH100-SXM"],
        context: int = EXAMPLE_CONTEXT,
        max_num_seqs: int = 384,
        max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
        runner: str = "generate",
        max_model_len: int = 2 * EXAMPLE_CONTEXT,
        timeline_steps: int = 200_000,
        timed: bool = True,
        ledger: DecodeLedger | None = None,
    ) -> None:
        super().__init__(
            model_name, max_num_seqs=max_num_seqs, runner=runner, max_model_len=max_model_len, ledger=ledger
        )
        self.shape, self.hardware, self.context = shape, hardware, context
        self.max_num_batched_tokens = max_num_batched_tokens
        self.timed = timed
        self.timeline: deque[StepRecord] = deque(maxlen=timeline_steps)  # the benchmark reads it
        self.requests: deque[RequestTiming] = deque(maxlen=timeline_steps)  # TTFT and TPOT per request
        self.step_cpu_seconds = 0.0  # CPU the fake itself spent inside steps (not the runner's)
        self.last_added = 0.0  # perf_counter of the latest `add`
        self.clock = 0.0  # formula seconds of every step so far (the timeline's time when `timed` is off)
        self._lead = 0.0  # wake this much early: time.sleep oversleeps by ~0.1 ms here
        self._prefilled: dict[str, int] = {}  # request id -> prompt tokens prefilled so far (or cached)
        self._times: dict[str, tuple[float, float]] = {}  # request id -> (added, first token)

    def add(self, request: EngineRequest) -> EngineResult | None:
        """`FakeEngine.add`, noting when work arrived (the queue had work until then; TTFT counts from it)."""
        self.last_added = self._now()
        result = super().add(request)
        if result is None:
            self._times[request.request_id] = (self.last_added, 0.0)
        return result

    def abort(self, request_ids: list[str]) -> None:
        """`FakeEngine.abort`, forgetting the requests' prefill progress and clocks."""
        super().abort(request_ids)
        for request_id in request_ids:
            self._prefilled.pop(request_id, None)
            self._times.pop(request_id, None)

    def step_time(self, batch: int, prefill_tokens: int = 0, prefill_context_tokens: int = 0) -> float:
        """The formula's step for `batch` decoding sequences and `prefill_tokens` prompt tokens (0 if empty)."""
        if not batch and not prefill_tokens:
            return 0.0
        load = StepLoad(batch, prefill_tokens, prefill_context_tokens)
        return step_seconds(self.shape, self.hardware, self.context, load)

    def step(self) -> list[EngineResult]:
        """Schedule decodes and prefill chunks within the token budget, then wait out the formula's time."""
        started, cpu = self._now(), time.thread_time()
        self.steps += 1
        decoding, chunks, context = self._schedule()
        waiting = len(self._waiting)
        prefill = sum(chunks.values())
        roofline = self.step_time(len(decoding), prefill, context)
        ready = decoding + [s for s in self._running if s.request_id in chunks and self._prompt_done(s)]
        # Tokens are stamped at the step's formula end and results built inside its time, as a GPU step
        # would leave the CPU free to do while the kernels run.
        finished = self._emit(ready, started + roofline)
        self.step_cpu_seconds += time.thread_time() - cpu
        self._wait_until(started + roofline)
        ended = self._now()
        self.timeline.append(
            StepRecord(started, ended, len(decoding) + len(chunks), waiting, roofline, prefill, len(ready))
        )
        return finished

    def _schedule(self) -> tuple[list[_Sequence], dict[str, int], int]:
        """This step's decoding sequences, prompt chunks {id: tokens} and earlier-chunk tokens they attend to."""
        budget = self.max_num_batched_tokens
        decoding = [s for s in self._running if self._prompt_done(s)][:budget]
        budget -= len(decoding)
        chunks: dict[str, int] = {}
        context = 0
        for sequence in [s for s in self._running if not self._prompt_done(s)]:
            if budget <= 0:
                break
            context, budget = self._chunk(sequence, chunks, context, budget)
        while self._waiting and len(self._running) < self.max_num_seqs and budget > 0:
            sequence = self._waiting.popleft()
            self._running.append(sequence)
            # A prefix the cache holds is not computed again; at least the last token always is.
            self._prefilled[sequence.request_id] = min(sequence.cached_tokens, self._prompt(sequence) - 1)
            context, budget = self._chunk(sequence, chunks, context, budget)
        return decoding, chunks, context

    def _chunk(self, sequence: _Sequence, chunks: dict[str, int], context: int, budget: int) -> tuple[int, int]:
        done = self._prefilled[sequence.request_id]
        tokens = min(self._prompt(sequence) - done, budget)
        chunks[sequence.request_id] = tokens
        self._prefilled[sequence.request_id] = done + tokens
        return context + done, budget - tokens

    @staticmethod
    def _prompt(sequence: _Sequence) -> int:
        return max(1, sequence.prompt_tokens + sequence.resumed)  # a resumed request prefills its earlier tokens too

    def _prompt_done(self, sequence: _Sequence) -> bool:
        return self._prefilled.get(sequence.request_id, 0) >= self._prompt(sequence)

    def _emit(self, ready: list[_Sequence], now: float) -> list[EngineResult]:
        """One token for each sequence that decoded or finished its prompt; those at their length leave."""
        finished: list[EngineResult] = []
        for sequence in ready:
            sequence.decode_one()
            added, first = self._times.get(sequence.request_id, (now, 0.0))
            if sequence.decoded == sequence.resumed + 1:
                self._times[sequence.request_id] = (added, now)
                first = now
            if sequence.decoded >= sequence.tokens_to_decode:
                self._running.remove(sequence)
                self._live.discard(sequence.request_id)
                self._prefilled.pop(sequence.request_id, None)
                self._times.pop(sequence.request_id, None)
                timing = RequestTiming(
                    sequence.request_id, sequence.prompt_tokens, sequence.decoded, added, first or now, now
                )
                self.requests.append(timing)
                finished.append(self._result(sequence))
        self._log_step(ready, finished)
        return finished

    def _now(self) -> float:
        return time.perf_counter() if self.timed else self.clock

    def _wait_until(self, deadline: float) -> None:
        """Sleep (no CPU, GIL released) until `deadline`, waking early by the lateness sleep has shown."""
        if not self.timed:
            self.clock = deadline
            return
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

    `hardware` (a planner preset), `max_num_seqs`, `max_num_batched_tokens` and `runner` come from the
    entry; `extra` may override the model (`weights_gb`, `kv_bytes_per_token`) and the context the KV
    cache is sized for (`context`), and turn the decode ledger on (`decode_ledger_dir`, decode_ledger.py).
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
        max_num_batched_tokens=spec.max_num_batched_tokens or DEFAULT_MAX_NUM_BATCHED_TOKENS,
        runner=spec.runner,
        max_model_len=spec.max_model_len or 2 * context,
        ledger=ledger_from_extra(extra, model=model),
    )
