"""Partial answers at expiry on the real vLLM engine (tiny demo model), embedded, through the official openai SDK
(issue 40 §4): lines still generating when the window closes end with the text they generated so far, a length
stop the SDK parses and marked `backfill.cut_by`; with `on_expiry: "continue_in_background"` they carry on from
their checkpoints in a background child batch, and the merged view gives each line once, as the uninterrupted
generation would have answered it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion

from tests.conftest import LiveServer, make_key
from tests.e2e.resume import (
    EXPIRY_MAX_TOKENS,
    checkpointing_server,
    greedy_lines,
    rows_of,
    wait_until_checkpointed_mid_decode,
    window_closes,
)
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.vllm


@pytest.fixture
def live(demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    with checkpointing_server(demo_model_path, monkeypatch, tmp_path) as server:
        yield server


def run(client: openai.OpenAI, prefix: str, **extra: Any) -> str:
    lines = greedy_lines(prefix)
    for line in lines:
        line["body"]["max_tokens"] = EXPIRY_MAX_TOKENS
    source = upload(client, to_jsonl(lines))
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", extra_body=extra
    )
    return batch.id


def texts(lines: list[dict[str, Any]], prefix: str) -> dict[str, str]:
    """Each line's answer text by its number (the custom_id without `prefix`)."""
    found = {}
    for line in lines:
        message = ChatCompletion.model_validate(line["response"]["body"]).choices[0].message
        found[line["custom_id"].removeprefix(prefix)] = message.content or ""
    return found


def reference(client: openai.OpenAI) -> dict[str, str]:
    """The uninterrupted greedy answers."""
    done = wait_for(client, run(client, "ref-"), timeout=600)
    assert done.status == "completed"
    return texts(read_lines(client, done.output_file_id), "ref-")


def test_lines_generating_at_expiry_end_with_the_text_so_far_as_a_length_stop(live: LiveServer) -> None:
    client = live.client(make_key("acme"))
    full = reference(client)
    batch_id = run(client, "cut-")
    wait_until_checkpointed_mid_decode(batch_id, alive=lambda: True)
    window_closes(batch_id)

    done = wait_for(client, batch_id, timeout=120)
    assert done.status == "expired"
    cut, expired = read_lines(client, done.output_file_id), read_lines(client, done.error_file_id)
    assert sorted(line["custom_id"] for line in cut + expired) == sorted(f"cut-{i}" for i in range(len(full)))
    assert cut and {line["error"]["code"] for line in expired} <= {"batch_expired"}
    so_far = texts(cut, "cut-")
    for line in cut:
        completion = ChatCompletion.model_validate(line["response"]["body"])  # the SDK's own type
        assert completion.choices[0].finish_reason == "length" and completion.usage is not None
        number = line["custom_id"].removeprefix("cut-")
        if "backfill" not in (completion.model_extra or {}):  # it ended by itself before its worker's renewal
            assert completion.usage.completion_tokens == EXPIRY_MAX_TOKENS and so_far[number] == full[number]
            continue
        assert (completion.model_extra or {})["backfill"] == {"cut_by": "expiry"}
        assert 1 <= completion.usage.completion_tokens < EXPIRY_MAX_TOKENS
        assert full[number].startswith(so_far[number])  # what the uninterrupted generation had at that token
    assert any("backfill" in line["response"]["body"] for line in cut)
    tokens = sorted(line["response"]["body"]["usage"]["completion_tokens"] for line in cut)
    print(f"a cut line: {json.dumps(cut[0])}")
    print(f"cut at expiry: {len(cut)} lines with {tokens} tokens, {len(expired)} batch_expired")
    assert done.model_extra and float(done.model_extra["cost"]["billed_usd"]) > 0  # billed for what was generated


def test_a_batch_continued_in_the_background_answers_each_line_once_as_if_never_interrupted(live: LiveServer) -> None:
    from worker.process.service import reap_once

    client = live.client(make_key("acme"))
    full = reference(client)
    batch_id = run(client, "bg-", on_expiry="continue_in_background")
    wait_until_checkpointed_mid_decode(batch_id, alive=lambda: True)
    window_closes(batch_id)
    reap_once()  # the reaper's pass now: the lines are mid-generation

    origin = wait_for(client, batch_id, timeout=120)
    assert origin.status == "expired" and origin.model_extra
    (child_id,) = origin.model_extra["retries"]
    child = wait_for(client, child_id, timeout=600)
    assert child.status == "completed" and child.completion_window == "background"
    text = client.get(f"/batches/{batch_id}/results", cast_to=str, options={"params": {"merged": "true"}})
    merged = [json.loads(line) for line in text.splitlines() if line]
    assert sorted(line["custom_id"] for line in merged) == sorted(f"bg-{i}" for i in range(len(full)))  # once each
    for line in merged:
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.usage is not None and completion.usage.completion_tokens == EXPIRY_MAX_TOKENS
        assert "backfill" not in (completion.model_extra or {})
    assert texts(merged, "bg-") == full  # token-exact: the resumed lines read as the uninterrupted ones
    print(f"continued in the background: {child.request_counts.total} of {len(full)} lines in {child_id}")  # type: ignore[union-attr]


def handed_back(batch_id: str, timeout: float = 60) -> dict[str, tuple[str, int]]:
    """Each line's (status, checkpoint tokens) once a pause took every running line back (none runs)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = rows_of(batch_id)
        if all(status != "running" for status, _ in rows.values()):
            return rows
        assert time.monotonic() < deadline, f"the pause did not hand the lines back: {rows}"
        time.sleep(0.1)


def test_a_paused_batchs_lines_end_at_expiry_with_the_text_generated_before_the_pause(live: LiveServer) -> None:
    client = live.client(make_key("acme"))
    full = reference(client)
    batch_id = run(client, "pz-")
    wait_until_checkpointed_mid_decode(batch_id, alive=lambda: True)
    client.post(f"/batches/{batch_id}/pause", body={}, cast_to=openai.types.Batch)
    rows = handed_back(batch_id)
    held = {cid: tokens for cid, (status, tokens) in rows.items() if status == "queued" and tokens > 0}
    assert held, f"no line was generating at the pause: {rows}"
    window_closes(batch_id)

    done = wait_for(client, batch_id, timeout=120)
    assert done.status == "expired"
    outputs, expired = read_lines(client, done.output_file_id), read_lines(client, done.error_file_id)
    assert sorted(line["custom_id"] for line in outputs + expired) == sorted(rows)  # each line once
    cut = [line for line in outputs if "backfill" in line["response"]["body"]]
    assert sorted(line["custom_id"] for line in cut) == sorted(held)
    assert {line["error"]["code"] for line in expired} <= {"batch_expired"}
    so_far = texts(cut, "pz-")
    for line in cut:
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.choices[0].finish_reason == "length" and completion.usage is not None
        assert (completion.model_extra or {})["backfill"] == {"cut_by": "expiry"}
        assert completion.usage.completion_tokens == held[line["custom_id"]]  # not a token after the pause
        number = line["custom_id"].removeprefix("pz-")
        assert full[number].startswith(so_far[number])
    print(f"paused, then expired: {len(cut)} lines cut with {sorted(held.values())} tokens, {len(expired)} expired")
    assert done.model_extra and float(done.model_extra["cost"]["billed_usd"]) > 0
