"""The history checker's batch-control rules (issue 20): rerun, paused_progress and overrun.

They read the control calls the workload made (`History.controls`) and the request rows the database held at
the end (`History.rows`); tests/chaos/history.py describes each rule and calls them from `check`.
"""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal
from typing import Any

from tests.chaos.history import TERMINAL, BatchRecord, Finding, History, Verdict


def check_retries(verdict: Verdict, history: History) -> None:
    """A success is never re-run by a retry, and nothing is billed (has an output line) in two batches of a tree."""
    for record in history.batches.values():
        origin = history.batches.get(record.retry_of or "")
        if origin is None:
            continue
        succeeded = {str(line.get("custom_id")) for line in origin.output_lines}
        succeeded |= {row.custom_id for row in history.rows.get(origin.batch_id, []) if row.status == "completed"}
        held = {str(line.get("custom_id")) for line in record.output_lines + record.error_lines}
        held |= {row.custom_id for row in history.rows.get(record.batch_id, [])}
        again = sorted(held & succeeded)
        if again:
            detail = f"retry of {origin.batch_id} re-runs {again[:5]}, which succeeded there"
            verdict.findings.append(Finding("rerun", record.batch_id, detail, len(again)))
    for root, members in _retry_trees(history).items():
        if len(members) < 2:
            continue
        billed = Counter(str(line.get("custom_id")) for member in members for line in member.output_lines)
        twice = sorted(cid for cid, times in billed.items() if times > 1)
        if twice:
            detail = f"{twice[:5]} succeeded (and were billed) in more than one batch of the retries of {root}"
            verdict.findings.append(Finding("rerun", root, detail, len(twice)))


def _retry_trees(history: History) -> dict[str, list[BatchRecord]]:
    trees: dict[str, list[BatchRecord]] = {}
    for record in history.batches.values():
        root = record
        while root.retry_of is not None and root.retry_of in history.batches:
            root = history.batches[root.retry_of]
        trees.setdefault(root.batch_id, []).append(record)
    return trees


def paused_spans(history: History, batch_id: str) -> list[tuple[float, float]]:
    """(pause answered, resume sent) for each pause of the batch that took effect; a pause never resumed lasts
    to the end. A span starts at the answer (the pause has committed) and ends when the resume is sent (it
    has not committed yet), so a result recorded inside it really was recorded while the batch was paused."""
    spans: list[tuple[float, float]] = []
    start: float | None = None
    for event in sorted((c for c in history.controls if c.batch_id == batch_id), key=lambda c: c.sent_at):
        if event.kind == "pause" and event.outcome == "ok" and event.acked_at is not None and start is None:
            start = event.acked_at
        elif event.kind in ("resume", "trial_resume") and start is not None:  # a trial's resume resumes it too
            if event.sent_at > start:
                spans.append((start, event.sent_at))
            start = None
    if start is not None:
        spans.append((start, math.inf))
    return spans


def check_pauses(verdict: Verdict, history: History) -> None:
    """No worker records a result for a paused batch between its pause and its resume, but once its window closed
    (an answer cut short at its expiry among them): a pause then holds nothing back, its lines end
    (docs/workflow.md)."""
    for batch_id in sorted({c.batch_id for c in history.controls if c.kind == "pause" and c.batch_id}):
        spans = paused_spans(history, batch_id)
        record = history.batches.get(batch_id)
        cut = {str(line.get("id")) for line in record.output_lines if cut_at_expiry(line)} if record else set()
        ran = [
            row
            for row in history.rows.get(batch_id, [])
            if row.run_id is not None
            and row.finished_at is not None
            and row.row_id not in cut
            and (record is None or record.expires_at is None or row.finished_at < record.expires_at)
            and any(start < row.finished_at < end for start, end in spans)
        ]
        if ran:
            first = min(ran, key=lambda row: row.finished_at or 0)
            detail = f"{len(ran)} results recorded while paused, e.g. {first.custom_id} at {first.finished_at:.2f}"
            verdict.findings.append(Finding("paused_progress", batch_id, detail, len(ran)))


def cut_at_expiry(line: dict[str, Any]) -> bool:
    """The result line's answer was cut short at its batch's expiry (`backfill.cut_by`, on OpenAI's body or
    Anthropic's message)."""
    answer = ((line.get("response") or {}).get("body") or (line.get("result") or {}).get("message")) or {}
    return isinstance(answer, dict) and bool((answer.get("backfill") or {}).get("cut_by"))


def _billed_tokens(records: list[BatchRecord]) -> tuple[int, int]:
    """(output tokens billed, the most one request billed) over the batches' output lines."""
    tokens = [
        int((((line.get("response") or {}).get("body") or {}).get("usage") or {}).get("completion_tokens", 0))
        for record in records
        for line in record.output_lines
    ]
    return sum(tokens), max(tokens, default=0)


def cap_overruns(history: History) -> dict[str, tuple[Decimal, Decimal]]:
    """{batch_id: (billed past its cap, the dearest request it billed)} for every ended batch with a spend cap that
    billed past it (USD; 0 past the cap when it stopped under or at it)."""
    price = Decimal(history.usd_per_output_token)
    found: dict[str, tuple[Decimal, Decimal]] = {}
    for record in history.batches.values():
        if record.max_cost_usd is None or record.status not in TERMINAL:
            continue
        total, dearest = _billed_tokens([record])
        found[record.batch_id] = (max(total * price - Decimal(record.max_cost_usd), Decimal(0)), dearest * price)
    return found


def check_overrun(verdict: Verdict, history: History) -> None:
    """A capped batch bills at most its cap plus one request (the dearest it billed: a claim reserves each request
    at its max_tokens, docs/decisions/0018); a budgeted tenant at most its budget plus the in-flight bound."""
    price = Decimal(history.usd_per_output_token)
    in_flight = history.gpu_workers * history.inflight_bound_per_worker
    for batch_id, (overrun, dearest) in cap_overruns(history).items():
        if overrun > dearest:
            cap = history.batches[batch_id].max_cost_usd
            detail = f"billed ${overrun} past its cap ${cap}, more than one request (the dearest billed ${dearest})"
            verdict.findings.append(Finding("overrun", batch_id, detail))
    for tenant in sorted({c.tenant for c in history.controls if c.kind == "budget" and c.outcome == "ok"}):
        last = [c for c in history.controls if c.kind == "budget" and c.outcome == "ok" and c.tenant == tenant][-1]
        limit = max(Decimal(last.value or 0), Decimal(last.spent_usd or 0))
        total, dearest = _billed_tokens([r for r in history.batches.values() if r.tenant == tenant])
        bound = in_flight * dearest * price
        if total * price > limit + bound:
            detail = f"tenant {tenant} billed ${total * price} past its budget ${limit} + the in-flight bound ${bound}"
            verdict.findings.append(Finding("overrun", None, detail))
