"""`POST /v1/batches/estimate` reads a file as ingest does: bounded lines, the same verdicts (item 3)."""

from __future__ import annotations

import time

import pytest

from tests.conftest import LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for

LINE_MAX = 4096
pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_LINE_MAX_BYTES": str(LINE_MAX)})


def test_an_estimate_of_a_hostile_file_is_quick_and_agrees_with_ingest(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    huge = (
        b'{"custom_id": "huge", "method": "POST", "url": "/v1/chat/completions", "body": {"x": "'
        + b"a" * (16 * 1024 * 1024)
        + b'"}}\n'
    )
    deep = (
        b'{"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "fake-model", "x": '
    )
    deep += b"[" * 300 + b"]" * 300 + b"}}\n"
    data = (
        to_jsonl([chat_line(0), chat_line(1)]) + huge + deep + to_jsonl([{**chat_line(2), "url": "/v1/" + "u" * 3000}])
    )
    source = upload(client, data)
    body = {"input_file_id": source.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    started = time.monotonic()
    estimate = client.post("/batches/estimate", body=body, cast_to=object)
    assert time.monotonic() - started < 10
    assert estimate["requests"] == 2 and estimate["skipped_lines"] == 3
    batch = wait_for(client, client.batches.create(**body).id)  # type: ignore[arg-type]
    assert batch.status == "failed"
    ingested = [(error.line, error.code, error.message) for error in batch.errors.data]
    estimated = [(p["line"], p["code"], p["message"]) for p in estimate["problems"]]
    assert (
        estimated
        == ingested
        == [
            (
                3,
                "line_too_large",
                f"Line 3 is longer than {LINE_MAX} bytes (BACKFILL_LINE_MAX_BYTES; an inline base64 image counts toward it: a large one can go as an https URL).",
            ),
            (4, "too_deeply_nested", "Line 4 nests deeper than 64 levels."),
            (5, "mismatched_url", ingested[2][2]),
        ]
    )
    assert len(ingested[2][2]) < 400
