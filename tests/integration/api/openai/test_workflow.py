"""Trial runs and checked answers (issue 40 §1, §2) through the official openai SDK's `extra_body`, on the fake
engine (whose answer's words follow its seed, so a redraw draws other words)."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import openai
import pytest
from openai.types import Batch

from tests.conftest import LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS})


def create(client: openai.OpenAI, lines: list[dict[str, Any]], **extra: object) -> Batch:
    source = upload(client, to_jsonl(lines))
    return client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", extra_body=extra
    )


def wait_trial(client: openai.OpenAI, batch_id: str, timeout: float = 60) -> Batch:
    """The batch once its trial reported (and it paused, or went on, or ended)."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = client.batches.retrieve(batch_id)
        if (batch.model_extra or {}).get("trial", {}).get("status") == "reported":
            return batch
        time.sleep(0.1)
    raise AssertionError(f"the trial of {batch_id} never reported")


def results(client: openai.OpenAI, batch_id: str) -> list[dict[str, Any]]:
    text = client.get(f"/batches/{batch_id}/results", cast_to=str)
    return [json.loads(line) for line in text.splitlines() if line]


def test_a_manual_trial_runs_lines_spread_over_the_file_reports_pauses_and_resumes_without_running_them_twice(
    api: LiveServer,
) -> None:
    client = api.client(make_key("acme"))
    batch = create(client, [chat_line(i, max_tokens=3) for i in range(20)], trial={"lines": 4})
    assert batch.model_extra and batch.model_extra["trial"]["continue"] == "manual"

    paused = wait_trial(client, batch.id)
    trial = paused.model_extra["trial"]  # type: ignore[index]
    report = trial["report"]
    assert paused.status == "in_progress" and paused.model_extra["paused_at"] is not None  # type: ignore[index]
    assert paused.request_counts is not None and paused.request_counts.completed == 4
    # The middle of each of 4 stretches of 5 lines: never only the file's head.
    assert sorted(line["custom_id"] for line in results(client, batch.id)) == ["req-12", "req-17", "req-2", "req-7"]
    assert report["lines_run"] == 4 and report["success_rate"] == 1.0 and report["errors"] == {}
    assert report["decision"] == "paused" and report["tokens_per_line"]["output"] == 3.0
    cost = {key: Decimal(report["projected_cost"][key]) for key in ("estimate_usd", "low_usd", "high_usd")}
    trial_usd = Decimal(report["projected_cost"]["trial_usd"])
    # Every line here costs the same: the rest costs 4 times the trial, within a few millionths of a dollar.
    assert trial_usd > 0 and abs(cost["estimate_usd"] - 5 * trial_usd) <= Decimal("0.000005")
    assert cost["low_usd"] <= cost["estimate_usd"] <= cost["high_usd"] <= cost["low_usd"] + Decimal("0.000005")

    client.post(f"/batches/{batch.id}/resume", body={}, cast_to=Batch)
    done = wait_for(client, batch.id, timeout=60)
    lines = read_lines(client, done.output_file_id)
    assert done.status == "completed" and done.request_counts and done.request_counts.completed == 20
    assert sorted(line["custom_id"] for line in lines) == sorted(f"req-{i}" for i in range(20))  # each once
    assert done.model_extra and done.model_extra["trial"]["report"] == report  # the report stays as it was


def test_an_auto_trial_that_meets_its_rate_goes_on_by_itself(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    trial = {"share": 0.2, "continue": "auto", "min_success_rate": 0.9}
    batch = create(client, [chat_line(i, max_tokens=2) for i in range(10)], trial=trial)

    done = wait_for(client, batch.id, timeout=60)

    report = done.model_extra["trial"]["report"]  # type: ignore[index]
    assert done.status == "completed" and done.request_counts and done.request_counts.completed == 10
    assert report["lines_run"] == 2 and report["decision"] == "continued"


def test_an_auto_trial_below_its_rate_pauses_and_names_the_error_codes(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    # Even lines cannot run (min_tokens past max_tokens: the engine refuses them); the trial samples lines 2 and 7.
    lines = [chat_line(i, max_tokens=2, **({"min_tokens": 5} if i % 2 == 0 else {})) for i in range(10)]
    batch = create(client, lines, trial={"lines": 2, "continue": "auto", "min_success_rate": 0.9})

    paused = wait_trial(client, batch.id)

    report = paused.model_extra["trial"]["report"]  # type: ignore[index]
    assert paused.model_extra["paused_at"] is not None  # type: ignore[index]
    assert report["success_rate"] == 0.5 and report["errors"] == {"invalid_value": 1}
    assert report["decision"] == "paused"
    client.batches.cancel(batch.id)
    ended = wait_for(client, batch.id)
    assert ended.status == "cancelled" and ended.request_counts and ended.request_counts.completed == 1


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"trial": {"lines": 0}}, "trial.lines"),
        ({"trial": {"lines": 10**6}}, "trial.lines"),
        ({"trial": {"share": 0.9}}, "trial.share"),
        ({"trial": {"lines": 3, "share": 0.1}}, "trial"),
        ({"trial": {"lines": 3, "continue": "maybe"}}, "trial.continue"),
        ({"trial": {"lines": 3, "min_success_rate": 1.5}}, "trial.min_success_rate"),
        ({"trial": {"lines": 3, "when": "now"}}, "trial"),
        ({"checks": {"max_attempts": 6}}, "checks.max_attempts"),
        ({"checks": {"regex": "("}}, "checks.regex"),
        ({"checks": {"enum": []}}, "checks.enum"),
        ({"checks": {"json_schema": {"type": 5}}}, "checks.json_schema"),
        ({"checks": {"max_length": 0}}, "checks.max_length"),
    ],
)
def test_a_bad_trial_or_checks_is_refused_naming_the_field(api: LiveServer, extra: dict[str, Any], param: str) -> None:
    client = api.client(make_key("acme"))
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, [chat_line(0)], **extra)
    assert refused.value.code == "invalid_value" and refused.value.param == param


def attempts_of(line: dict[str, Any]) -> dict[str, Any]:
    attempts = line["attempts"]
    assert attempts["count"] == len(attempts["failed"]) + (1 if line["error"] is None else 0)
    return attempts


def test_answers_failing_a_regex_are_drawn_again_with_their_attempts_on_each_line(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    batch = create(
        client, [chat_line(i, max_tokens=1) for i in range(16)], checks={"regex": "lorem|ipsum", "max_attempts": 5}
    )

    done = wait_for(client, batch.id, timeout=60)

    good, bad = read_lines(client, done.output_file_id), read_lines(client, done.error_file_id)
    assert len(good) + len(bad) == 16
    for line in good:
        text = line["response"]["body"]["choices"][0]["message"]["content"]
        assert text in ("lorem", "ipsum")
        assert all(failed["check"] == "regex" for failed in attempts_of(line)["failed"])
    for line in bad:
        assert line["error"]["code"] == "checks_failed" and attempts_of(line)["count"] == 5
        assert line["response"]["body"]["choices"][0]["message"]["content"] not in ("lorem", "ipsum")  # the last answer
    assert any(attempts_of(line)["count"] > 1 for line in good)  # some needed a second draw and passed
    # Failed attempts are billed (the default): one output token per draw of every completed line.
    assert done.usage is not None and done.usage.output_tokens == sum(attempts_of(line)["count"] for line in good)


@pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_CHECKS_BILL_FAILED_ATTEMPTS": "false"})
def test_when_the_operator_does_not_bill_failed_attempts_a_line_costs_its_last_answer(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    batch = create(
        client, [chat_line(i, max_tokens=1) for i in range(16)], checks={"regex": "lorem|ipsum", "max_attempts": 5}
    )

    done = wait_for(client, batch.id, timeout=60)

    good = read_lines(client, done.output_file_id)
    assert any(attempts_of(line)["count"] > 1 for line in good)
    assert done.usage is not None and done.usage.output_tokens == len(good)


def test_a_line_schema_is_checked_and_a_json_schema_no_answer_meets_ends_as_checks_failed(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}
    lines = [chat_line(i, max_tokens=8, response_format=response_format) for i in range(3)]
    passing = create(client, lines, checks={"max_attempts": 3})
    never = create(
        client, lines, checks={"json_schema": {**schema, "properties": {"n": {"const": -1}}}, "max_attempts": 2}
    )

    ok, failed = wait_for(client, passing.id, timeout=60), wait_for(client, never.id, timeout=60)

    assert ok.request_counts and ok.request_counts.completed == 3
    assert all(attempts_of(line) == {"count": 1, "failed": []} for line in read_lines(client, ok.output_file_id))
    errors = read_lines(client, failed.error_file_id)
    assert len(errors) == 3 and failed.request_counts and failed.request_counts.failed == 3
    for line in errors:
        assert line["error"]["code"] == "checks_failed" and "json_schema" in line["error"]["message"]
        assert [a["check"] for a in attempts_of(line)["failed"]] == ["json_schema", "json_schema"]
        assert json.loads(line["response"]["body"]["choices"][0]["message"]["content"])["n"] != -1


def test_a_trial_reports_how_its_lines_fared_against_the_checks(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    batch = create(
        client,
        [chat_line(i, max_tokens=1) for i in range(20)],
        trial={"lines": 8},
        checks={"regex": "lorem|ipsum", "max_attempts": 2},
    )

    report = wait_trial(client, batch.id).model_extra["trial"]["report"]  # type: ignore[index]

    checks = report["checks"]
    assert checks["passed"] + checks["failed"] == 8 == report["lines_run"]
    assert checks["passed"] == report["succeeded"] and checks["redrawn"] >= checks["failed"]
    assert report["errors"] == ({"checks_failed": checks["failed"]} if checks["failed"] else {})
    client.batches.cancel(batch.id)


def test_a_batch_cancelled_during_its_trial_reports_what_ran_and_stays_cancelled(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    batch = create(client, [chat_line(i, max_tokens=10**8) for i in range(6)], trial={"lines": 2})
    wait_for(client, batch.id, {"in_progress"})

    client.batches.cancel(batch.id)
    ended = wait_for(client, batch.id)
    report = wait_trial(client, batch.id, timeout=30).model_extra["trial"]["report"]  # type: ignore[index]

    assert ended.status == "cancelled" and report["decision"] == "ended"
    assert report["lines_run"] == 2 and report["errors"] == {"batch_cancelled": 2}
    assert client.batches.retrieve(batch.id).status == "cancelled"
