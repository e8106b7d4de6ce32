"""The dispatch budget of shared mode: how many batch requests may be in flight on a server that also
serves online users.

Every `poll_seconds` the HTTP engine reads the server's Prometheus `/metrics` (`vllm:num_requests_running`,
`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`) and calls `DispatchBudget.update` with them and
the number of batch requests it has on the server itself (`ours`). The rule (`decide`, pure):

    online          = running + waiting - ours             (requests that are not ours; never below 0)
    blocked         = running >= slots or kv_usage >= kv_usage_high
    online_waiting  = min(waiting, online) if blocked, else 0
    room            = slots - online - headroom_seqs       (free slots, minus a reserve for arrivals)
    limit'          = limit * shrink_factor   if online_waiting > 0 or kv_usage >= kv_usage_high
                      limit + grow_step       otherwise
    limit'          = clamp(limit', floor, min(room, ceiling)), at most `slots`
    floor           = min_inflight (+ urgent_extra_inflight while the runner says work is near its deadline)
    yield           = min(ours - limit', online_waiting)   if yield_to_online, else 0

With `latency_slack` set, a second cap keeps every engine step (and with it each online user's time per
token and time to first token) within that share of what it would be without batch work. The step-time
model is the roofline one of the README: a decode step reads the weights once plus each sequence's KV
cache, so `step = fixed + per_seq * sequences`. `StepModel` fits it to the server's own inter-token
latency (`vllm:inter_token_latency_seconds` sum and count, per poll interval) against the sequences
running, by least squares with old samples fading. Batch sequences add `ours * per_seq` to a step of
`fixed + per_seq * online` (online counted as at least 1: the user who may arrive next), so

    slack_cap       = max(1, floor(latency_slack * (fixed / per_seq + max(online, 1))))
    limit'          = min(limit', slack_cap)   (the urgent floor still wins)

The cap never goes below one sequence: at 0 no batch work would run, no new samples would come, and a
fit that said "too steep" could never be corrected (the batch would starve until its deadline's urgency
floor). One sequence keeps work moving and the fit fresh. The cap only stops new sends: calls above it
finish (a cancelled call is sent again later and its prefill runs twice, which costs the online users
more than letting a short call end).

On a GPU, decode is memory-bound and `fixed / per_seq` (weight bytes over one sequence's KV bytes) is in
the hundreds, so the cap leaves most slots to batch work; on a CPU the step is compute-bound, the ratio is
small and the cap admits only a few sequences. Until the fit has samples at several batch sizes the cap
does not apply (the budget's own climb provides them).

`online_waiting` errs towards online: priority scheduling puts online work first in the waiting queue,
so any waiting request that may be online counts as online. But a request waits only behind full slots or
a full KV cache; with a free slot and KV room, a waiting request (often one of ours, just sent) is merely
arriving and is admitted at the next engine step, so it counts as nobody waiting.

Additive increase, multiplicative decrease: probe for idle capacity slowly, give it back at once. `room`
caps batch work so that online requests find a free slot on arrival: vLLM's scheduler never preempts a
running request to admit a waiting one, whatever their priorities (it preempts only when a running request
needs KV blocks), so a slot held by batch work makes an arriving online request wait for that batch
request to finish. When
online requests wait anyway (a burst), the engine cancels `yield` of its youngest batch requests (the
least work lost) and re-sends them once the budget allows; closing the HTTP connection makes vLLM abort
the sequence and free its slot. `urgent` raises the floor above what the rule allows: capacity taken from
online traffic, bounded by `urgent_extra_inflight`, for work close to its deadline.

The knobs live in `storage.settings.SharedModeSpec`; docs/shared-mode.md explains how to set them.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from storage.registry import SharedModeSpec
from worker.engine.prefill_pace import PrefillPacer

log = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
ITL_SUM = "vllm:inter_token_latency_seconds_sum"
ITL_COUNT = "vllm:inter_token_latency_seconds_count"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")


class MetricsError(ValueError):
    """The server's /metrics page lacks the gauges the budget needs."""


@dataclass(frozen=True)
class ServerLoad:
    """The server's scheduler state: requests decoding, requests queued, KV cache in use (0..1)."""

    running: int
    waiting: int
    kv_usage: float
    itl_seconds: float | None = None  # inter-token latency counters since the server started (None: absent)
    itl_tokens: float | None = None


@dataclass(frozen=True)
class Decision:
    """One step of the rule: the new limit, why, and how many batch requests to give back now."""

    limit: int
    reason: str  # "grow", "shrink" or "hold"
    online: int
    online_waiting: int
    room: int
    yield_count: int
    slack_cap: int | None = None


class StepModel:
    """`step_seconds = fixed + per_seq * sequences`, fitted by least squares; each sample fades by `decay`."""

    def __init__(self, *, decay: float = 0.995, min_weight: float = 5.0) -> None:
        self.decay, self.min_weight = decay, min_weight
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self._last: tuple[float, float] | None = None

    def observe(self, sequences: float, step_seconds: float) -> None:
        d = self.decay
        self._w = self._w * d + 1
        self._x = self._x * d + sequences
        self._y = self._y * d + step_seconds
        self._xx = self._xx * d + sequences * sequences
        self._xy = self._xy * d + sequences * step_seconds

    def fit(self) -> tuple[float, float] | None:
        """(fixed, per_seq) in seconds; None until samples span batch sizes ~1 sequence apart. While recent
        samples sit at one batch size (the cap holds it there), the last fit that had the spread stands."""
        spread = self._w * self._xx - self._x * self._x
        if self._w < self.min_weight or spread < 0.25 * self._w * self._w:
            return self._last
        per_seq = (self._w * self._xy - self._x * self._y) / spread
        fixed = (self._y - per_seq * self._x) / self._w
        self._last = (max(fixed, 0.0), per_seq)
        return self._last


def slack_cap(step: tuple[float, float] | None, *, slack: float | None, online: int) -> int | None:
    """How many batch sequences keep a step within `slack` of the online-only step (at least 1); None: no cap."""
    if slack is None or step is None:
        return None
    fixed, per_seq = step
    if per_seq <= 0:  # adding sequences costs nothing measurable: memory-bound, no cap
        return None
    return max(1, int(slack * (fixed / per_seq + max(online, 1))))


def parse_load(text: str) -> ServerLoad:
    """Read running/waiting/KV usage from Prometheus text; counts add up over engines, KV takes the max."""
    counts = {RUNNING: 0.0, WAITING: 0.0}
    latency = {ITL_SUM: 0.0, ITL_COUNT: 0.0}
    kv: float | None = None
    seen: set[str] = set()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, value = match.group(1), float(match.group(2))
        if name in counts:
            counts[name] += value
            seen.add(name)
        elif name == KV_USAGE:
            kv = value if kv is None else max(kv, value)
            seen.add(name)
        elif name in latency:
            latency[name] += value
            seen.add(name)
    missing = {RUNNING, WAITING, KV_USAGE} - seen
    if missing:
        raise MetricsError(f"/metrics has no {', '.join(sorted(missing))}: is this a vLLM server?")
    timed = ITL_SUM in seen and ITL_COUNT in seen
    return ServerLoad(
        running=round(counts[RUNNING]),
        waiting=round(counts[WAITING]),
        kv_usage=kv or 0.0,
        itl_seconds=latency[ITL_SUM] if timed else None,
        itl_tokens=latency[ITL_COUNT] if timed else None,
    )


def decide(
    limit: int,
    load: ServerLoad,
    *,
    ours: int,
    slots: int,
    knobs: SharedModeSpec,
    urgent: bool,
    step: tuple[float, float] | None = None,
) -> Decision:
    """The next batch in-flight limit for `slots` server sequences, given the load and our share of it
    (and, with `latency_slack`, the fitted step-time model `step`)."""
    online = max(0, load.running + load.waiting - ours)
    blocked = load.running >= slots or load.kv_usage >= knobs.kv_usage_high
    online_waiting = min(load.waiting, online) if blocked else 0
    room = slots - online - knobs.headroom_seqs
    ceiling = min(knobs.max_inflight or slots, slots)
    floor = knobs.min_inflight + (knobs.urgent_extra_inflight if urgent else 0)
    if online_waiting > 0 or load.kv_usage >= knobs.kv_usage_high:
        wanted = int(limit * knobs.shrink_factor)
    else:
        wanted = limit + knobs.grow_step
    cap = slack_cap(step, slack=knobs.latency_slack, online=online)
    if cap is not None:
        wanted = min(wanted, cap)
    new = min(max(min(wanted, room, ceiling), floor), slots)
    reason = "grow" if new > limit else "shrink" if new < limit else "hold"
    yield_count = min(max(0, ours - new), online_waiting) if knobs.yield_to_online else 0
    return Decision(new, reason, online, online_waiting, room, yield_count, cap)


class DispatchBudget:
    """The budget's state: the current limit, updated from each metrics sample; read by the runner."""

    def __init__(self, knobs: SharedModeSpec, *, slots: int) -> None:
        self.knobs = knobs
        self.slots = slots
        self.limit = min(knobs.min_inflight, slots)
        self.urgent = False
        self.last: Decision | None = None
        self.load: ServerLoad | None = None
        self.steps = StepModel()
        self._warned_untimed = False
        per_step = knobs.batch_prefill_tokens_per_step
        # Staged pieces come k tokens at a time: saving more than half a piece would let two share a step.
        burst = knobs.batch_prefill_stage_tokens / 2 or None
        self.pacer = None if per_step is None else PrefillPacer(per_step, burst_tokens=burst)

    @property
    def floor(self) -> int:
        """Batch requests allowed whatever the load (`min_inflight`, raised while work is urgent)."""
        return min(self.knobs.min_inflight + (self.knobs.urgent_extra_inflight if self.urgent else 0), self.slots)

    def set_urgent(self, urgent: bool) -> None:
        """Work is close to its deadline: allow `urgent_extra_inflight` more, even at online's expense."""
        self.urgent = urgent

    def unreachable(self) -> None:
        """/metrics did not answer: send nothing new until it does (a restarting server must not fail work)."""
        self.limit = 0

    def update(self, load: ServerLoad, *, ours: int) -> Decision:
        """Apply one metrics sample; return the decision (its `yield_count` is for the engine to act on)."""
        self._observe_step(load)
        step = self.steps.fit()
        decision = decide(
            self.limit, load, ours=ours, slots=self.slots, knobs=self.knobs, urgent=self.urgent, step=step
        )
        if decision.reason == "shrink":
            log.debug(
                "budget %d -> %d (online %d, waiting %d)", self.limit, decision.limit, decision.online, load.waiting
            )
        self.limit, self.last, self.load = decision.limit, decision, load
        return decision

    def _observe_step(self, load: ServerLoad) -> None:
        """One sample for the step model: mean inter-token latency since the last poll vs sequences running."""
        last = self.load
        timed_knobs = self.knobs.latency_slack is not None or self.pacer is not None
        if load.itl_seconds is None and timed_knobs and not self._warned_untimed:
            log.warning(
                "latency_slack or batch_prefill_tokens_per_step is set but /metrics has no %s: no slack cap, and"
                " prefill pacing sends one batch request at a time",
                ITL_SUM,
            )
            self._warned_untimed = True
        if last is None or load.itl_seconds is None or last.itl_seconds is None:
            return
        assert load.itl_tokens is not None and last.itl_tokens is not None
        tokens = load.itl_tokens - last.itl_tokens
        if self.pacer is not None and tokens > 0:  # the server's mean step since the last poll paces prefill
            self.pacer.observe_step((load.itl_seconds - last.itl_seconds) / tokens)
        if tokens < 20 or load.running == 0 or last.running == 0:  # too few tokens, or idle part of the interval
            return
        self.steps.observe((load.running + last.running) / 2, (load.itl_seconds - last.itl_seconds) / tokens)
