"""Trial runs and checked answers on a Message Batch (issue 40 §1, §2), through the anthropic SDK's `extra_body`:
`trial` and `checks` beside `requests`, read by the one bounded reader, checked as an OpenAI create's are, shown
on the `MessageBatch` as extension fields. On the fake engine, whose answer's words follow its seed (a redraw draws
other words)."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types.messages import MessageBatch

from tests.conftest import LiveServer, make_key
from tests.integration.api.anthropic.batches import ENV, client_for, counted, req, wait_ended

pytestmark = pytest.mark.backfill_env(ENV)


def wait_trial(client: anthropic.Anthropic, batch_id: str, timeout: float = 60) -> MessageBatch:
    """The batch once its trial reported (and it paused, or went on, or ended)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = client.messages.batches.retrieve(batch_id)
        if ((batch.model_extra or {}).get("trial") or {}).get("status") == "reported":
            return batch
        time.sleep(0.1)
    raise AssertionError(f"the trial of {batch_id} never reported")


def result_lines(client: anthropic.Anthropic, batch_id: str) -> list[dict[str, Any]]:
    """The results as JSONL lines, extension fields (`attempts`) included."""
    return [line.to_dict() | (line.model_extra or {}) for line in client.messages.batches.results(batch_id)]


def test_a_manual_trial_pauses_a_message_batch_and_a_failing_answer_is_drawn_again(api: LiveServer) -> None:
    client = client_for(api, make_key("acme"))
    checks = {"regex": "lorem|ipsum", "max_attempts": 5}
    batch = client.messages.batches.create(
        requests=[req(f"r{i}", max_tokens=1) for i in range(12)],  # type: ignore[misc]
        extra_body={"trial": {"lines": 4}, "checks": checks},
    )
    shown = batch.model_extra or {}
    assert shown["trial"] == {
        "lines": 4,
        "continue": "manual",
        "min_success_rate": 0.95,
        "status": "pending",
        "report": None,
    }
    assert shown["checks"] == {"schema": True, "max_attempts": 5, "regex": "lorem|ipsum"}

    paused = wait_trial(client, batch.id)

    report = (paused.model_extra or {})["trial"]["report"]
    assert paused.processing_status == "in_progress" and (paused.model_extra or {})["paused_at"] is not None
    assert paused.request_counts.processing == 12 - report["lines_run"] and report["lines_run"] == 4
    assert report["decision"] == "paused" and report["checks"]["passed"] + report["checks"]["failed"] == 4
    assert report["projected_cost"]["lines"] == 12

    client.post(f"/v1/messages/batches/{batch.id}/resume", body={}, cast_to=MessageBatch)
    done = wait_ended(client, batch.id)

    assert counted(done) == 12 and done.request_counts.succeeded + done.request_counts.errored == 12
    lines = result_lines(client, batch.id)
    assert sorted(line["custom_id"] for line in lines) == sorted(f"r{i}" for i in range(12))  # each once
    for line in lines:
        attempts = line["attempts"]
        if line["result"]["type"] == "succeeded":
            assert line["result"]["message"]["content"][0]["text"] in ("lorem", "ipsum")
            assert attempts["count"] == len(attempts["failed"]) + 1
        else:
            error = line["result"]["error"]["error"]  # Anthropic's ErrorResponse: {"type": "error", "error": {...}}
            assert error["type"] == "invalid_request_error" and "failed a check" in error["message"]
            assert attempts["count"] == 5
        assert all(failed["check"] == "regex" for failed in attempts["failed"])
    # A quarter of the fake's words pass: twelve lines all passing at the first draw would be (1/4)^12.
    assert any(line["attempts"]["count"] > 1 for line in lines)
    assert (done.model_extra or {})["trial"]["report"] == report  # the report stays as it was


def test_an_auto_trial_that_meets_its_rate_goes_on_by_itself(api: LiveServer) -> None:
    client = client_for(api, make_key("acme"))
    batch = client.messages.batches.create(
        requests=[req(f"r{i}", max_tokens=2) for i in range(10)],  # type: ignore[misc]
        extra_body={"trial": {"share": 0.2, "continue": "auto", "min_success_rate": 0.9}},
    )

    done = wait_ended(client, batch.id)

    report = (done.model_extra or {})["trial"]["report"]
    assert done.request_counts.succeeded == 10 and report["lines_run"] == 2 and report["decision"] == "continued"
    assert (done.model_extra or {})["checks"] is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"trial": {"lines": 0}}, "trial.lines must be an integer"),
        ({"trial": {"share": 0.9}}, "trial.share"),
        ({"trial": "all"}, "trial must be an object"),
        ({"trial": {"lines": 3, "continue": "maybe"}}, "trial.continue"),
        ({"checks": {"max_attempts": 6}}, "checks.max_attempts"),
        ({"checks": {"regex": "("}}, "checks.regex"),
        ({"checks": {"enum": []}}, "checks.enum"),
        ({"checks": {"regex": "a\u0000"}}, "checks: contains a NUL"),
        ({"trial": {"lines": 3, "pad": "x" * 2000}}, "trial: longer than 1024 bytes"),
    ],
)
def test_a_bad_trial_or_checks_is_a_400_in_anthropics_envelope(
    api: LiveServer, extra: dict[str, Any], message: str
) -> None:
    key = make_key("acme")
    client = client_for(api, key)
    with pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.batches.create(requests=[req("a")], extra_body=extra)  # type: ignore[list-item]
    assert refused.value.status_code == 400 and message in str(refused.value)
    body = refused.value.response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert client.messages.batches.list().data == []


def test_checks_as_large_as_their_json_schema_allows_are_read_beside_the_requests(api: LiveServer) -> None:
    client = client_for(api, make_key("acme"))
    words = [f"word{i:05d}-" + "x" * 40 for i in range(256)]  # 256 values, ~12 KB: far past a scalar's 64 bytes
    raw = httpx.post(
        f"{api.base_url}/v1/messages/batches",
        headers={"x-api-key": client.api_key, "anthropic-version": "2023-06-01"},
        json={"checks": {"enum": words}, "requests": [req("a")]},
        timeout=30,
    )
    assert raw.status_code == 200, raw.text
    assert raw.json()["checks"]["enum"] == words
