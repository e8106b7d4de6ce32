"""Admission with the background tier (issue 20 §6): background work never delays a deadline."""

from __future__ import annotations

from decimal import Decimal

from storage.batches.admission import edf_finish_times
from storage.planning.shapes import JobShape
from storage.queue.backlog import OpenJob
from storage.settings import Settings
from storage.windows import BACKGROUND_DEADLINE, deadline_for


def job(batch_id: str, deadline: int, requests: int) -> OpenJob:
    return OpenJob(batch_id, "t", deadline, JobShape(requests=requests, input_tokens=0, output_tokens=requests * 100))


def test_a_huge_background_backlog_does_not_move_a_deadline_jobs_finish() -> None:
    due = job("due", 10_000, requests=10)
    alone = edf_finish_times([due], work_per_second=100.0, prefill_weight=Decimal("0.2"), at=0.0)
    crowded = edf_finish_times(
        [job("bg", BACKGROUND_DEADLINE, requests=50_000), due], work_per_second=100.0, prefill_weight=Decimal(0), at=0.0
    )

    assert crowded["due"] == alone["due"] == 10.0 and crowded["bg"] > crowded["due"]


def test_background_has_no_deadline_and_a_deeper_discount_by_default() -> None:
    assert deadline_for("background", created_at=1_000) == BACKGROUND_DEADLINE
    assert deadline_for("24h", created_at=1_000) == 1_000 + 86_400
    windows = Settings().completion_windows
    assert windows["background"] > windows["24h"]
