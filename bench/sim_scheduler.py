"""The scheduler of the GPU-timed vLLM server (bench/sim_server.py): vLLM's v1 priority scheduler in miniature,
each step lasting storage/planning/step_time.py's time for what it carried. No clock of its own: `schedule()`
plans a step and says how long it lasts, `complete(plan, end)` applies it at `end` (a test's virtual clock or
the server's real one).

What it keeps from vLLM (vllm/v1/core/sched/scheduler.py, `--scheduling-policy priority`):
- the running requests are scheduled first, in the order they were admitted: one token each while decoding,
  their next prompt chunk while prefilling, all within `max_num_batched_tokens` tokens a step (chunked
  prefill: decodes and chunks share a step);
- then, with budget and a free slot left (at most `max_num_seqs` running), waiting requests are admitted in
  (priority, arrival) order: a smaller value first, so online work (priority 0) is admitted before batch work;
- a running request is never preempted to admit a waiting one; when the KV cache cannot hold a running
  request's next tokens, the running request with the largest (priority, arrival) is preempted (batch work,
  youngest first): its KV is freed and it goes back to the waiting queue to prefill its prompt and the
  tokens it already produced again (recompute), and no waiting request is admitted in that step;
- the step that prefills a prompt's last chunk yields its first token; every later step yields one more;
- with `long_prefill_token_threshold`, one request's chunk is at most that many tokens while other requests are
  running or waiting (vLLM's `--long-prefill-token-threshold`);
- automatic prefix caching (bench/sim_prefix_cache.py): a request that carries its prompt's block hashes starts
  from the longest cached prefix of whole blocks and computes only the rest; finished requests' blocks stay
  cached until the KV cache needs their room (LRU).

The step's time: B decoding sequences attending to their own contexts (the formula's memory term takes
B x KV x context; the mean context of this step's decoders is passed, which gives the same bytes), P prompt
tokens prefilled and C earlier-chunk tokens those chunks attend to:
`step_seconds(shape, hardware, mean context, StepLoad(B, P, C))`.

Per-slot state lives in numpy arrays so a step costs tens of microseconds at 384 sequences; only the
requests that stream (online users) and those that finish are touched one by one.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bench.sim_prefix_cache import BLOCK_TOKENS, PrefixCache
from storage.planning.node import Hardware, ModelShape
from storage.planning.step_time import StepLoad, step_seconds

__all__ = ["BLOCK_TOKENS", "SimCounters", "SimRequest", "SimScheduler", "StepPlan", "StepTrace"]


@dataclass(eq=False)
class SimRequest:
    """One request on the simulated server: its shape, priority and what became of it (times in `complete`'s clock)."""

    prompt_tokens: int
    max_tokens: int
    priority: int = 0
    arrival: float = 0.0
    stream: bool = False
    on_tokens: Callable[[SimRequest], None] | None = None  # called when it gets tokens or finishes
    block_hashes: tuple[int, ...] = ()  # its prompt's full blocks (bench/sim_prefix_cache.py); (): never cached
    output_tokens: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None
    preemptions: int = 0
    aborted: bool = False
    serial: int = -1
    slot: int = -1

    @property
    def finished(self) -> bool:
        """It produced every token it asked for, or was aborted."""
        return self.finished_at is not None or self.aborted


@dataclass(frozen=True)
class StepPlan:
    """One planned step: the slots it carries (and which request held each), the tokens each gets, its load."""

    slots: np.ndarray
    serials: np.ndarray
    tokens: np.ndarray
    load: StepLoad
    context: int
    seconds: float

    @property
    def empty(self) -> bool:
        """Nothing to run (no request holds a slot or could be admitted)."""
        return not len(self.slots)


@dataclass(frozen=True)
class StepTrace:
    """One completed step's make-up (kept while `SimScheduler.trace` is a list): when it ended, how long it took,
    and what it carried by kind (a batch request with `max_tokens` 1 counts as a staged piece)."""

    end: float
    seconds: float
    batch_seconds: float  # what its batch work added: `seconds` less the same step's online part alone (or 0)
    online_prompts: int
    online_prefill: int
    online_decodes: int
    piece_prefill: int
    batch_prefill: int
    batch_decodes: int


@dataclass
class SimCounters:
    """Totals since start, as vLLM's /metrics counts them (and a few the benchmark reads)."""

    steps: int = 0
    busy_seconds: float = 0.0
    prompt_tokens: int = 0
    generation_tokens: dict[str, int] = field(default_factory=lambda: {"online": 0, "batch": 0})
    preemptions: int = 0
    itl_seconds: float = 0.0
    itl_tokens: int = 0
    finished: int = 0
    aborted: int = 0


class SimScheduler:
    """Priority scheduling with chunked prefill over `max_num_seqs` slots; step times from the formula."""

    def __init__(
        self,
        *,
        shape: ModelShape,
        hardware: Hardware,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        kv_cache_tokens: int,
        long_prefill_token_threshold: int = 0,
    ) -> None:
        if min(max_num_seqs, max_num_batched_tokens, kv_cache_tokens) < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and the KV cache must be positive")
        self.shape, self.hardware = shape, hardware
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.kv_cache_blocks = kv_cache_tokens // BLOCK_TOKENS
        self.long_prefill_token_threshold = long_prefill_token_threshold  # 0: a prompt chunk takes what budget is left
        n = max_num_seqs
        self._serial = np.full(n, -1, dtype=np.int64)  # -1: a free slot
        self._target = np.zeros(n, dtype=np.int64)  # tokens to compute before the next token is sampled
        self._computed = np.zeros(n, dtype=np.int64)  # tokens whose KV the request holds
        self._order = np.zeros(n, dtype=np.int64)  # admission order (vLLM's `running` list)
        self._priority = np.zeros(n, dtype=np.int64)
        self._arrival = np.zeros(n, dtype=np.float64)
        self._last_token = np.zeros(n, dtype=np.float64)
        self._out = np.zeros(n, dtype=np.int64)  # output tokens so far
        self._max_out = np.zeros(n, dtype=np.int64)
        self._stream = np.zeros(n, dtype=bool)
        self._hashes = np.zeros(n, dtype=np.int64)  # full prompt blocks with a hash
        self._cached = np.zeros(n, dtype=np.int64)  # of those, the leading ones held in the prefix cache
        self.prefix_cache = PrefixCache(self.kv_cache_blocks)
        self._preempted_this_step = False
        self._requests: list[SimRequest | None] = [None] * n
        self._waiting: list[tuple[int, float, int, SimRequest]] = []  # heap of (priority, arrival, serial, request)
        self._serials = itertools.count()
        self._admitted = itertools.count()
        self.waiting_count = 0  # live requests in the heap (aborted ones leave lazily)
        self.counters = SimCounters()
        self.trace: list[StepTrace] | None = None  # a list: every completed step's make-up is appended to it

    # -- requests in and out -------------------------------------------------------------------

    def add(self, request: SimRequest) -> None:
        """Queue a request (it is admitted at a later step, by priority then arrival)."""
        if request.prompt_tokens < 1 or request.max_tokens < 1:
            raise ValueError("a request needs at least one prompt token and one output token")
        request.serial = next(self._serials)
        self._push(request)

    def abort(self, request: SimRequest) -> None:
        """Drop a request (its client went away): its slot and KV blocks are free for the next step."""
        if request.finished:
            return
        request.aborted = True
        self.counters.aborted += 1
        if request.slot >= 0:
            self._free(request.slot)
        else:
            self.waiting_count -= 1

    @property
    def running_count(self) -> int:
        """Requests holding a slot (vLLM's num_requests_running)."""
        return int((self._serial >= 0).sum())

    def kv_usage(self) -> float:
        """Share of the KV cache's blocks in use (vLLM's kv_cache_usage_perc, 0..1)."""
        return self._blocks(self._computed[self._serial >= 0]) / self.kv_cache_blocks

    def has_work(self) -> bool:
        """Something is running or waiting."""
        return self.waiting_count > 0 or bool((self._serial >= 0).any())

    # -- one step ------------------------------------------------------------------------------

    def schedule(self) -> StepPlan:
        """Plan the next step: running requests first (admission order), then waiting ones by priority."""
        budget = self.max_num_batched_tokens
        while True:
            slots = np.flatnonzero(self._serial >= 0)
            slots = slots[np.argsort(self._order[slots], kind="stable")]
            need = np.maximum(self._target[slots] - self._computed[slots], 1)
            if self._chunk_cap(len(slots)):
                need = np.minimum(need, self.long_prefill_token_threshold)
            before = np.cumsum(need) - need
            tokens = np.clip(budget - before, 0, need)
            if self._blocks(self._computed[slots] + tokens) <= self.kv_cache_blocks:
                break
            self._preempt_one(slots)
        left = budget - int(tokens.sum())
        self.prefix_cache.evict(self._blocks(self._computed[slots] + tokens))
        if not self._preempted_this_step:
            slots, tokens = self._admit(slots, tokens, left)
        self._preempted_this_step = False
        keep = tokens > 0
        slots, tokens = slots[keep], tokens[keep]
        return self._plan(slots, tokens)

    def complete(self, plan: StepPlan, end: float) -> list[SimRequest]:
        """Apply a step that ended at `end`: tokens computed, one sampled per ready request; returns the requests
        that got a token and stream, or finished (their `on_tokens` is called too). Vectorised but for those."""
        counters = self.counters
        counters.steps += 1
        counters.busy_seconds += plan.seconds
        counters.prompt_tokens += int(plan.load.prefill_tokens)
        if self.trace is not None:
            self.trace.append(self._trace(plan, end))
        live = self._serial[plan.slots] == plan.serials  # an abort during the step freed (or reused) a slot
        slots, tokens = plan.slots[live], plan.tokens[live]
        self._computed[slots] += tokens
        self._cache_blocks(slots)
        ready = slots[self._computed[slots] >= self._target[slots]]
        self._out[ready] += 1
        out = self._out[ready]
        later = ready[out > 1]
        counters.itl_seconds += float((end - self._last_token[later]).sum())
        counters.itl_tokens += len(later)
        online = int((self._priority[ready] <= 0).sum())
        counters.generation_tokens["online"] += online
        counters.generation_tokens["batch"] += len(ready) - online
        self._target[ready] = self._computed[ready] + 1  # decode: one more token's KV, then the next sample
        self._last_token[ready] = end
        done = out >= self._max_out[ready]
        for slot in ready[out == 1].tolist():
            request = self._requests[slot]
            assert request is not None
            request.first_token_at = end
        touched: list[SimRequest] = []
        notify = done | self._stream[ready]
        for slot, finished in zip(ready[notify].tolist(), done[notify].tolist(), strict=True):
            request = self._requests[slot]
            assert request is not None
            request.output_tokens = int(self._out[slot])
            if finished:
                request.finished_at = end
                counters.finished += 1
                self._free(slot)
            touched.append(request)
        for request in touched:
            if request.on_tokens is not None:
                request.on_tokens(request)
        return touched

    # -- helpers -------------------------------------------------------------------------------

    def _admit(self, slots: np.ndarray, tokens: np.ndarray, left: int) -> tuple[np.ndarray, np.ndarray]:
        """Waiting requests into free slots by (priority, arrival), while budget, a slot and KV blocks remain."""
        new_slots: list[int] = []
        new_tokens: list[int] = []
        used = self._blocks(self._computed[slots] + tokens)
        free = np.flatnonzero(self._serial < 0).tolist()
        while left > 0 and free and self._waiting:
            _, _, serial, request = self._waiting[0]
            if request.aborted or request.serial != serial:
                heapq.heappop(self._waiting)
                continue
            target = request.prompt_tokens + request.output_tokens  # a preempted request recomputes its output
            hits = self.prefix_cache.lookup(request.block_hashes, target) if request.block_hashes else 0
            chunk = min(target - hits * BLOCK_TOKENS, left)
            if self._chunk_cap(len(slots) + len(new_slots)):
                chunk = min(chunk, self.long_prefill_token_threshold)
            blocks = self._blocks(np.array([hits * BLOCK_TOKENS + chunk]))
            if used + blocks > self.kv_cache_blocks:
                break
            heapq.heappop(self._waiting)
            self.waiting_count -= 1
            slot = free.pop(0)
            self._take(slot, request, target, hits)
            new_slots.append(slot)
            new_tokens.append(chunk)
            left -= chunk
            used += blocks
        if not new_slots:
            return slots, tokens
        return np.concatenate([slots, new_slots]), np.concatenate([tokens, new_tokens])

    def _chunk_cap(self, running: int) -> bool:
        """vLLM caps one request's prompt chunk at `long_prefill_token_threshold` when others could use the step."""
        return self.long_prefill_token_threshold > 0 and running + self.waiting_count > 1

    def _plan(self, slots: np.ndarray, tokens: np.ndarray) -> StepPlan:
        computed = self._computed[slots]
        decoding = computed >= self._target[slots] - 1  # one token to compute: the last sample's
        decoding &= computed > 0
        prefill = ~decoding
        decoders = int(decoding.sum())
        context = round(float(computed[decoding].mean())) + 1 if decoders else 1
        load = StepLoad(
            decode_seqs=decoders,
            prefill_tokens=int(tokens[prefill].sum()),
            prefill_context_tokens=int(computed[prefill].sum()),
        )
        seconds = step_seconds(self.shape, self.hardware, context, load) if len(slots) else 0.0
        return StepPlan(slots, self._serial[slots].copy(), tokens, load, context, seconds)

    def _trace(self, plan: StepPlan, end: float) -> StepTrace:
        """What a step carried, by kind: online and batch prompt tokens (staged pieces, one-token batch requests,
        apart), prompts, decodes. Read before `complete` moves the counts on."""
        slots, tokens = plan.slots, plan.tokens
        computed = self._computed[slots]
        prefill = ~((computed >= self._target[slots] - 1) & (computed > 0))
        batch = self._priority[slots] > 0
        piece = batch & (self._max_out[slots] == 1)
        online = StepLoad(
            decode_seqs=int((~prefill & ~batch).sum()), prefill_tokens=int(tokens[prefill & ~batch].sum())
        )
        return StepTrace(
            end=end,
            seconds=plan.seconds,
            batch_seconds=plan.seconds
            - (step_seconds(self.shape, self.hardware, plan.context, online) if online.tokens else 0),
            online_prompts=int((prefill & ~batch).sum()),
            online_prefill=int(tokens[prefill & ~batch].sum()),
            online_decodes=int((~prefill & ~batch).sum()),
            piece_prefill=int(tokens[prefill & piece].sum()),
            batch_prefill=int(tokens[prefill & batch & ~piece].sum()),
            batch_decodes=int((~prefill & batch).sum()),
        )

    def _preempt_one(self, slots: np.ndarray) -> None:
        """Free the running request with the largest (priority, arrival) and queue it again (recompute)."""
        victims = np.lexsort((self._arrival[slots], self._priority[slots]))
        slot = int(slots[victims[-1]])
        request = self._requests[slot]
        assert request is not None
        request.output_tokens = int(self._out[slot])
        self._free(slot)
        request.preemptions += 1
        self.counters.preemptions += 1
        self._preempted_this_step = True
        request.serial = next(self._serials)
        self._push(request)

    def _push(self, request: SimRequest) -> None:
        heapq.heappush(self._waiting, (request.priority, request.arrival, request.serial, request))
        self.waiting_count += 1

    def _take(self, slot: int, request: SimRequest, target: int, hits: int) -> None:
        self._serial[slot] = request.serial
        self._target[slot] = target
        self._computed[slot] = hits * BLOCK_TOKENS
        self._hashes[slot] = len(request.block_hashes)
        self._cached[slot] = hits
        self.prefix_cache.hold(request.block_hashes[:hits])
        self._order[slot] = next(self._admitted)
        self._priority[slot] = request.priority
        self._arrival[slot] = request.arrival
        self._out[slot] = request.output_tokens
        self._max_out[slot] = request.max_tokens
        self._stream[slot] = request.stream
        self._requests[slot] = request
        request.slot = slot

    def _free(self, slot: int) -> None:
        request = self._requests[slot]
        if request is not None:
            request.slot = -1
            self.prefix_cache.release(request.block_hashes[: self._cached[slot]])
        self._cached[slot] = 0
        self._serial[slot] = -1
        self._computed[slot] = 0
        self._requests[slot] = None

    def _cache_blocks(self, slots: np.ndarray) -> None:
        """The prompt blocks these slots filled in this step join the prefix cache (held until the request ends)."""
        full = np.minimum(self._computed[slots] // BLOCK_TOKENS, self._hashes[slots])
        grew = full > self._cached[slots]
        for slot, upto in zip(slots[grew].tolist(), full[grew].tolist(), strict=True):
            request = self._requests[slot]
            assert request is not None
            self.prefix_cache.hold(request.block_hashes[self._cached[slot] : upto])
            self._cached[slot] = upto

    @staticmethod
    def _blocks(tokens: np.ndarray) -> int:
        return int(((tokens + BLOCK_TOKENS - 1) // BLOCK_TOKENS).sum())
