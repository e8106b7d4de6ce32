"""The history of one chaos run, and the checker that holds it to Backfill's promise.

The promise: nothing accepted is ever lost; every request of a job ends in exactly one line of the
output or error file, whatever crashes in between. A run's history is what the clients sent (input files,
with the lines built to fail), what they saw at the end (batch objects, output and error lines), what
the bucket holds, and what the harness did to the system (the fault log). `check` turns it into findings:

* lost: an input custom_id in neither file of its (terminal) batch;
* duplicated: a custom_id in more than one line across the two files;
* unexplained: an error line no fault and no input explains (see `explanation`), or a line built to fail
  that succeeded;
* stuck: a batch not terminal, or terminal later than `stuck_bound_seconds` after the faults stopped;
* orphan: an object in the bucket that no file row owns;
* other: request_counts or the cost block's tokens disagreeing with the files, malformed lines, a
  file row without its object, an accepted batch that failed or expired, a batch never downloaded.

Batch control (issue 20) adds three rules over the control calls the workload made (`controls`) and the
request rows the database held at the end (`rows`):

* rerun: a retry holds a custom_id that succeeded in its origin, or a custom_id has an output line (was
  billed) in more than one batch of a retry tree;
* paused_progress: a request of a paused batch was recorded as run (a worker's result: `run_id` set) after
  the pause was answered and before the resume was sent (a result recorded once the batch's window closed, an
  answer cut short at its expiry among them, is not progress: a paused batch's lines end as any expired batch's);
* overrun: a capped batch (`max_cost_usd`) billed more than its cap plus one request (the dearest it billed: a
  claim reserves each request at its max_tokens, docs/decisions/0018), or a budgeted tenant more than its budget
  plus the in-flight bound (per GPU worker 2 x max_num_seqs x inflight_per_seq requests, each at most the
  dearest request the tenant ran).

Checkpoints (issue 21) add one, over the fake engines' decode ledger (`decode`; tests/chaos/decode_rules.py):

* discarded: a run whose only hand-backs are graceful (SIGTERM drains, pauses) threw away more than 1% of the
  decode tokens of its delivered requests, or a run with a GPU worker killed -9 lost more than the stated
  checkpoint bound per killed in-flight request.

Adapters (issue 39) add `adapter`: a line answered under another model or adapter than it named
(tests/chaos/adapters.py). Trials, checks and expiries with continuation (issue 40) add `merged`, `trial`,
`billed` and `continued` (tests/chaos/workflow_rules.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
# Faults that can interrupt a request the engine is running (its lease then lapses and the reaper re-queues
# it). The reaper gives up on a request interrupted MAX_ATTEMPTS times (worker/jobs/reaper.py) with `engine_error`.
INTERRUPTING_FAULTS = frozenset({"kill_gpu", "kill_one_gpu", "pg_stop", "pg_stop_renewal"})
MAX_ATTEMPTS = 3
# What a retry re-runs by default (storage/batches/retries.py): these codes, and server failures (5xx, no response).
RETRYABLE_CODES = frozenset({"batch_expired", "batch_cancelled", "budget_exceeded"})
BUDGET_CODE = "budget_exceeded"
KINDS = (
    "lost",
    "duplicated",
    "unexplained",
    "stuck",
    "orphan",
    "other",
    "rerun",
    "paused_progress",
    "overrun",
    "discarded",
    "adapter",
    "merged",
    "trial",
    "billed",
    "continued",
)


@dataclass(frozen=True)
class InputLine:
    """One line a client submitted, and the error code it is built to end with (None: it must succeed)."""

    custom_id: str
    expect_error: str | None = None
    model: str | None = None  # the model or adapter it named, in runs with adapters (tests/chaos/adapters.py)


@dataclass(frozen=True)
class InputFile:
    file_id: str
    tenant: str
    lines: tuple[InputLine, ...]


@dataclass
class BatchRecord:
    """An accepted batch as its client saw it at the end."""

    batch_id: str
    tenant: str
    input_file_id: str
    created_at: float
    status: str | None = None
    request_counts: dict[str, int] = field(default_factory=dict)
    cost: dict[str, Any] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    output_lines: list[dict[str, Any]] = field(default_factory=list)
    error_lines: list[dict[str, Any]] = field(default_factory=list)
    terminal_at: float | None = None  # when a client first saw it terminal (harness clock)
    cancel_requested: bool = False
    downloaded: bool = False
    unknown_to_client: bool = False  # created by a retried call whose first answer a fault lost
    problems: list[str] = field(default_factory=list)
    retry_of: str | None = None  # the batch this one retries
    # The custom_ids the client expects a retry to hold (its origin's retryable error lines); None: unknown
    # (a retry whose answer a fault lost), then the retry's own rows.
    retry_expected: list[str] | None = None
    max_cost_usd: str | None = None  # the spend cap it was created with
    # Issue 40 (tests/chaos/workflow_rules.py): the window, and the trial, checks and on_expiry of its batch object
    window: str = "24h"
    trial: dict[str, Any] | None = None
    checks: dict[str, Any] | None = None
    on_expiry: str | None = None
    expires_at: float | None = None  # when its window closes, as its batch object says (once the client saw it)


@dataclass(frozen=True)
class ControlEvent:
    """A control call the workload made, when it was sent and when its (final) answer came."""

    kind: str  # pause, resume, priority, retry, budget
    tenant: str
    batch_id: str | None
    sent_at: float
    acked_at: float | None  # None: no answer (it gave up), or it was refused (see outcome)
    outcome: str = "ok"  # ok, or why nothing happened: conflict (the batch had ended), nothing_to_retry, ...
    value: str | None = None  # the priority, the budget in USD, the retry's batch id
    spent_usd: str | None = None  # budget: the tenant's month spend when the budget was set


@dataclass(frozen=True)
class RowRecord:
    """One request row as the database held it at the end of the run."""

    custom_id: str
    status: str
    finished_at: float | None
    run_id: str | None  # set only when a worker recorded the request's result
    error_code: str | None = None
    completion_tokens: int = 0
    trial: bool = False  # marked as one of its batch's trial lines
    row_id: str = ""
    copy_of: str | None = None  # the row a retry's or a continuation's row copies


@dataclass(frozen=True)
class FaultRecord:
    """One injected fault: what, on which process, from when until the system was whole again."""

    kind: str
    target: str
    started_at: float
    ended_at: float | None  # None: never repaired (the killed one of two GPU workers)
    detail: str = ""


@dataclass(frozen=True)
class ClientEvent:
    """A client call that failed and was retried."""

    at: float
    tenant: str
    call: str
    error: str
    status: int | None = None


@dataclass
class History:
    seed: int
    scenario: str
    started_at: float
    faults: list[FaultRecord] = field(default_factory=list)
    inputs: dict[str, InputFile] = field(default_factory=dict)
    batches: dict[str, BatchRecord] = field(default_factory=dict)
    objects: list[str] = field(default_factory=list)  # every key in the bucket at the end
    file_keys: dict[str, str] = field(default_factory=dict)  # blob_key -> file id, for every live file row
    client_events: list[ClientEvent] = field(default_factory=list)
    controls: list[ControlEvent] = field(default_factory=list)
    rows: dict[str, list[RowRecord]] = field(default_factory=dict)  # batch_id -> its rows at the end
    usd_per_output_token: str = "1"  # billed (after the 24h discount); input tokens are free in the chaos book
    gpu_workers: int = 1
    inflight_bound_per_worker: int = 32  # a tenant budget's: 2 x max_num_seqs (8) x inflight_per_seq (2)
    # Issue 21: the fake engines' decode ledger against the output lines (worker/engine/decode_ledger.py
    # DecodeFigures as a dict; None on the real engine), and the stated crash bound per killed request.
    decode: dict[str, Any] | None = None
    checkpoint_bound_tokens: int = 0
    adapters: tuple[str, ...] = ()  # the adapters the run served (tests/chaos/adapters.py)
    adapter_answers_alike: bool = False  # the fake engine: every answer of one adapter is a prefix of another
    max_num_seqs: int = 8
    # Issue 40: each tree's merged view (root batch id -> its lines) and, per request id, the completion tokens of
    # each answer the fake engines finished (the decode ledger; empty on the real engine)
    merged: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    finishes: dict[str, list[int]] = field(default_factory=dict)
    generated: dict[str, int] = field(default_factory=dict)  # request id -> tokens decoded plus resumed, all attempts

    @property
    def faults_over_at(self) -> float:
        """When the last fault was repaired (the run's start if there was none)."""
        ends = [fault.ended_at or fault.started_at for fault in self.faults]
        return max([self.started_at, *ends])

    def interrupting_faults(self) -> int:
        return sum(1 for fault in self.faults if fault.kind in INTERRUPTING_FAULTS)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Finding:
    kind: str  # lost, duplicated, unexplained, stuck, orphan, other
    batch_id: str | None
    detail: str
    count: int = 1


@dataclass
class Verdict:
    findings: list[Finding] = field(default_factory=list)

    def total(self, kind: str) -> int:
        return sum(finding.count for finding in self.findings if finding.kind == kind)

    @property
    def ok(self) -> bool:
        return not self.findings

    def summary(self) -> dict[str, int]:
        return {kind: self.total(kind) for kind in KINDS}

    def unexplained_codes(self) -> Counter[str]:
        return Counter(
            f.detail.split(":", 1)[0] for f in self.findings if f.kind == "unexplained" for _ in range(f.count)
        )


def explanation(code: str | None, *, line: InputLine, record: BatchRecord, history: History) -> str | None:
    """Why an error line with `code` may exist, or None if nothing explains it.

    * the line was built to fail with exactly this code (the workload's own bad bodies);
    * `batch_cancelled`: the client cancelled this batch;
    * `engine_error` (the reaper gave up on a request): the run had at least MAX_ATTEMPTS faults that can
      interrupt running work, so one request may really have been interrupted that often;
    * nothing else: not `duplicate_request` (a handover is never the user's problem), not `engine_error`
      below that many interruptions, not `batch_expired` (runs end long before a 24 h window), not 5xx codes.
    """
    if code is not None and code == line.expect_error:
        return "built to fail"
    if code == "batch_cancelled" and record.cancel_requested:
        return "cancelled by its client"
    if code == "engine_error" and history.interrupting_faults() >= MAX_ATTEMPTS:
        return f"{history.interrupting_faults()} interrupting faults"
    if code == "checks_failed" and record.checks:
        return "its checks (every draw failed: tests/chaos/workflow_rules.py holds the attempts)"
    if code == "batch_expired" and record.window != "24h":
        return "its short window (a continued line: tests/chaos/workflow_rules.py finds its child)"
    if code == BUDGET_CODE and record.max_cost_usd is not None:
        return "its spend cap"
    if code == BUDGET_CODE and any(c.kind == "budget" and c.tenant == record.tenant for c in history.controls):
        return "its tenant's budget"
    return None


def error_code(line: dict[str, Any]) -> str | None:
    """An error line's code: the `error` object's, else the response body's."""
    error = line.get("error") or {}
    if error.get("code"):
        return str(error["code"])
    body = (line.get("response") or {}).get("body") or {}
    inner = body.get("error") if isinstance(body, dict) else None
    return str(inner["code"]) if isinstance(inner, dict) and inner.get("code") else None


def check(history: History, *, stuck_bound_seconds: float = 60.0) -> Verdict:
    """Every finding of the run (an empty verdict means the promise held)."""
    from tests.chaos.file_rules import check_cost, check_counts, check_objects  # they build on this module

    verdict = Verdict()
    for record in history.batches.values():
        source = history.inputs.get(record.input_file_id)
        if source is None:
            verdict.findings.append(Finding("other", record.batch_id, f"input file {record.input_file_id} unknown"))
            continue
        _check_stuck(verdict, record, history, stuck_bound_seconds)
        if record.status not in TERMINAL:
            continue
        if not record.downloaded:
            verdict.findings.append(Finding("other", record.batch_id, "terminal but its files were never read"))
            continue
        planned = _planned(record, source, history)
        _check_lines(verdict, record, planned, history)
        check_counts(verdict, record, planned)
        check_cost(verdict, record, history.rows.get(record.batch_id))
        for problem in record.problems:
            verdict.findings.append(Finding("other", record.batch_id, problem))
    check_objects(verdict, history)
    from tests.chaos.control_rules import check_overrun, check_pauses, check_retries  # they build on this module
    from tests.chaos.decode_rules import check_discards

    check_retries(verdict, history)
    check_pauses(verdict, history)
    check_overrun(verdict, history)
    check_discards(verdict, history)
    from tests.chaos.adapters import check_adapters
    from tests.chaos.workflow_rules import check_workflow

    check_adapters(verdict, history)
    check_workflow(verdict, history)
    return verdict


def _planned(record: BatchRecord, source: InputFile, history: History) -> dict[str, InputLine]:
    """The lines the batch owes: its input file's, or for a retry the failed lines of its origin it re-runs."""
    lines = {line.custom_id: line for line in source.lines}
    if record.retry_of is None:
        return lines
    wanted = record.retry_expected
    if wanted is None:
        wanted = [row.custom_id for row in history.rows.get(record.batch_id, [])]
    return {cid: lines.get(cid, InputLine(cid)) for cid in wanted}


def _check_stuck(verdict: Verdict, record: BatchRecord, history: History, bound: float) -> None:
    since = max(history.faults_over_at, record.created_at)
    if record.status not in TERMINAL or record.terminal_at is None:
        verdict.findings.append(Finding("stuck", record.batch_id, f"still {record.status}"))
    elif record.terminal_at - since > bound:
        late = record.terminal_at - since
        verdict.findings.append(Finding("stuck", record.batch_id, f"{record.status} {late:.0f} s after the faults"))


def _check_lines(verdict: Verdict, record: BatchRecord, planned: dict[str, InputLine], history: History) -> None:
    if record.status == "failed" or (record.status == "expired" and record.window == "24h"):
        verdict.findings.append(
            Finding("other", record.batch_id, f"an accepted batch of valid lines ended {record.status}")
        )
    if record.cancel_requested and record.status == "cancelled" and not record.request_counts.get("total"):
        planned = {}  # cancelled while still validating: no request was enqueued, so none has a line
    seen = Counter(str(line.get("custom_id")) for line in record.output_lines + record.error_lines)
    lost = [cid for cid in planned if cid not in seen]
    if lost:
        verdict.findings.append(Finding("lost", record.batch_id, f"missing {sorted(lost)[:5]}", len(lost)))
    for cid, times in seen.items():
        if times > 1:
            verdict.findings.append(Finding("duplicated", record.batch_id, f"{cid} in {times} lines", times - 1))
        if cid not in planned:
            verdict.findings.append(Finding("other", record.batch_id, f"a line for {cid}, which was never submitted"))
    for line in record.output_lines:
        cid = str(line.get("custom_id"))
        if cid in planned and planned[cid].expect_error is not None:
            message = f"{planned[cid].expect_error}: {cid} succeeded but was built to fail"
            verdict.findings.append(Finding("unexplained", record.batch_id, message))
        if not _is_chat_completion(line):
            verdict.findings.append(Finding("other", record.batch_id, f"malformed output line for {cid}"))
    for line in record.error_lines:
        cid = str(line.get("custom_id"))
        code = error_code(line)
        if cid not in planned:
            continue
        if explanation(code, line=planned[cid], record=record, history=history) is None:
            message = f"{code}: {cid}: {(line.get('error') or {}).get('message', '')}"[:300]
            verdict.findings.append(Finding("unexplained", record.batch_id, message))


def _is_chat_completion(line: dict[str, Any]) -> bool:
    from openai.types.chat import ChatCompletion
    from pydantic import ValidationError

    response = line.get("response") or {}
    if response.get("status_code") != 200 or line.get("error"):
        return False
    try:
        ChatCompletion.model_validate(response.get("body"))
    except ValidationError:
        return False
    return True
