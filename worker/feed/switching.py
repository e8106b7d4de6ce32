"""When a worker that serves several models should switch its one engine: a pure rule, no I/O.

Inputs: the loaded model (or none) and how long it has been loaded; per served model, its open work
grouped by deadline (seconds of engine work at the model's measured rate); what loading each model costs.
Output: stay, switch to a model, or idle, with a reason a person can read in the log.

The rule (docs/model-switching.md):
1. No served model has work: idle (whatever is loaded stays warm).
2. Nothing is loaded, or the loaded model has no work: switch at once to the model with work whose
   earliest deadline is nearest.
3. The loaded model has work: stay, unless another model's deadline is at risk (serving the loaded
   model's work first, then reloading, ends that model's work after a deadline) and switching now is
   expected to bring more requests in on time overall, counting the reload back. The candidate that
   saves the most wins; ties go to the nearest deadline.
4. Hysteresis: a model with work is never left within `min_residency_seconds` of being loaded.

Work is served earliest deadline first within a model; a deadline that passes expires its remaining
requests (they are dropped, not served late), which is how lateness is counted here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

Action = Literal["stay", "switch", "idle"]


@dataclass(frozen=True)
class DeadlineGroup:
    """Open requests of one model sharing a deadline (unix seconds), and their estimated engine seconds."""

    deadline: float
    requests: int
    work_seconds: float


@dataclass(frozen=True)
class Backlog:
    """One model's open work, grouped by deadline."""

    model: str
    groups: tuple[DeadlineGroup, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(sorted(self.groups, key=lambda g: g.deadline)))

    @property
    def requests(self) -> int:
        return sum(group.requests for group in self.groups)

    @property
    def work_seconds(self) -> float:
        return sum(group.work_seconds for group in self.groups)

    @property
    def earliest_deadline(self) -> float | None:
        return self.groups[0].deadline if self.groups else None


@dataclass(frozen=True)
class SwitchPolicy:
    """The rule's knobs: minimum residency, the load time assumed before one is measured, the least gain."""

    min_residency_seconds: float = 300.0
    default_reload_seconds: float = 120.0
    min_gain_requests: float = 0.5  # a switch must save at least one request, rounded


@dataclass(frozen=True)
class Decision:
    """Stay on, switch to, or idle with `model`; `rule` names the clause that decided, `reason` says why."""

    action: Action
    model: str | None
    rule: str
    reason: str


@dataclass(frozen=True)
class Served:
    """The outcome of serving a backlog from some start time."""

    late: float  # requests expected to expire before they are served
    end: float  # when the engine is free again


def serve(groups: Iterable[DeadlineGroup], start: float) -> Served:
    """Serve `groups` earliest deadline first from `start`: requests expected late, and the finish time."""
    clock, late = start, 0.0
    for group in sorted(groups, key=lambda g: g.deadline):
        if clock >= group.deadline:
            late += group.requests
            continue
        end = clock + group.work_seconds
        if end > group.deadline:
            late += group.requests * (end - group.deadline) / group.work_seconds
            end = group.deadline  # the rest expires and is never served
        clock = end
    return Served(late, clock)


def decide(
    *,
    loaded: str | None,
    resident_seconds: float,
    backlogs: Iterable[Backlog],
    reload_seconds: Mapping[str, float],
    now: float,
    policy: SwitchPolicy | None = None,
) -> Decision:
    """Apply the rule above to one snapshot of the backlog."""
    policy = policy or SwitchPolicy()
    by_model = {b.model: b for b in backlogs}
    waiting = sorted((b for b in by_model.values() if b.requests), key=lambda b: (b.groups[0].deadline, -b.requests))
    if not waiting:
        return Decision("idle", loaded, "idle", "idle: no served model has queued work")
    current = by_model.get(loaded) if loaded is not None else None

    def reload(model: str) -> float:
        return reload_seconds.get(model, policy.default_reload_seconds)

    if current is None or not current.requests:
        target = waiting[0]
        rule = "load" if loaded is None else "drained"
        head = "no model loaded; loading" if loaded is None else f"{loaded} has no queued work; switching to"
        return Decision("switch", target.model, rule, f"{head} {_describe(target, now)}")
    others = [b for b in waiting if b.model != loaded]
    if not others:
        return Decision("stay", loaded, "stay", f"staying on {loaded}: {_work(current)}; no other model has work")
    options = [_option(current, other, now, reload(other.model), reload(current.model)) for other in others]
    best = max(options, key=lambda o: (o.gain, -(o.other.earliest_deadline or 0.0)))
    if best.gain >= policy.min_gain_requests:
        if resident_seconds < policy.min_residency_seconds:
            reason = (
                f"staying on {loaded}: loaded {_duration(resident_seconds)} ago "
                f"(minimum residency {_duration(policy.min_residency_seconds)}), although {best.summary()}"
            )
            return Decision("stay", loaded, "residency", reason)
        return Decision("switch", best.other.model, "deadline", f"{best.summary()}; switching to {best.other.model}")
    at_risk = [o for o in options if o.stay_late > 0]
    if at_risk:
        worst = max(at_risk, key=lambda o: o.stay_late)
        reason = f"staying on {loaded}: {worst.summary()}, but switching would not bring more requests in on time"
        return Decision("stay", loaded, "no_gain", reason)
    nearest = others[0]
    reason = (
        f"staying on {loaded}: {_work(current)}; {nearest.model} ({_work(nearest)}) fits after it, "
        f"deadline in {_duration(_until(nearest, now))}; switching would cost "
        f"{_duration(reload(nearest.model))} + {_duration(reload(current.model))} of reloads"
    )
    if len(others) > 1:
        reason += f" (+{len(others) - 1} more models with work)"
    return Decision("stay", loaded, "stay", reason)


@dataclass(frozen=True)
class _Option:
    """Staying on `current` then serving `other`, against switching to `other` now and coming back."""

    current: Backlog
    other: Backlog
    now: float
    reload_other: float
    stay_late: float  # `other`'s requests expected late if we stay
    gain: float  # requests (both models) brought in on time by switching

    def summary(self) -> str:
        other, current = self.other, self.current
        return (
            f"{other.model}'s deadline in {_duration(_until(other, self.now))} is at risk: "
            f"{current.model}'s {_duration(current.work_seconds)} of work + {_duration(self.reload_other)} reload "
            f"+ {other.model}'s {_duration(other.work_seconds)} of work leaves ~{_count(self.stay_late)} of "
            f"{_count(other.requests)} requests late"
        )


def _option(current: Backlog, other: Backlog, now: float, reload_other: float, reload_current: float) -> _Option:
    stay_current = serve(current.groups, now)
    stay_other = serve(other.groups, stay_current.end + reload_other)
    switch_other = serve(other.groups, now + reload_other)
    switch_current = serve(current.groups, switch_other.end + reload_current)
    gain = (stay_current.late + stay_other.late) - (switch_other.late + switch_current.late)
    return _Option(current, other, now, reload_other, stay_other.late, gain)


def _describe(backlog: Backlog, now: float) -> str:
    return f"{backlog.model} ({_work(backlog)}, earliest deadline in {_duration(_until(backlog, now))})"


def _work(backlog: Backlog) -> str:
    return f"{_count(backlog.requests)} requests, {_duration(backlog.work_seconds)} of work"


def _until(backlog: Backlog, now: float) -> float:
    return (backlog.earliest_deadline or now) - now


def _count(value: float) -> str:
    return f"{round(value):,}"


def _duration(seconds: float) -> str:
    """A human duration: '45 s', '12 min', '3.5 h'."""
    if seconds < 120:
        return f"{max(seconds, 0.0):.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
