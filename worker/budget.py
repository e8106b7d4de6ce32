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

from storage.settings import SharedModeSpec

log = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")


class MetricsError(ValueError):
    """The server's /metrics page lacks the gauges the budget needs."""


@dataclass(frozen=True)
class ServerLoad:
    """The server's scheduler state: requests decoding, requests queued, KV cache in use (0..1)."""

    running: int
    waiting: int
    kv_usage: float


@dataclass(frozen=True)
class Decision:
    """One step of the rule: the new limit, why, and how many batch requests to give back now."""

    limit: int
    reason: str  # "grow", "shrink" or "hold"
    online: int
    online_waiting: int
    room: int
    yield_count: int


def parse_load(text: str) -> ServerLoad:
    """Read running/waiting/KV usage from Prometheus text; counts add up over engines, KV takes the max."""
    counts = {RUNNING: 0.0, WAITING: 0.0}
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
    missing = {RUNNING, WAITING, KV_USAGE} - seen
    if missing:
        raise MetricsError(f"/metrics has no {', '.join(sorted(missing))}: is this a vLLM server?")
    return ServerLoad(running=round(counts[RUNNING]), waiting=round(counts[WAITING]), kv_usage=kv or 0.0)


def decide(limit: int, load: ServerLoad, *, ours: int, slots: int, knobs: SharedModeSpec, urgent: bool) -> Decision:
    """The next batch in-flight limit for `slots` server sequences, given the load and our share of it."""
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
    new = min(max(min(wanted, room, ceiling), floor), slots)
    reason = "grow" if new > limit else "shrink" if new < limit else "hold"
    yield_count = min(max(0, ours - new), online_waiting) if knobs.yield_to_online else 0
    return Decision(new, reason, online, online_waiting, room, yield_count)


class DispatchBudget:
    """The budget's state: the current limit, updated from each metrics sample; read by the runner."""

    def __init__(self, knobs: SharedModeSpec, *, slots: int) -> None:
        self.knobs = knobs
        self.slots = slots
        self.limit = min(knobs.min_inflight, slots)
        self.urgent = False
        self.last: Decision | None = None
        self.load: ServerLoad | None = None

    def set_urgent(self, urgent: bool) -> None:
        """Work is close to its deadline: allow `urgent_extra_inflight` more, even at online's expense."""
        self.urgent = urgent

    def unreachable(self) -> None:
        """/metrics did not answer: send nothing new until it does (a restarting server must not fail work)."""
        self.limit = 0

    def update(self, load: ServerLoad, *, ours: int) -> Decision:
        """Apply one metrics sample; return the decision (its `yield_count` is for the engine to act on)."""
        decision = decide(self.limit, load, ours=ours, slots=self.slots, knobs=self.knobs, urgent=self.urgent)
        if decision.reason == "shrink":
            log.debug(
                "budget %d -> %d (online %d, waiting %d)", self.limit, decision.limit, decision.online, load.waiting
            )
        self.limit, self.last, self.load = decision.limit, decision, load
        return decision
