"""Trial runs and checked answers on the real vLLM engine (tiny demo model), embedded, through the official openai
SDK's `extra_body` (issue 40 §1, §2): a trial of lines spread over the file runs first, reports and lets the batch
go on; answers failing a check are drawn again on the server and each line says how many draws it took; a line
schema under constrained decoding is counted for how often it needed a second draw."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch

from tests.conftest import LiveServer, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.vllm


@pytest.fixture
def live(demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    from tests.conftest import configure
    from worker.cli.migrate import migrate_database

    models = {"backfill-demo": {"path": str(demo_model_path), "max_num_seqs": 8, "max_model_len": 1024}}
    configure(monkeypatch, {"BACKFILL_DATA_DIR": str(tmp_path / "data"), "BACKFILL_MODELS": json.dumps(models)})
    migrate_database()
    server, stop = start_server(with_worker=True)
    yield server
    stop()


def lines(n: int, **body: Any) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "backfill-demo", "messages": [{"role": "user", "content": f"Say {i}."}], **body},
        }
        for i in range(n)
    ]


def create(client: openai.OpenAI, rows: list[dict[str, Any]], **extra: Any) -> Batch:
    source = upload(client, to_jsonl(rows))
    return client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", extra_body=extra
    )


def test_a_trial_with_a_length_check_runs_first_goes_on_and_every_kept_answer_passes(live: LiveServer) -> None:
    client = live.client(make_key("acme"))
    rows = lines(12, temperature=1.0)
    for i, row in enumerate(rows):
        row["body"]["max_tokens"] = 1 + i % 4  # one token's text fits 16 characters; four tokens' often do not
    batch = create(
        client,
        rows,
        trial={"lines": 3, "continue": "auto", "min_success_rate": 0.0},
        checks={"max_length": 16, "max_attempts": 3},
    )

    done = wait_for(client, batch.id, timeout=600)

    report = done.model_extra["trial"]["report"]  # type: ignore[index]
    print(f"trial report: {json.dumps(report)}")
    assert report["lines_run"] == 3 and report["decision"] == "continued"
    assert report["checks"]["passed"] + report["checks"]["failed"] == 3
    assert decimal_interval_ok(report["projected_cost"])
    good, bad = read_lines(client, done.output_file_id), read_lines(client, done.error_file_id)
    assert sorted(line["custom_id"] for line in good + bad) == sorted(f"line-{i}" for i in range(12))
    assert good  # the one-token lines pass
    for line in good:
        assert len(line["response"]["body"]["choices"][0]["message"]["content"] or "") <= 16
        assert line["attempts"]["count"] == len(line["attempts"]["failed"]) + 1 <= 3
    for line in bad:
        assert line["error"]["code"] == "checks_failed" and line["attempts"]["count"] == 3
        assert {failed["check"] for failed in line["attempts"]["failed"]} == {"max_length"}
    redrawn = sum(line["attempts"]["count"] > 1 for line in good + bad)
    print(f"length check: {redrawn} of 12 lines drawn again, {len(bad)} ended checks_failed")
    assert redrawn > 0  # four tokens of the demo model run past 16 characters often enough


def decimal_interval_ok(projected: dict[str, Any]) -> bool:
    from decimal import Decimal

    low, mid, high = (Decimal(projected[key]) for key in ("low_usd", "estimate_usd", "high_usd"))
    return Decimal(projected["trial_usd"]) <= low <= mid <= high  # lines that failed every draw are not billed


def test_a_line_schema_under_constrained_decoding_needs_a_second_draw_only_when_cut_off(live: LiveServer) -> None:
    client = live.client(make_key("acme"))
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": True}}
    batch = create(client, lines(12, max_tokens=24, response_format=response_format), checks={"max_attempts": 3})

    done = wait_for(client, batch.id, timeout=600)

    results = read_lines(client, done.output_file_id) + read_lines(client, done.error_file_id)
    assert len(results) == 12
    for line in results:
        body = line["response"]["body"]
        if line["error"] is None:  # a kept answer is JSON its schema accepts
            assert isinstance(json.loads(body["choices"][0]["message"]["content"])["answer"], str)
        for failed in line["attempts"]["failed"]:
            assert failed["check"] == "schema" and failed["message"] == "the answer is not JSON"  # cut off only
    redrawn = sum(line["attempts"]["count"] > 1 for line in results)
    print(f"schema check: {redrawn} of 12 lines drawn again, {done.request_counts.failed} ended checks_failed")  # type: ignore[union-attr]
