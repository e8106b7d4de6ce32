"""Admission at ingest: deadline feasibility from measured throughput (warn or reject) and enqueued-token quotas."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select, update

from storage import lifecycle
from storage.clock import now
from storage.db import transaction
from storage.models import Batch, BatchRequest
from storage.settings import Settings
from tests.conftest import Backend
from tests.factories import make_run
from tests.integration.jobs import chat, submit_job

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})

HOUR = 3600


def measured_at_ten_tokens_per_second() -> None:
    with transaction() as session:
        make_run(session, busy_seconds=100.0, completion_tokens=1000)


def job(n: int, max_tokens: int) -> list[dict[str, object]]:
    return [chat(i, max_tokens=max_tokens) for i in range(n)]


def batch_and_rows(batch_id: str) -> tuple[Batch, int]:
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        rows = session.scalar(select(func.count()).where(BatchRequest.batch_id == batch_id))
    assert batch is not None
    return batch, int(rows or 0)


def test_a_job_that_cannot_finish_in_its_window_is_accepted_with_a_warning(backend: Backend) -> None:
    measured_at_ten_tokens_per_second()

    batch_id, status = submit_job(job(10, 5000), deadline=now() + HOUR)  # ~5,000 s of work in an hour

    batch, rows = batch_and_rows(batch_id)
    assert status == lifecycle.IN_PROGRESS and rows == 10 and batch.errors is None
    assert batch.warnings is not None and [w["code"] for w in batch.warnings] == ["deadline_at_risk"]
    assert "measured 10 tokens/s" in batch.warnings[0]["message"]
    assert "accepted anyway" in batch.warnings[0]["message"]


def test_a_job_that_fits_gets_no_warning(backend: Backend) -> None:
    measured_at_ten_tokens_per_second()

    batch_id, status = submit_job(job(10, 100), deadline=now() + HOUR)  # ~100 s of work

    batch, rows = batch_and_rows(batch_id)
    assert status == lifecycle.IN_PROGRESS and rows == 10 and batch.warnings is None


def test_reject_policy_fails_an_infeasible_job_and_enqueues_nothing(backend: Backend, settings: Settings) -> None:
    measured_at_ten_tokens_per_second()
    strict = settings.model_copy(update={"admission_policy": "reject"})

    batch_id, status = submit_job(job(10, 5000), deadline=now() + HOUR, settings=strict)

    batch, rows = batch_and_rows(batch_id)
    assert status == lifecycle.FAILED and rows == 0 and batch.failed_at is not None
    assert batch.errors == [
        {"code": "deadline_infeasible", "message": batch.errors[0]["message"], "param": None, "line": None}
    ]
    assert "after its completion window closes" in batch.errors[0]["message"]
    assert "was not enqueued" in batch.errors[0]["message"]


def test_reject_policy_protects_jobs_already_accepted(backend: Backend, settings: Settings) -> None:
    measured_at_ten_tokens_per_second()
    strict = settings.model_copy(update={"admission_policy": "reject"})
    accepted, first = submit_job(job(3, 10_000), deadline=now() + HOUR, settings=strict)  # 3,000 s of 3,600

    urgent, second = submit_job(job(1, 10_000), deadline=now() + HOUR // 2, settings=strict)  # fits on its own

    assert first == lifecycle.IN_PROGRESS and second == lifecycle.FAILED
    batch, rows = batch_and_rows(urgent)
    assert rows == 0 and batch.errors is not None and batch.errors[0]["code"] == "deadline_infeasible"
    assert "push 1 accepted batches past their deadlines" in batch.errors[0]["message"]
    assert batch_and_rows(accepted)[1] == 3


def test_reject_policy_only_warns_while_throughput_is_unmeasured(backend: Backend, settings: Settings) -> None:
    strict = settings.model_copy(update={"admission_policy": "reject"})

    batch_id, status = submit_job(job(10, 10_000), deadline=now() + 60, settings=strict)  # 100 s at 1,000 tok/s

    batch, rows = batch_and_rows(batch_id)
    assert status == lifecycle.IN_PROGRESS and rows == 10
    assert batch.warnings is not None and batch.warnings[0]["code"] == "deadline_at_risk"
    assert "not measured yet" in batch.warnings[0]["message"]


def test_admission_off_accepts_without_a_word(backend: Backend, settings: Settings) -> None:
    measured_at_ten_tokens_per_second()
    lax = settings.model_copy(update={"admission_policy": "off"})

    batch_id, status = submit_job(job(10, 5000), deadline=now() + HOUR, settings=lax)

    assert status == lifecycle.IN_PROGRESS and batch_and_rows(batch_id)[0].warnings is None


def test_a_batch_over_the_enqueued_token_limit_fails_validation(backend: Backend, settings: Settings) -> None:
    limited = settings.model_copy(update={"enqueued_token_limit": 500})
    _, ok = submit_job(job(10, 4), tenant="acme", settings=limited)  # ~10 x 35 input tokens
    second, refused = submit_job(job(10, 4), tenant="acme", settings=limited)
    _, other = submit_job(job(10, 4), tenant="globex", settings=limited)  # quotas are per tenant

    assert (ok, refused, other) == (lifecycle.IN_PROGRESS, lifecycle.FAILED, lifecycle.IN_PROGRESS)
    batch, rows = batch_and_rows(second)
    assert rows == 0 and batch.errors is not None and len(batch.errors) == 1
    error = batch.errors[0]
    assert error["code"] == "token_limit_exceeded" and error["line"] is None
    assert (
        "Enqueued token limit reached for fake-model in organization acme. Limit: 500 enqueued tokens"
        in error["message"]
    )


def test_finished_work_no_longer_counts_against_the_quota(backend: Backend, settings: Settings) -> None:
    limited = settings.model_copy(update={"enqueued_token_limit": 500})
    first, _ = submit_job(job(10, 4), settings=limited)
    with transaction() as session:
        session.execute(
            update(BatchRequest).where(BatchRequest.batch_id == first).values(status=lifecycle.REQ_COMPLETED)
        )

    _, status = submit_job(job(10, 4), settings=limited)

    assert status == lifecycle.IN_PROGRESS


def test_a_tenant_override_replaces_the_default_limit(backend: Backend, settings: Settings) -> None:
    limited = settings.model_copy(update={"enqueued_token_limit": 1000, "enqueued_token_limits": {"big": 10**6}})
    tight = settings.model_copy(update={"enqueued_token_limits": {"tiny": 100}})

    _, big = submit_job(job(40, 4), tenant="big", settings=limited)
    _, small = submit_job(job(40, 4), tenant="small", settings=limited)
    _, tiny = submit_job(job(10, 4), tenant="tiny", settings=tight)
    _, free = submit_job(job(40, 4), tenant="free", settings=tight)  # no default: unlimited

    assert (big, small, tiny, free) == ("in_progress", "failed", "failed", "in_progress")
