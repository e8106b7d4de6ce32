"""Queue-state gauges, read from the database at scrape time by a custom collector.

The database is the truth, so depths, deadlines and goodput are read from it rather than counted in some
process: any API replica reports the same numbers (dashboards take `max` across instances). One snapshot
is read in one short transaction and reused for `metrics_cache_seconds`; concurrent scrapes wait for the
one read in progress instead of starting their own, so a scrape storm costs one read per interval.
Goodput, the heaviest read, is refreshed every sixth interval (once a minute by default).

Tenants are labelled by name for the `metrics_tenants_max` oldest tenants (a stable set, so a series never
changes hands); every other tenant is summed into `tenant="_other"`. Models are the registry's; rows of any
other model (removed since, or the unserved name of a refused batch) count as `model="_other"`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from storage.clock import now_f
from storage.db import transaction
from storage.finance.goodput import goodput_by_model
from storage.queue.state import (
    DeadlineState,
    batches_by_status,
    deadline_state,
    finished_requests,
    oldest_queued,
    open_requests,
)
from storage.settings import get_settings
from storage.tenants import first_tenants

log = logging.getLogger(__name__)

OTHER_TENANTS = "_other"
OTHER_MODELS = "_other"
GOODPUT_REFRESH_INTERVALS = 6  # goodput is re-read every 6th cache interval (a minute by default)
FUTURE_SECONDS = 366 * 86400  # open batches' deadlines lie ahead (completion windows are days at most)
GOODPUT_RESULTS = ("completed_on_time", "completed_late", "failed", "expired", "cancelled", "open")


@dataclass
class Snapshot:
    """One read of the queue's state."""

    read_at: float = 0.0
    read_seconds: float = 0.0
    ok: bool = False
    open: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (model, tenant, state)
    finished: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (model, tenant, outcome)
    batches: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, status)
    oldest: dict[str, int] = field(default_factory=dict)
    deadlines: dict[str, DeadlineState] = field(default_factory=dict)
    goodput: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> counts and "ratio"
    goodput_at: float = 0.0


def _tenant_label(names: dict[str, str], tenant_id: str) -> str:
    return names.get(tenant_id, OTHER_TENANTS)


def _model_label(served: set[str], model: str) -> str:
    """A served model's name; anything else (a model since removed, a refused batch's unserved name) is "_other"."""
    return model if model in served else OTHER_MODELS


def read_snapshot(previous: Snapshot | None = None) -> Snapshot:
    """Read the queue's state in one transaction (goodput carried over from `previous` while fresh)."""
    settings = get_settings()
    started = time.perf_counter()
    at = now_f()
    snap = Snapshot(read_at=time.monotonic())
    served = set(settings.served_models())
    with transaction() as session:
        names = first_tenants(session, limit=settings.metrics_tenants_max)
        open_counts: dict[tuple[str, str, str], int] = defaultdict(int)
        for model, tenant, status, count in open_requests(session):
            open_counts[(_model_label(served, model), _tenant_label(names, tenant), status)] += count
        finished: dict[tuple[str, str, str], int] = defaultdict(int)
        for model, tenant, completed, failed in finished_requests(session):
            key = (_model_label(served, model), _tenant_label(names, tenant))
            finished[(*key, "completed")] += completed
            finished[(*key, "failed")] += failed
        snap.open, snap.finished = dict(open_counts), dict(finished)
        batches: dict[tuple[str, str], int] = defaultdict(int)
        for model, status, count in batches_by_status(session):
            batches[(_model_label(served, model), status)] += count
        snap.batches = dict(batches)
        snap.oldest = {m: at for m, at in oldest_queued(session).items() if m in served}
        snap.deadlines = {m: deadline_state(session, model=m, settings=settings, at=at) for m in sorted(served)}
        refresh = GOODPUT_REFRESH_INTERVALS * settings.metrics_cache_seconds
        if previous is not None and time.monotonic() - previous.goodput_at < refresh:
            snap.goodput, snap.goodput_at = previous.goodput, previous.goodput_at
        else:
            window = settings.metrics_goodput_window_seconds
            # Recent and current batches: deadlines from `window` ago on (open ones count once decided).
            results = goodput_by_model(session, deadline_from=int(at) - window, deadline_to=int(at) + FUTURE_SECONDS)
            snap.goodput = {m: _goodput_values(result.to_json()) for m, result in results.items() if m in served}
            snap.goodput_at = time.monotonic()
    snap.read_seconds = time.perf_counter() - started
    snap.ok = True
    return snap


def _goodput_values(result: dict[str, object]) -> dict[str, float]:
    """The counts by result, and the ratio over decided requests (open ones are not decided yet)."""
    values = {name: float(result[name]) for name in GOODPUT_RESULTS}  # type: ignore[arg-type]
    decided = float(result["accepted"]) - values["open"]  # type: ignore[arg-type]
    if decided > 0:
        values["ratio"] = values["completed_on_time"] / decided
    return values


class QueueStateCollector(Collector):
    """Yields the queue-state families from a cached snapshot; one database read per cache interval."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._database = ""  # the snapshot's database: another one (tests, a re-configured process) reads anew

    def snapshot(self) -> Snapshot:
        """The cached snapshot, re-read once it is older than `metrics_cache_seconds` (single flight)."""
        settings = get_settings()
        with self._lock:
            current = self._snapshot if self._database == settings.sqlalchemy_url else None
            if current is not None and time.monotonic() - current.read_at < settings.metrics_cache_seconds:
                return current
            self._database = settings.sqlalchemy_url
            try:
                self._snapshot = read_snapshot(current)
            except Exception as error:  # a scrape must answer even when the database does not
                log.warning("queue metrics: database read failed: %s", error)  # counted by storage/db.py
                stale = current or Snapshot()
                self._snapshot = Snapshot(**{**stale.__dict__, "ok": False, "read_at": time.monotonic()})
            return self._snapshot

    def clear(self) -> None:
        """Forget the cached snapshot (tests switch databases)."""
        with self._lock:
            self._snapshot = None

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        snap = self.snapshot()
        ok = float(snap.ok)
        yield _gauge("backfill_queue_state_up", "1 if the last read of the queue's state succeeded.", [], [([], ok)])
        yield _gauge(
            "backfill_queue_state_read_seconds",
            "How long the last read of the queue's state took.",
            [],
            [([], snap.read_seconds)],
        )
        yield _gauge(
            "backfill_queue_requests",
            "Open requests by model, tenant and state (queued, running).",
            ["model", "tenant", "state"],
            [(list(key), value) for key, value in sorted(snap.open.items())],
        )
        finished = CounterMetricFamily(
            "backfill_requests_finished",
            "Finished requests by model, tenant and outcome (failed counts every error line: failed, expired, "
            "cancelled), from each batch's live counts.",
            labels=["model", "tenant", "outcome"],
        )
        for key, value in sorted(snap.finished.items()):
            finished.add_metric(list(key), value)
        yield finished
        yield _gauge(
            "backfill_batches",
            "Batches by model and status.",
            ["model", "status"],
            [(list(key), value) for key, value in sorted(snap.batches.items())],
        )
        yield from _deadline_families(snap)
        yield from _goodput_families(snap)


def _deadline_families(snap: Snapshot) -> Iterator[GaugeMetricFamily]:
    at = now_f()
    deadlines = sorted(snap.deadlines.items())
    ages = [([m], max(0.0, at - snap.oldest[m]) if m in snap.oldest else 0.0) for m, _ in deadlines]
    yield _gauge(
        "backfill_queue_oldest_age_seconds",
        "Seconds the longest-waiting queued request has been queued (0: none).",
        ["model"],
        ages,
    )
    yield _gauge(
        "backfill_queue_earliest_deadline_seconds",
        "Seconds until the earliest deadline of an open request.",
        ["model"],
        [([m], s.earliest_deadline - at) for m, s in deadlines if s.earliest_deadline is not None],
    )
    yield _gauge(
        "backfill_queue_deadline_slack_seconds",
        "Least slack over the open deadlines: time left minus the time to finish, earliest deadline first at "
        "measured throughput, every request due by then (negative: a deadline will be missed).",
        ["model"],
        [([m], s.slack_seconds) for m, s in deadlines if s.slack_seconds is not None],
    )
    yield _gauge(
        "backfill_requests_at_risk",
        "Open requests whose deadline is inside the urgency horizon.",
        ["model"],
        [([m], s.at_risk) for m, s in deadlines],
    )
    yield _gauge(
        "backfill_queue_urgency_horizon_seconds",
        "The urgency horizon: claimed earliest deadline first inside it.",
        ["model"],
        [([m], s.horizon_seconds) for m, s in deadlines],
    )
    yield _gauge(
        "backfill_queue_throughput_work_per_second",
        "Measured (or default) work per busy second used for the projections (output + prefill-weighted input tokens).",
        ["model"],
        [([m], s.work_per_second) for m, s in deadlines],
    )


def _goodput_families(snap: Snapshot) -> Iterator[GaugeMetricFamily]:
    items = sorted(snap.goodput.items())
    yield _gauge(
        "backfill_goodput_ratio",
        "Requests completed by their deadline / requests decided (accepted and no longer open), over batches "
        "whose deadline is at most the goodput window ago.",
        ["model"],
        [([model], values["ratio"]) for model, values in items if "ratio" in values],
    )
    yield _gauge(
        "backfill_goodput_requests",
        "Accepted requests with a deadline in the goodput window, by result.",
        ["model", "result"],
        [([model, name], values[name]) for model, values in items for name in GOODPUT_RESULTS],
    )


def _gauge(name: str, doc: str, labels: list[str], samples: list[tuple[list[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in samples:
        family.add_metric(values, float(value))
    return family


QUEUE_STATE = QueueStateCollector()
