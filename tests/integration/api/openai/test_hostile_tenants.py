"""One tenant's hostile batch never holds up another tenant's (issue 14, item 1).

Through the real API with the in-process worker (the embedded default) on the fake engine: while one
tenant's batch is being ingested or failing, another tenant's ordinary batch completes within a bound.
"""

from __future__ import annotations

import json
import time

import openai
import pytest

from tests.conftest import LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.backfill_env(
    {"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_INGEST_RETRY_SECONDS": "1", "BACKFILL_INGEST_MAX_ATTEMPTS": "3"}
)

BOUND_SECONDS = 30  # another tenant's 5-request batch on the 1 ms fake engine takes well under a second


def deep_line(levels: int) -> bytes:
    body = '{"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "x": '
    body += "[" * levels + "]" * levels + "}"
    return b'{"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", "body": ' + body.encode() + b"}\n"


def big_int_line() -> bytes:
    line = chat_line(99)
    text = json.dumps(line).replace('"max_tokens": 4', '"max_tokens": 9223372036854775808')
    return text.encode() + b"\n"


def create(client: openai.OpenAI, data: bytes) -> str:
    source = upload(client, data)
    return client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h").id


def test_a_deep_or_huge_integer_line_fails_its_own_batch_and_another_tenant_completes(api: LiveServer) -> None:
    attacker = api.client(make_key("mallory"))
    victim = api.client(make_key("acme"))
    hostile = (
        to_jsonl([chat_line(0)]) + deep_line(300) + big_int_line() + deep_line(1000).replace(b'"deep"', b'"deeper"')
    )
    hostile_id = create(attacker, hostile)
    started = time.monotonic()
    victim_id = create(victim, to_jsonl([chat_line(i) for i in range(5)]))
    done = wait_for(victim, victim_id, timeout=BOUND_SECONDS)
    assert done.status == "completed" and time.monotonic() - started < BOUND_SECONDS
    assert len(read_lines(victim, done.output_file_id)) == 5
    failed = wait_for(attacker, hostile_id, timeout=BOUND_SECONDS)
    assert failed.status == "failed"
    assert {(error.line, error.code) for error in failed.errors.data} == {
        (2, "too_deeply_nested"),
        (3, "integer_out_of_range"),
        (4, "too_deeply_nested"),
    }


def test_an_ingest_that_keeps_failing_fails_that_batch_after_a_few_tries_and_others_complete(
    api: LiveServer,
) -> None:
    from storage.batches.batches import create_batch
    from storage.db import transaction
    from storage.files.blobs import get_blob_store
    from storage.files.files import create_file
    from storage.tenants import get_or_create_tenant

    attacker = api.client(make_key("mallory"))
    victim = api.client(make_key("acme"))
    with transaction() as session:  # a batch whose input object vanished behind our back: ingest cannot read it
        tenant = get_or_create_tenant(session, name="mallory")
        source = create_file(
            session, get_blob_store(), tenant_id=tenant.id, filename="a.jsonl", purpose="batch", chunks=[b"{}\n"]
        )
        get_blob_store().delete(source.blob_key)
        broken_id = create_batch(
            session,
            tenant_id=tenant.id,
            input_file_id=source.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            model="fake-model",
            metadata=None,
        ).id
    started = time.monotonic()
    victim_id = create(victim, to_jsonl([chat_line(i) for i in range(5)]))
    assert wait_for(victim, victim_id, timeout=BOUND_SECONDS).status == "completed"
    assert time.monotonic() - started < BOUND_SECONDS
    broken = wait_for(attacker, broken_id, timeout=BOUND_SECONDS)
    assert broken.status == "failed"
    [error] = broken.errors.data
    assert error.code == "ingest_failed" and "3 attempts" in error.message and error.line is None
    again = create(victim, to_jsonl([chat_line(i) for i in range(2)]))  # the loop is still serving
    assert wait_for(victim, again, timeout=BOUND_SECONDS).status == "completed"
