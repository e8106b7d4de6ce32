"""How a batch row reads as Anthropic's `MessageBatch`: its `processing_status`, `ended_at` and `request_counts`,
and the rules Anthropic's API states in those words (only an in-progress batch can be canceled; results and
deletion wait until it has ended).

Status mapping: validating, in_progress, finalizing -> in_progress; cancelling -> canceling; completed,
failed, expired, cancelled -> ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from storage.batches.message_batches import NotEnded, unqueued_outcome
from storage.errors import InvalidRequest
from storage.models import Batch
from storage.protocols import ANTHROPIC


def processing_status(batch: Batch) -> str:
    """Anthropic's `processing_status`: in_progress, canceling or ended (the mapping: storage/protocols.py)."""
    return ANTHROPIC.shown_status(batch.status)


def ended_at(batch: Batch) -> int | None:
    """When processing ended (completed, cancelled, expired or failed), if it has."""
    return batch.completed_at or batch.cancelled_at or batch.expired_at or batch.failed_at


@dataclass(frozen=True)
class RequestCounts:
    """Anthropic's `request_counts`; they always add up to the batch's requests."""

    processing: int = 0
    succeeded: int = 0
    errored: int = 0
    canceled: int = 0
    expired: int = 0


def request_counts(batch: Batch) -> RequestCounts:
    """Live counts from the batch row's counters (no request is read, so a list page costs one query)."""
    completed, failed = batch.request_completed, batch.request_failed
    canceled, expired = batch.request_cancelled, batch.request_expired
    processing = max(0, batch.request_total - completed - failed)
    outcome = unqueued_outcome(batch)
    if outcome is not None and processing:  # ended before these were queued (cancelled, expired, refused)
        canceled += processing if outcome == "canceled" else 0
        expired += processing if outcome == "expired" else 0
        failed += processing
        processing = 0
    return RequestCounts(
        processing=processing,
        succeeded=completed,
        errored=failed - canceled - expired,
        canceled=canceled,
        expired=expired,
    )


def require_in_progress(batch: Batch) -> None:
    """Only an in-progress batch can be canceled (a canceling or ended one is a 400)."""
    status = processing_status(batch)
    if status != "in_progress":
        raise InvalidRequest(f"Message Batch {batch.id} is {status} and cannot be canceled.")


def require_ended_for_results(batch: Batch) -> None:
    """Results are there once the batch has ended."""
    if processing_status(batch) != "ended":
        raise NotEnded(f"Message Batch {batch.id} has not ended yet: results are available once it has.")


def require_ended_for_delete(batch: Batch) -> None:
    """Only an ended batch can be deleted (cancel it first)."""
    status = processing_status(batch)
    if status != "ended":
        raise NotEnded(f"Message Batch {batch.id} is {status}: only ended batches can be deleted (cancel it first).")
