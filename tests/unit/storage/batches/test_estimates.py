"""Estimating a job before it runs: file sizing, measured throughput, the backlog ahead of it."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches.estimates import estimate_job
from storage.planning.shapes import shape_of_jsonl
from storage.planning.throughput import measured_throughput
from storage.queue.backlog import backlog
from storage.settings import Settings, get_settings
from tests.factories import DAY0, make_batch, make_request, make_run, make_tenant

pytestmark = pytest.mark.backfill_env({"BACKFILL_GPU_COUNT": "8", "BACKFILL_GPU_HOUR_USD": "3.6"})


def line(i: int, **body: object) -> bytes:
    data = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", **body}}
    return json.dumps(data).encode() + b"\n"


def test_a_file_is_sized_from_its_max_tokens_and_bytes_even_across_chunk_boundaries() -> None:
    data = line(1, max_tokens=100) + line(2, max_completion_tokens=50, max_tokens=9) + line(3) + b"not json\n\n"
    chunks = [data[i : i + 7] for i in range(0, len(data), 7)]

    shape = shape_of_jsonl(chunks, max_line_bytes=10_000, max_requests=100)

    assert (shape.requests, shape.output_tokens, shape.skipped_lines, shape.model) == (3, 100 + 50 + 256, 1, "m")
    sizes = [len(line(1, max_tokens=100)), len(line(2, max_completion_tokens=50, max_tokens=9)), len(line(3))]
    assert shape.input_tokens == sum(-(-(n - 1) // 4) for n in sizes)  # bytes without the newline


def test_embeddings_produce_no_output_tokens() -> None:
    body = {"model": "m", "input": "hi"}
    data = json.dumps({"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": body})

    shape = shape_of_jsonl([data.encode()], max_line_bytes=10_000, max_requests=100)
    assert shape.requests == 1 and shape.output_tokens == 0


def test_throughput_is_measured_from_recent_runs_of_the_model(session: Session, settings: Settings) -> None:
    make_run(session, busy_seconds=10.0, prompt_tokens=5000, completion_tokens=9000)  # work 10,000
    make_run(session, busy_seconds=10.0, prompt_tokens=0, completion_tokens=10000)
    make_run(session, model="other", busy_seconds=1.0, completion_tokens=1)

    rate = measured_throughput(session, model="fake-model", prefill_weight=settings.prefill_weight)

    assert rate is not None and rate.source == "measured" and rate.runs == 2
    assert rate.work_per_second == pytest.approx(1000.0)
    assert rate.output_tokens_per_second == pytest.approx(950.0)
    assert measured_throughput(session, model="nothing-yet", prefill_weight=settings.prefill_weight) is None


def test_backlog_counts_open_requests_by_their_output_limits(session: Session) -> None:
    batch = make_batch(session, tenant=make_tenant(session))
    for _ in range(3):
        make_request(session, batch=batch, status=lifecycle.REQ_QUEUED, max_tokens=100)
    make_request(session, batch=batch, status=lifecycle.REQ_RUNNING)
    make_request(session, batch=batch, status=lifecycle.REQ_COMPLETED, max_tokens=999)

    queued = backlog(session, get_settings(), model="fake-model")

    assert (queued.requests, queued.output_tokens) == (4, 3 * 100 + 256)
    assert queued.input_tokens > 0


def test_estimate_waits_for_the_backlog_and_prices_the_job_at_the_node_rate(
    session: Session, settings: Settings
) -> None:
    make_run(session, busy_seconds=10.0, completion_tokens=10000)  # 1,000 output tokens per second
    batch = make_batch(session, tenant=make_tenant(session))
    for _ in range(10):
        make_request(session, batch=batch, status=lifecycle.REQ_QUEUED, max_tokens=1000)
    job = shape_of_jsonl([line(i, max_tokens=2000) for i in range(10)], max_line_bytes=10_000, max_requests=100)

    estimate = estimate_job(session, model="fake-model", shape=job, settings=settings, at=DAY0)

    assert estimate.throughput.source == "measured"
    assert estimate.backlog_seconds == pytest.approx(10 + 0.2 * estimate.backlog.input_tokens / 1000)
    assert estimate.job_seconds == pytest.approx(20 + 0.2 * job.input_tokens / 1000)
    assert estimate.start_at == pytest.approx(DAY0 + estimate.backlog_seconds)
    assert estimate.finish_at == pytest.approx(estimate.start_at + estimate.job_seconds)
    assert estimate.fits_window
    assert abs(estimate.cost.compute_usd - Decimal("0.008") * Decimal(estimate.job_seconds)) < Decimal("1e-9")
    body = estimate.to_json()
    assert body["cost"]["billed_usd"] and body["throughput"]["source"] == "measured"


def test_without_measurements_the_default_rate_is_used_and_said(session: Session, settings: Settings) -> None:
    job = shape_of_jsonl([line(1, max_tokens=500)], max_line_bytes=10_000, max_requests=100)

    estimate = estimate_job(
        session, model="fake-model", shape=job, settings=settings, default_tokens_per_second=50.0, at=DAY0
    )

    assert estimate.throughput.source == "default"
    assert estimate.job_seconds == pytest.approx((500 + 0.2 * job.input_tokens) / 50)
    assert estimate.to_json()["throughput"]["source"] == "default"
