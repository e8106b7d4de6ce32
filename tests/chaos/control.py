"""Batch control under faults (issue 20): the calls a tenant makes on its batches while it follows them.

Each batch a tenant created is followed in turn (one poll each every 0.25 s), so a pause of one batch
lands while another runs: at its seeded moments a batch is paused and resumed, re-prioritised, cancelled;
once it has ended, its retryable error lines are retried (a retry once more). One tenant of some runs gets a
budget from an admin, a little above what it has spent, so its running batches stop. Every call is logged
(`ControlEvent`: sent, answered, outcome) for the history checker; calls retry through faults like any other.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import httpx
import openai
from openai.types import Batch

from tests.chaos.history import RETRYABLE_CODES, BatchRecord, ControlEvent, InputFile, error_code
from tests.chaos.workflow import continued_in, trial_paused
from tests.chaos.workload import (
    POLL_SECONDS,
    TERMINAL,
    BatchControls,
    BudgetPlan,
    GaveUp,
    PlannedBatch,
    TenantClient,
    download,
)

MAX_RETRY_DEPTH = 2  # a batch, its retry, and a retry of that retry


def run_tenant(
    tenant: TenantClient,
    batches: list[PlannedBatch],
    *,
    started_at: float,
    give_up_at: float,
    inputs: dict[str, InputFile],
    records: dict[str, BatchRecord],
    lock: threading.Lock,
    log: Callable[[ControlEvent], None],
    budget: BudgetPlan | None = None,
    admin: TenantClient | None = None,
) -> None:
    """Submit the tenant's batches on schedule, then follow them all to the end, making their control calls."""
    followers: list[Follower] = []
    for planned in sorted(batches, key=lambda p: p.submit_after_seconds):
        _sleep_until(started_at + planned.submit_after_seconds, tenant.stop)
        try:
            record = _submit(tenant, planned, give_up_at=give_up_at, inputs=inputs, lock=lock)
        except GaveUp:
            return
        with lock:
            records[record.batch_id] = record
        followers.append(
            Follower(record, record.created_at, planned.controls, cancel_after_seconds=planned.cancel_after_seconds)
        )
    Controller(tenant, records, log, give_up_at, budget, admin).follow(followers)


def _submit(
    tenant: TenantClient,
    planned: PlannedBatch,
    *,
    give_up_at: float,
    inputs: dict[str, InputFile],
    lock: threading.Lock,
) -> BatchRecord:
    data = planned.jsonl()
    source = tenant.call(
        "files.create",
        lambda: tenant.client.files.create(file=(f"{planned.name}.jsonl", io.BytesIO(data)), purpose="batch"),
        give_up_at=give_up_at,
    )
    with lock:
        inputs[source.id] = InputFile(source.id, tenant.tenant, planned.lines)
    cap = planned.controls.max_cost_usd
    extra = {**planned.workflow, **({} if cap is None else {"max_cost_usd": cap})}
    batch = tenant.call(
        "batches.create",
        lambda: tenant.client.batches.create(
            input_file_id=source.id,
            endpoint="/v1/chat/completions",
            completion_window=planned.window,  # type: ignore[arg-type]  # the SDK types "24h"; the wire takes any
            extra_body=extra or None,
        ),
        give_up_at=give_up_at,
    )
    return BatchRecord(
        batch_id=batch.id,
        tenant=tenant.tenant,
        input_file_id=source.id,
        created_at=time.time(),
        max_cost_usd=cap,
        window=planned.window,
    )


def _sleep_until(moment: float, stop: threading.Event) -> None:
    stop.wait(max(0.0, moment - time.time()))


@dataclass
class Follower:
    """One batch being followed to its end, with its control calls still due (seconds after its create)."""

    record: BatchRecord
    created_at: float
    controls: BatchControls
    cancel_after_seconds: float | None = None
    depth: int = 0  # 0: a batch the tenant created; n: its n-th retry
    due: list[tuple[float, str, int | None]] = field(default_factory=list)
    done: bool = False
    trial_resumed: bool = False  # its trial paused it and the tenant resumed it (once)
    # A background child continuing a batch that expired while paused starts paused (docs/workflow.md): its tenant
    # resumes it when it sees it so (once), as it would have resumed the origin.
    resume_paused: bool = False

    def __post_init__(self) -> None:
        due: list[tuple[float, str, int | None]] = []
        for pause_at, resume_at in self.controls.pauses:
            due += [(pause_at, "pause", None), (resume_at, "resume", None)]
        if self.controls.priority is not None:
            due.append((self.controls.priority[0], "priority", self.controls.priority[1]))
        if self.cancel_after_seconds is not None:
            due.append((self.cancel_after_seconds, "cancel", None))
        self.due = sorted(due, key=lambda item: item[0])


@dataclass
class Controller:
    """Follows one tenant's batches and makes their control calls; `log` receives every call."""

    tenant: TenantClient
    records: dict[str, BatchRecord]
    log: Callable[[ControlEvent], None]
    give_up_at: float
    budget: BudgetPlan | None = None
    admin: TenantClient | None = None

    def follow(self, followers: list[Follower]) -> None:
        """Poll every open batch until all have ended (or the run stops), making the calls as they fall due."""
        budget_at = None if self.budget is None else time.time() + self.budget.after_seconds
        while any(not f.done for f in followers):
            if budget_at is not None and time.time() >= budget_at:
                budget_at = None
                self._set_budget()
            for follower in [f for f in followers if not f.done]:
                try:
                    followers += self._step(follower)
                except GaveUp:
                    follower.done = True
            if self.tenant.stop.is_set():
                return
            time.sleep(POLL_SECONDS)

    def _step(self, follower: Follower) -> list[Follower]:
        record, now = follower.record, time.time()
        while follower.due and now >= follower.created_at + follower.due[0][0]:
            _, kind, value = follower.due.pop(0)
            self._control(record, kind, value)
        batch = self.tenant.call(
            "batches.retrieve", lambda: self.tenant.client.batches.retrieve(record.batch_id), give_up_at=self.give_up_at
        )
        record.status, record.expires_at = batch.status, batch.expires_at
        if batch.status not in TERMINAL:
            if not follower.trial_resumed and trial_paused(batch.to_dict()):
                follower.trial_resumed = True
                self._post("trial_resume", record.batch_id, f"/batches/{record.batch_id}/resume", {})
            elif follower.resume_paused and batch.to_dict().get("paused_at"):
                follower.resume_paused = False
                self._post("resume", record.batch_id, f"/batches/{record.batch_id}/resume", {})
            return []
        record.terminal_at = time.time()
        follower.done = True
        download(self.tenant, record, batch.to_dict(), give_up_at=self.give_up_at)
        children = self._continuations(record, batch.to_dict(), depth=follower.depth)
        if not follower.controls.retry or follower.depth >= MAX_RETRY_DEPTH:
            return children
        retry = self._retry(record)
        if retry is None:
            return children
        return [*children, Follower(retry, time.time(), BatchControls(retry=True), depth=follower.depth + 1)]

    def _continuations(self, record: BatchRecord, batch: dict[str, Any], *, depth: int) -> list[Follower]:
        """The background child a batch that expired with `continue_in_background` handed its lines to: followed
        like a batch of the tenant's own (retried once if it ends with retryable lines)."""
        children = sorted({child for line in record.error_lines if (child := continued_in(line))})
        followers = []
        for child in children:
            if child in self.records:
                continue
            self.records[child] = BatchRecord(
                batch_id=child,
                tenant=self.tenant.tenant,
                input_file_id=record.input_file_id,
                created_at=time.time(),
                retry_of=record.batch_id,
                retry_expected=sorted(str(line["custom_id"]) for line in record.error_lines if continued_in(line)),
                max_cost_usd=batch.get("max_cost_usd"),
                window="background",
            )
            controls = BatchControls(retry=True)
            followers.append(Follower(self.records[child], time.time(), controls, depth=depth + 1, resume_paused=True))
        return followers

    def _control(self, record: BatchRecord, kind: str, value: int | None) -> None:
        if kind == "cancel":
            record.cancel_requested = True
            path, body = f"/batches/{record.batch_id}/cancel", {}
        else:
            path, body = f"/batches/{record.batch_id}/{kind}", ({"priority": value} if kind == "priority" else {})
        self._post(kind, record.batch_id, path, body, value=None if value is None else str(value))

    def _retry(self, record: BatchRecord) -> BatchRecord | None:
        """Retry the batch if it has retryable error lines; the new batch's record, or None."""
        expected = sorted(
            str(line.get("custom_id")) for line in record.error_lines if retryable(line) and not continued_in(line)
        )
        if not expected:
            return None
        batch = self._post("retry", record.batch_id, f"/batches/{record.batch_id}/retry", {})
        if batch is None:
            return None  # refused (logged); a retry whose answer a fault lost is found by collect_unknown
        retry = BatchRecord(
            batch_id=batch.id,
            tenant=self.tenant.tenant,
            input_file_id=batch.input_file_id,
            created_at=time.time(),
            retry_of=record.batch_id,
            retry_expected=expected,
            max_cost_usd=batch.to_dict().get("max_cost_usd"),  # what is left of its origin's cap, inherited
            window=batch.completion_window,
        )
        self.records[batch.id] = retry
        return retry

    def _post(
        self, kind: str, batch_id: str, path: str, body: dict[str, Any], *, value: str | None = None
    ) -> Batch | None:
        """One control call through faults; logged with its outcome. The batch it answered, or None if refused."""
        sent = time.time()
        try:
            batch = self.tenant.call(
                f"batches.{kind}",
                lambda: self.tenant.client.post(path, body=body, cast_to=Batch),
                give_up_at=self.give_up_at,
            )
        except openai.ConflictError:
            self.log(ControlEvent(kind, self.tenant.tenant, batch_id, sent, None, "conflict", value))
            return None
        except openai.BadRequestError as error:
            outcome = str((error.body or {}).get("code") if isinstance(error.body, dict) else error.code)
            self.log(ControlEvent(kind, self.tenant.tenant, batch_id, sent, None, outcome, value))
            return None
        if kind == "retry":
            value = batch.id
        self.log(ControlEvent(kind, self.tenant.tenant, batch_id, sent, time.time(), "ok", value))
        return batch

    def _set_budget(self) -> None:
        """The admin sets the tenant's month budget to what it has spent so far plus the plan's margin."""
        assert self.budget is not None and self.admin is not None
        admin, tenant = self.admin, self.tenant
        sent = time.time()
        try:
            mine = tenant.call(
                "budgets.read",
                lambda: tenant.client.get("/organization/budgets", cast_to=httpx.Response).json(),
                give_up_at=self.give_up_at,
            )
            usd = str(Decimal(mine["spent_usd"]) + self.budget.margin_usd)
            body = {"tenant": tenant.tenant, "monthly_budget_usd": usd}
            answer = admin.call(
                "budgets.set",
                lambda: admin.client.post("/organization/budgets", body=body, cast_to=httpx.Response).json(),
                give_up_at=self.give_up_at,
            )
        except GaveUp:
            return
        event = ControlEvent("budget", tenant.tenant, None, sent, time.time(), "ok", usd, answer["spent_usd"])
        self.log(event)


def retryable(line: dict[str, Any]) -> bool:
    """Whether a retry re-runs this error line by default (storage/batches/retries.py `is_retryable`)."""
    response = line.get("response") or {}
    status = response.get("status_code")
    return error_code(line) in RETRYABLE_CODES or status is None or int(status) >= 500
