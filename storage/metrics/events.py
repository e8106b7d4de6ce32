"""Event metrics: counted in the process where the thing happens (prometheus-client, default registry).

Every label takes values from a small fixed set (models come from the registry, codes from the line
checker, operations and outcomes from the tuples below): no batch id, custom_id or tenant is ever a
label here. Labelled counters are created at zero for every known value, so an alert on a rate sees
the series before the first error. Queue state (depths, deadlines, goodput) is not counted here: it is
read from the database at scrape time (storage/metrics/queue_state.py).

Other modules increment through the small functions at the bottom; the webhook sender calls
`count_webhook_delivery(outcome)`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

PROCESS_INFO = Gauge(
    "backfill_process_info",
    "1 per Backfill process, by role (api, worker-gpu, worker-io, beat).",
    ["role"],
    multiprocess_mode="max",
)

# -- engine (worker/feed/probe.py feeds these from the runner) ------------------------------------------
ENGINE_BUSY_SECONDS = Counter("backfill_engine_busy_seconds", "Seconds spent inside engine steps.", ["model"])
ENGINE_STEPS = Counter("backfill_engine_steps", "Engine steps.", ["model"])
ENGINE_SEQ_STEPS = Counter(
    "backfill_engine_running_seq_steps", "Running sequences summed over steps (÷ steps = mean batch).", ["model"]
)
ENGINE_QUEUED_STEPS = Counter("backfill_engine_queued_steps", "Engine steps taken while work waited.", ["model"])
ENGINE_QUEUED_SEQ_STEPS = Counter(
    "backfill_engine_queued_running_seq_steps",
    "Running sequences summed over the steps taken while work waited (slot occupancy's numerator).",
    ["model"],
)
ENGINE_RUNNING = Gauge(
    "backfill_engine_running_sequences", "Sequences the engine decodes now.", ["model"], multiprocess_mode="livesum"
)
ENGINE_WAITING = Gauge(
    "backfill_engine_waiting_sequences", "Sequences accepted, not started.", ["model"], multiprocess_mode="livesum"
)
ENGINE_INFLIGHT = Gauge(
    "backfill_engine_inflight_requests", "Requests leased and in the engine.", ["model"], multiprocess_mode="livesum"
)
ENGINE_SLOTS = Gauge(
    "backfill_engine_max_num_seqs", "Engine slots (max_num_seqs).", ["model"], multiprocess_mode="livesum"
)
# LoRA adapters of the running engine (docs/adapters.md): loaded into it, and swapped back into flight after leaving.
ADAPTER_LOADS = Gauge(
    "backfill_engine_adapter_loads", "LoRA adapters the running engine loaded.", ["model"], multiprocess_mode="livesum"
)
ADAPTER_SWAPS = Gauge(
    "backfill_engine_adapter_swaps",
    "LoRA adapters that came back into the running engine's batch after leaving it.",
    ["model"],
    multiprocess_mode="livesum",
)
PROMPT_TOKENS = Counter("backfill_engine_prompt_tokens", "Prompt tokens of finished requests.", ["model"])
OUTPUT_TOKENS = Counter("backfill_engine_output_tokens", "Output tokens of finished requests.", ["model"])
ENGINE_RESULTS = Counter("backfill_engine_results", "Requests the engine finished, by outcome.", ["model", "outcome"])
RESULT_LATENCY = Histogram(
    "backfill_result_latency_seconds",
    "Claim to result committed, per request.",
    ["model"],
    buckets=LATENCY_BUCKETS,
)

DECODE_TOKENS_RESUMED = Counter(
    "backfill_decode_tokens_resumed",
    "Generated tokens a resumed request did not decode again, thanks to its checkpoint.",
    ["model"],
)
DECODE_TOKENS_DISCARDED = Counter(
    "backfill_decode_tokens_discarded",
    "Generated tokens thrown away: handed back without a checkpoint, or a checkpoint the engine could not use.",
    ["model"],
)
EXPIRY_CUTS = Counter(
    "backfill_expiry_cuts",
    "Requests still generating when their batch expired: `answered` with the text so far, or `unanswered`.",
    ["model", "outcome"],
)

# -- queue leases ----------------------------------------------------------------------------------------
CLAIMED = Counter("backfill_requests_claimed", "Requests leased to a worker.", ["model"])
RECLAIMED = Counter("backfill_requests_reclaimed", "Leases of requests that had been leased before.", ["model"])
LEASE_EXPIRIES = Counter(
    "backfill_lease_expiries", "Leases the reaper found expired (worker gone or stalled): re-queued or given up."
)

# -- ingest and finalize -------------------------------------------------------------------------------
REJECT_CODES = (
    "line_too_large",
    "invalid_encoding",
    "too_many_requests",
    "invalid_json",
    "missing_required_parameter",
    "invalid_custom_id",
    "duplicate_custom_id",
    "invalid_method",
    "mismatched_url",
    "invalid_body",
    "mismatched_model",
    "file_not_found",
    "empty_file",
    "model_not_found",
    "other",
)
INGEST_LINES = Counter("backfill_ingest_lines", "Lines ingest read, by outcome (enqueued or rejected).", ["outcome"])
INGEST_REJECTED = Counter("backfill_ingest_rejected_lines", "Bad lines found by validation, by code.", ["code"])
INGEST_SECONDS = Histogram(
    "backfill_ingest_seconds",
    "Validate and enqueue one batch, by outcome: enqueued, invalid (bad lines), refused (admission, quota).",
    ["outcome"],
    buckets=DURATION_BUCKETS,
)
FINALIZE_SECONDS = Histogram(
    "backfill_finalize_seconds", "Write one batch's result files and end it.", ["status"], buckets=DURATION_BUCKETS
)
# Actual minus predicted finish of an ended batch (storage/batches/finish_predictions.py): negative is early.
FINISH_ERROR_BUCKETS = (-86400, -21600, -3600, -900, -300, -60, -10, 0, 10, 60, 300, 900, 3600, 21600, 86400)
FINISH_OUTCOMES = ("completed", "expired")
FINISH_ERROR_SECONDS = Histogram(
    "backfill_batch_finish_error_seconds",
    "Ended batches' actual minus predicted finish, by completion window and outcome (completed; expired: the "
    "deadline passed first, so the error is at least this); negative: earlier than predicted.",
    ["window", "outcome"],
    buckets=FINISH_ERROR_BUCKETS,
)
COST_KINDS = ("list", "discount", "billed", "compute")
BATCH_COST_USD = Counter(
    "backfill_batch_cost_usd",
    "Cost blocks of ended batches, summed (list, discount, billed, compute); for dashboards, not billing.",
    ["model", "kind"],
)

# -- errors and webhooks -----------------------------------------------------------------------------
S3_OPERATIONS = ("put", "get", "delete", "head", "presign")
S3_ERRORS = Counter("backfill_s3_errors", "S3 calls that failed (after boto3's retries).", ["operation"])
DATABASE_ERROR_KINDS = (
    "OperationalError",
    "IntegrityError",
    "ProgrammingError",
    "DataError",
    "InternalError",
    "InterfaceError",
    "NotSupportedError",
    "DatabaseError",
    "other",
)
DATABASE_ERRORS = Counter("backfill_database_errors", "Database statements that failed, by error class.", ["error"])
WebhookOutcome = Literal["delivered", "http_error", "network_error", "refused", "gave_up"]
WEBHOOK_OUTCOMES: tuple[WebhookOutcome, ...] = ("delivered", "http_error", "network_error", "refused", "gave_up")
WEBHOOK_DELIVERIES = Counter(
    "backfill_webhook_deliveries",
    "Webhook delivery attempts by outcome: delivered (2xx), http_error (other status), network_error "
    "(timeout, refused connection), refused (target not allowed), gave_up (retries exhausted).",
    ["outcome"],
)

for _code in REJECT_CODES:
    INGEST_REJECTED.labels(_code)
for _outcome in ("enqueued", "rejected"):
    INGEST_LINES.labels(_outcome)
for _operation in S3_OPERATIONS:
    S3_ERRORS.labels(_operation)
for _kind in DATABASE_ERROR_KINDS:
    DATABASE_ERRORS.labels(_kind)
for _webhook in WEBHOOK_OUTCOMES:
    WEBHOOK_DELIVERIES.labels(_webhook)


def prepare_models(models: Iterable[str]) -> None:
    """Create every per-model series at zero, so dashboards and alerts see a model before its first request."""
    for model in models:
        counters = (ENGINE_BUSY_SECONDS, ENGINE_STEPS, PROMPT_TOKENS, OUTPUT_TOKENS, CLAIMED, RECLAIMED)
        for counter in (*counters, DECODE_TOKENS_RESUMED, DECODE_TOKENS_DISCARDED):
            counter.labels(model)
        for outcome in ("completed", "failed"):
            ENGINE_RESULTS.labels(model, outcome)
        for kind in COST_KINDS:
            BATCH_COST_USD.labels(model, kind)


def count_decode_tokens(model: str, *, resumed: int = 0, discarded: int = 0) -> None:
    """Generated tokens a checkpoint saved from decoding again (`resumed`), or that were thrown away."""
    if resumed:
        DECODE_TOKENS_RESUMED.labels(model).inc(resumed)
    if discarded:
        DECODE_TOKENS_DISCARDED.labels(model).inc(discarded)


def count_expiry_cuts(model: str, *, answered: int, unanswered: int) -> None:
    """Requests a worker cut short at their batch's expiry: answered with their text so far, or with nothing to show."""
    if answered:
        EXPIRY_CUTS.labels(model, "answered").inc(answered)
    if unanswered:
        EXPIRY_CUTS.labels(model, "unanswered").inc(unanswered)


def count_webhook_delivery(outcome: WebhookOutcome) -> None:
    """One webhook delivery attempt ended this way (the webhook sender calls this once per attempt)."""
    if outcome not in WEBHOOK_OUTCOMES:
        raise ValueError(f"unknown webhook outcome {outcome!r}: use one of {', '.join(WEBHOOK_OUTCOMES)}")
    WEBHOOK_DELIVERIES.labels(outcome).inc()


def count_s3_error(operation: str) -> None:
    """An S3 call failed."""
    if operation not in S3_OPERATIONS:
        raise ValueError(f"unknown S3 operation {operation!r}")
    S3_ERRORS.labels(operation).inc()


def count_database_error(error_class: str) -> None:
    """A database statement failed with this SQLAlchemy error class."""
    DATABASE_ERRORS.labels(error_class if error_class in DATABASE_ERROR_KINDS else "other").inc()


def count_lease_expiries(count: int) -> None:
    """The reaper released (or gave up on) this many expired leases."""
    if count:
        LEASE_EXPIRIES.inc(count)


def observe_ingest(*, enqueued: int, problems: list[dict[str, Any]], status: str, seconds: float) -> None:
    """One ingest pass: lines enqueued or bad lines by code (batch-level refusals count as a refused batch)."""
    bad = [problem["code"] for problem in problems if problem.get("line") is not None]
    for code in bad:
        INGEST_REJECTED.labels(code if code in REJECT_CODES else "other").inc()
    INGEST_LINES.labels("rejected").inc(len(bad))
    if status == "in_progress":
        INGEST_LINES.labels("enqueued").inc(enqueued)
        outcome = "enqueued"
    else:
        outcome = "invalid" if bad else "refused"
    INGEST_SECONDS.labels(outcome).observe(seconds)


def observe_finalized(manifest: dict[str, Any], *, seconds: float) -> None:
    """A batch ended with its files written: finalize latency, and its cost block added to the totals."""
    FINALIZE_SECONDS.labels(str(manifest.get("status"))).observe(seconds)
    cost = manifest.get("cost")
    model = str(manifest.get("model"))
    if not cost:
        return
    for kind in COST_KINDS:
        BATCH_COST_USD.labels(model, kind).inc(float(cost[f"{kind}_usd"]))


def prepare_windows(windows: Iterable[str]) -> None:
    """Create the finish-error series of every offered window at zero, so a dashboard sees them before a batch ends."""
    for window in windows:
        for outcome in FINISH_OUTCOMES:
            FINISH_ERROR_SECONDS.labels(window, outcome)


def observe_finish_error(*, window: str, outcome: str, seconds: float) -> None:
    """A batch ended (`completed` or `expired`) this many seconds after its predicted finish (negative: before)."""
    if outcome not in FINISH_OUTCOMES:
        raise ValueError(f"unknown finish outcome {outcome!r}: use one of {', '.join(FINISH_OUTCOMES)}")
    FINISH_ERROR_SECONDS.labels(window, outcome).observe(seconds)
