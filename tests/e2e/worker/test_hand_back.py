"""Handing in-flight work back (a model switch) on the real engine: nothing runs twice, nothing is lost."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from tests.conftest import Backend
from tests.e2e.helpers import batch_line, read_file, submit
from worker.engine.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm


def test_work_handed_back_mid_decode_is_requeued_unrun_and_finishes_once_on_the_next_runner(
    backend: Backend, vllm_chat_engine: VllmEngine
) -> None:
    from storage.db import transaction
    from storage.files.blobs import get_blob_store
    from storage.models import Batch, BatchRequest
    from storage.settings import get_settings
    from worker.feed.runner import Runner
    from worker.jobs.finalize import finalize_batch

    lines = [batch_line(i, max_tokens=160) for i in range(12)]
    batch_id = submit(lines)
    first = Runner(vllm_chat_engine, model="backfill-demo", settings=get_settings())
    first.run_for(0.5)
    in_flight = set(first.inflight)
    assert in_flight and vllm_chat_engine.has_unfinished()  # sequences are decoding right now

    handed_back = first.hand_back(drain_seconds=0)

    assert handed_back == len(in_flight) and not vllm_chat_engine.has_unfinished()
    with transaction() as session:
        rows = session.execute(
            select(BatchRequest.id, BatchRequest.status, BatchRequest.attempts, BatchRequest.lease_owner).where(
                BatchRequest.batch_id == batch_id
            )
        ).all()
    back = [row for row in rows if row.id in in_flight]
    assert {(row.status, row.attempts, row.lease_owner) for row in back} == {("queued", 0, None)}

    second = Runner(vllm_chat_engine, model="backfill-demo", settings=get_settings())
    started = time.monotonic()
    while second.run_for(5.0):
        assert time.monotonic() - started < 120, "the batch did not finish"
    assert finalize_batch(get_blob_store(), batch_id=batch_id) == "completed"
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None
        outputs, errors = read_file(batch.output_file_id), read_file(batch.error_file_id)
        attempts = set(session.scalars(select(BatchRequest.attempts).where(BatchRequest.batch_id == batch_id)))
    assert not errors
    assert sorted(line["custom_id"] for line in outputs) == sorted(line["custom_id"] for line in lines)
    assert {line["response"]["body"]["usage"]["completion_tokens"] for line in outputs} == {160}
    assert attempts == {1}  # a handed-back request's first send is not counted as an attempt
