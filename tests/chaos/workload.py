"""The workload: several tenants submitting batches with the official `openai` SDK while faults land.

Each tenant uploads its files, creates batches, polls them to a terminal status and downloads the output
and error files, retrying whatever a fault breaks (connection refused, 5xx, timeouts), as a careful
client would. Some lines are built to fail at run time (bodies the engine rejects), each with the error
code it must end with, so error lines are exercised and checked.
"""

from __future__ import annotations

import io
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import openai

from tests.chaos.history import BatchRecord, ClientEvent, InputFile, InputLine

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
class PlannedBatch:
    """One batch a tenant will submit: its lines, when, and whether the tenant cancels it."""

    tenant: str
    name: str
    lines: tuple[InputLine, ...]
    bodies: tuple[dict[str, Any], ...]
    submit_after_seconds: float
    cancel_after_seconds: float | None = None

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


SIZES = {
    "small": WorkloadSize(tenants=2, lines_per_batch=(20, 40), submit_spread_seconds=3.0),
    "default": WorkloadSize(),
}


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


def run_tenant(
    tenant: TenantClient,
    batches: list[PlannedBatch],
    *,
    started_at: float,
    give_up_at: float,
    inputs: dict[str, InputFile],
    records: dict[str, BatchRecord],
    lock: threading.Lock,
) -> None:
    """Submit the tenant's batches on schedule, then poll each to the end and download its files."""
    created: list[tuple[PlannedBatch, str, float]] = []
    for planned in sorted(batches, key=lambda p: p.submit_after_seconds):
        _sleep_until(started_at + planned.submit_after_seconds, tenant.stop)
        data = planned.jsonl()
        try:
            source = tenant.call(
                "files.create",
                lambda data=data, name=planned.name: tenant.client.files.create(
                    file=(f"{name}.jsonl", io.BytesIO(data)), purpose="batch"
                ),
                give_up_at=give_up_at,
            )
            with lock:
                inputs[source.id] = InputFile(source.id, tenant.tenant, planned.lines)
            batch = tenant.call(
                "batches.create",
                lambda file_id=source.id: tenant.client.batches.create(
                    input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
                ),
                give_up_at=give_up_at,
            )
        except GaveUp:
            return
        created.append((planned, batch.id, time.time()))
        with lock:
            records[batch.id] = BatchRecord(
                batch_id=batch.id, tenant=tenant.tenant, input_file_id=source.id, created_at=time.time()
            )
    for planned, batch_id, created_at in created:
        try:
            follow_batch(tenant, planned, batch_id, created_at=created_at, give_up_at=give_up_at, records=records)
        except GaveUp:
            continue


def follow_batch(
    tenant: TenantClient,
    planned: PlannedBatch,
    batch_id: str,
    *,
    created_at: float,
    give_up_at: float,
    records: dict[str, BatchRecord],
) -> None:
    """Poll one batch until it is terminal (cancelling it on schedule), then download its files."""
    record = records[batch_id]
    cancel_at = None if planned.cancel_after_seconds is None else created_at + planned.cancel_after_seconds
    while True:
        if cancel_at is not None and not record.cancel_requested and time.time() >= cancel_at:
            record.cancel_requested = True
            try:
                tenant.call("batches.cancel", lambda: tenant.client.batches.cancel(batch_id), give_up_at=give_up_at)
            except openai.ConflictError:
                pass  # already finished: nothing to cancel
        batch = tenant.call("batches.retrieve", lambda: tenant.client.batches.retrieve(batch_id), give_up_at=give_up_at)
        record.status = batch.status
        if batch.status in TERMINAL:
            record.terminal_at = time.time()
            break
        if tenant.stop.is_set():
            raise GaveUp("poll")
        time.sleep(POLL_SECONDS)
    download(tenant, record, batch.to_dict(), give_up_at=give_up_at)


def download(tenant: TenantClient, record: BatchRecord, batch: dict[str, Any], *, give_up_at: float) -> None:
    """Fill the record from the final batch object and its output and error files (through the SDK)."""
    record.status = batch["status"]
    record.request_counts = dict(batch.get("request_counts") or {})
    record.cost = batch.get("cost")
    record.output_file_id = batch.get("output_file_id")
    record.error_file_id = batch.get("error_file_id")
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
        )
        records[batch.id] = record
        if batch.status in TERMINAL:
            record.terminal_at = time.time()
            download(tenant, record, batch.to_dict(), give_up_at=give_up_at)
        else:
            record.status = batch.status


def _sleep_until(moment: float, stop: threading.Event) -> None:
    stop.wait(max(0.0, moment - time.time()))
