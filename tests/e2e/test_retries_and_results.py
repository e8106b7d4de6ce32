"""End to end on the real vLLM engine (tiny model): results while a batch runs, retries and the merged view,
through the official openai SDK's generic `client.post` and through the `backfill` CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.vllm


@pytest.fixture
def live(demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    from tests.conftest import configure
    from worker.cli.migrate import migrate_database

    spec = {"path": str(demo_model_path), "max_num_seqs": 8, "max_model_len": 1024, "dtype": "float32"}
    configure(
        monkeypatch,
        {"BACKFILL_DATA_DIR": str(tmp_path / "data"), "BACKFILL_MODELS": json.dumps({"backfill-demo": spec})},
    )
    migrate_database()
    server, stop = start_server(with_worker=True)
    yield server
    stop()


def chat(i: int, **extra: object) -> dict[str, object]:
    body = {"model": "backfill-demo", "messages": [{"role": "user", "content": f"def f{i}():"}], "max_tokens": 16}
    return {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": {**body, **extra}}


def results(client: openai.OpenAI, batch_id: str, **params: str) -> tuple[list[dict[str, Any]], httpx.Headers]:
    response = httpx.get(
        f"{client.base_url}batches/{batch_id}/results",
        params=params,
        headers={"Authorization": f"Bearer {client.api_key}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()], response.headers


def test_follow_retry_twice_and_merge_on_the_real_engine(
    live: LiveServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from worker.cli.main import main

    key = make_key("acme")
    client = live.client(key)
    lines = [chat(i, ignore_eos=True) for i in range(12)] + [chat(98, temperature=-3)]  # c98: a client error
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines)).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    seen: list[dict[str, Any]] = []
    params: dict[str, str] = {}
    while True:  # follow: each line once, until the batch has ended
        page, headers = results(client, batch.id, **params)
        seen += page
        params = {"after": headers["X-Next-After"]}
        if headers["X-Incomplete"] == "false":
            break
    assert sorted(line["custom_id"] for line in seen) == sorted(f"c{i}" for i in [*range(12), 98])
    origin = wait_for(client, batch.id, timeout=300)
    assert origin.status == "completed" and origin.request_counts.failed == 1  # type: ignore[union-attr]
    [bad] = read_lines(client, origin.error_file_id)
    code = bad["error"]["code"]

    with pytest.raises(openai.BadRequestError):  # a client error is retried only when named
        client.post(f"/batches/{batch.id}/retry", body={}, cast_to=openai.types.Batch)
    first = client.post(f"/batches/{batch.id}/retry", body={"codes": [code]}, cast_to=openai.types.Batch)
    assert first.model_extra and first.model_extra["retry_of"] == batch.id
    assert first.request_counts and first.request_counts.total == 1  # the 12 successes are not run again
    wait_for(client, first.id, timeout=300)

    monkeypatch.setenv("BACKFILL_BASE_URL", live.base_url)
    monkeypatch.setenv("BACKFILL_API_KEY", key)
    # exit 3: the retry completed but its one line failed again (temperature -3 is refused every time)
    assert main(["batches", "retry", batch.id, "--codes", code, "--wait"]) == 3
    retries = client.batches.retrieve(batch.id).model_extra["retries"]  # type: ignore[index]
    assert len(retries) == 2 and retries[0] == first.id
    assert main(["batches", "results", batch.id, "--merged", "-o", str(tmp_path / "merged.jsonl")]) == 0
    merged = [json.loads(line) for line in (tmp_path / "merged.jsonl").read_text().splitlines()]
    assert [line["custom_id"] for line in merged] == [f"c{i}" for i in [*range(12), 98]]  # each exactly once
    [latest] = read_lines(client, client.batches.retrieve(retries[1]).error_file_id)
    assert merged[-1] == latest  # the second retry's attempt wins
    assert all(line["response"]["status_code"] == 200 for line in merged[:-1])
