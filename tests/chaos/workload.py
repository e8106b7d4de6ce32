"""The workload: several tenants submitting batches with the official `openai` SDK while faults land.

Each tenant uploads its files, creates batches, polls them to a terminal status and downloads the output
and error files, retrying whatever a fault breaks (connection refused, 5xx, timeouts), as a careful
client would. Some lines are built to fail at run time (bodies the engine rejects), each with the error
code it must end with, so error lines are exercised and checked.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import openai

from tests.chaos.history import BatchRecord, ClientEvent, InputLine

T = TypeVar("T")
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
POLL_SECONDS = 0.25

# Bodies the engine refuses at run time (ingest accepts them: they are well-formed lines), and the code each
# must end with in the error file.
_FAILING_BODIES: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = [
    ("invalid_value", lambda body: {**body, "temperature": "hot"}),
    ("invalid_value", lambda body: {**body, "min_tokens": 50, "max_tokens": 3}),
    ("unsupported_parameter", lambda body: {**body, "frobnicate": True}),
    (
        "context_length_exceeded",
        lambda body: {**body, "messages": [{"role": "user", "content": "word " * 700}]},
    ),
]


@dataclass(frozen=True)
class BatchControls:
    """The control calls the tenant makes on one batch (issue 20), each at a seeded moment after its create."""

    pauses: tuple[tuple[float, float], ...] = ()  # (pause at, resume at), seconds after create
    priority: tuple[float, int] | None = None  # (at, new priority)
    max_cost_usd: str | None = None  # a spend cap on create
    retry: bool = False  # once ended, retry its retryable error lines (and a retry's, once more)


@dataclass(frozen=True)
class BudgetPlan:
    """A tenant budget an admin sets during the run: the tenant's spend so far plus `margin_usd`."""

    tenant: str
    after_seconds: float  # after the tenant's last create
    margin_usd: int


@dataclass(frozen=True)
class PlannedBatch:
    """One batch a tenant will submit: its lines, when, and whether the tenant cancels it."""

    tenant: str
    name: str
    lines: tuple[InputLine, ...]
    bodies: tuple[dict[str, Any], ...]
    submit_after_seconds: float
    cancel_after_seconds: float | None = None
    controls: BatchControls = field(default_factory=lambda: BatchControls())
    # Issue 40 (tests/chaos/workflow.py): a trial, checks, on_expiry for the create's extra_body, and its window
    workflow: dict[str, Any] = field(default_factory=dict)
    window: str = "24h"

    def jsonl(self) -> bytes:
        return b"".join(
            json.dumps(
                {"custom_id": line.custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
            ).encode()
            + b"\n"
            for line, body in zip(self.lines, self.bodies, strict=True)
        )


@dataclass(frozen=True)
class WorkloadSize:
    """How much work one run submits (`small` for CI, `default` for `make chaos`)."""

    tenants: int = 3
    batches_per_tenant: tuple[int, int] = (1, 2)
    lines_per_batch: tuple[int, int] = (25, 60)
    max_tokens: tuple[int, int] = (4, 24)
    failing_share: float = 0.08
    submit_spread_seconds: float = 6.0
    cancel_probability: float = 0.25
    control: bool = True  # pauses, priority changes, spend caps, retries, a tenant budget (issue 20)
    pause_probability: float = 0.5
    priority_probability: float = 0.4
    cap_probability: float = 0.3
    retry_probability: float = 0.8
    budget_probability: float = 0.4


SIZES = {
    "small": WorkloadSize(tenants=2, lines_per_batch=(20, 40), submit_spread_seconds=3.0),
    "default": WorkloadSize(),
    "no-control": WorkloadSize(control=False),
}
# The chaos price book: input free, $2 per output token at list, so $1 billed at 24h's discount (0.5).
PRICE_BOOK = {
    "prices": [
        {"model": "*", "effective_from": "2020-01-01", "input_usd_per_mtok": "0", "output_usd_per_mtok": "2000000"}
    ]
}
USD_PER_OUTPUT_TOKEN = "1"


def plan_controls(rng: random.Random, *, size: WorkloadSize, max_tokens: list[int]) -> BatchControls:
    """One batch's control calls (drawn after its lines, so the lines of a seed stay what they were)."""
    pauses: list[tuple[float, float]] = []
    at = rng.uniform(0.3, 3.0)
    while rng.random() < size.pause_probability and len(pauses) < 2:
        resume = at + rng.uniform(0.3, 2.5)
        pauses.append((at, resume))
        at = resume + rng.uniform(0.5, 2.0)
    priority = (rng.uniform(0.2, 4.0), rng.randint(-100, 50)) if rng.random() < size.priority_probability else None
    cap = None
    if rng.random() < size.cap_probability:
        cap = str(int(sum(max_tokens) * rng.uniform(0.2, 0.7) * int(USD_PER_OUTPUT_TOKEN)))
    return BatchControls(tuple(pauses), priority, cap, rng.random() < size.retry_probability)


def plan_budget(rng: random.Random, *, size: WorkloadSize) -> BudgetPlan | None:
    """At most one tenant budget per run."""
    if not size.control or rng.random() >= size.budget_probability:
        return None
    return BudgetPlan(f"tenant-{rng.randrange(size.tenants)}", rng.uniform(0.0, 3.0), rng.randint(20, 150))


def plan_workload(rng: random.Random, *, model: str, size: WorkloadSize) -> list[PlannedBatch]:
    """Every batch of the run, drawn from `rng` (so a seed replays the same workload)."""
    planned: list[PlannedBatch] = []
    cancelled_one = rng.random() >= size.cancel_probability  # at most one cancelled batch per run
    for t in range(size.tenants):
        tenant = f"tenant-{t}"
        for b in range(rng.randint(*size.batches_per_tenant)):
            lines, bodies = [], []
            for i in range(rng.randint(*size.lines_per_batch)):
                body: dict[str, Any] = {
                    "model": model,
                    "messages": [{"role": "user", "content": f"{tenant} batch {b} question {i}"}],
                    "max_tokens": rng.randint(*size.max_tokens),
                }
                expect = None
                if rng.random() < size.failing_share:
                    expect, breaks = rng.choice(_FAILING_BODIES)
                    body = breaks(body)
                lines.append(InputLine(custom_id=f"{tenant}-b{b}-{i}", expect_error=expect))
                bodies.append(body)
            cancel = None
            if not cancelled_one:
                cancelled_one = True
                cancel = rng.uniform(0.5, 4.0)
            planned.append(
                PlannedBatch(
                    tenant=tenant,
                    name=f"{tenant}-b{b}",
                    lines=tuple(lines),
                    bodies=tuple(bodies),
                    submit_after_seconds=rng.uniform(0, size.submit_spread_seconds),
                    cancel_after_seconds=cancel,
                )
            )
    if size.control:  # drawn from their own stream: the lines, moments and cancels of a seed stay as they were
        controls = random.Random(f"controls/{rng.random()}")
        planned = [
            replace(p, controls=plan_controls(controls, size=size, max_tokens=[b["max_tokens"] for b in p.bodies]))
            for p in planned
        ]
    return planned


class GaveUp(Exception):
    """A call kept failing until the tenant's deadline."""


@dataclass
class TenantClient:
    """One tenant's SDK client; every call retries through faults and is logged with its time."""

    tenant: str
    client: openai.OpenAI
    stop: threading.Event
    events: list[ClientEvent] = field(default_factory=list)

    def call(self, what: str, fn: Callable[[], T], *, give_up_at: float) -> T:
        """Call `fn` until it succeeds; connection errors, timeouts and 5xx are retried."""
        delay = 0.1
        while True:
            try:
                return fn()
            except (openai.APIConnectionError, openai.InternalServerError, openai.RateLimitError) as error:
                status = getattr(error, "status_code", None)
                self.events.append(ClientEvent(time.time(), self.tenant, what, type(error).__name__, status))
            if time.time() > give_up_at or self.stop.is_set():
                raise GaveUp(what)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def download(tenant: TenantClient, record: BatchRecord, batch: dict[str, Any], *, give_up_at: float) -> None:
    """Fill the record from the final batch object and its output and error files (through the SDK)."""
    record.status = batch["status"]
    record.request_counts = dict(batch.get("request_counts") or {})
    record.cost = batch.get("cost")
    record.output_file_id = batch.get("output_file_id")
    record.error_file_id = batch.get("error_file_id")
    record.trial, record.checks, record.on_expiry = batch.get("trial"), batch.get("checks"), batch.get("on_expiry")
    for file_id, target in ((record.output_file_id, record.output_lines), (record.error_file_id, record.error_lines)):
        if file_id is None:
            continue
        text = tenant.call(
            "files.content", lambda file_id=file_id: tenant.client.files.content(file_id).text, give_up_at=give_up_at
        )
        meta = tenant.call(
            "files.retrieve", lambda file_id=file_id: tenant.client.files.retrieve(file_id), give_up_at=give_up_at
        )
        if meta.bytes != len(text.encode()):
            record.problems.append(f"file {file_id} is {len(text.encode())} bytes, its object says {meta.bytes}")
        target.extend(json.loads(line) for line in text.splitlines() if line.strip())
    record.downloaded = True


def collect_unknown(tenant: TenantClient, *, records: dict[str, BatchRecord], give_up_at: float) -> None:
    """Batches the tenant never got an id for (a create whose answer a fault lost): list and fetch them."""
    listed = tenant.call("batches.list", lambda: list(tenant.client.batches.list(limit=100)), give_up_at=give_up_at)
    for batch in listed:
        if batch.id in records:
            continue
        record = BatchRecord(
            batch_id=batch.id,
            tenant=tenant.tenant,
            input_file_id=batch.input_file_id,
            created_at=float(batch.created_at),
            unknown_to_client=True,
            retry_of=batch.to_dict().get("retry_of"),
            max_cost_usd=batch.to_dict().get("max_cost_usd"),
            window=batch.completion_window,
        )
        records[batch.id] = record
        if batch.status in TERMINAL:
            record.terminal_at = time.time()
            # The list's objects carry no cost block: read the batch itself, as a client following it would.
            whole = tenant.call(
                "batches.retrieve",
                lambda batch_id=batch.id: tenant.client.batches.retrieve(batch_id),
                give_up_at=give_up_at,
            )
            download(tenant, record, whole.to_dict(), give_up_at=give_up_at)
        else:
            record.status, record.expires_at = batch.status, batch.expires_at
