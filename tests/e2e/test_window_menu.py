"""A price for every deadline on the real vLLM engine (tiny demo model), embedded, through the official openai SDK
(issue 40 §3): the estimate's menu of windows, batches on windows other than 24h, and each one's predicted finish
checked against its actual one on /metrics."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from storage.db import transaction
from storage.models import Batch
from tests.conftest import LiveServer, make_key, start_server
from tests.integration.api.helpers import to_jsonl, upload, wait_for

pytestmark = pytest.mark.vllm
WINDOWS = {"1h": "0.2", "4h": "0.4", "24h": "0.5", "background": "0.6"}


@pytest.fixture
def live(demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    from tests.conftest import configure
    from worker.cli.migrate import migrate_database

    models = {"backfill-demo": {"path": str(demo_model_path), "max_num_seqs": 8, "max_model_len": 1024}}
    configure(
        monkeypatch,
        {
            "BACKFILL_DATA_DIR": str(tmp_path / "data"),
            "BACKFILL_MODELS": json.dumps(models),
            "BACKFILL_COMPLETION_WINDOWS": json.dumps(WINDOWS),
        },
    )
    migrate_database()
    server, stop = start_server(with_worker=True)
    yield server
    stop()


def lines(n: int) -> bytes:
    body = {"model": "backfill-demo", "max_tokens": 16}
    return to_jsonl(
        [
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {**body, "messages": [{"role": "user", "content": f"Count to {i}."}]},
            }
            for i in range(n)
        ]
    )


def finish_count(server: LiveServer, window: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics").text
    pattern = rf'^backfill_batch_finish_error_seconds_count\{{outcome="completed",window="{window}"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    assert found is not None
    return float(found.group(1))


def test_batches_on_the_1h_and_4h_windows_run_and_their_finish_is_checked_against_the_prediction(
    live: LiveServer,
) -> None:
    client = live.client(make_key("acme"))
    warm = client.batches.create(
        input_file_id=upload(client, lines(8)).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert wait_for(client, warm.id, timeout=600).status == "completed"  # a first engine run (measured past 1 s busy)

    for window in ("1h", "4h"):
        source = upload(client, lines(24))
        body = {"input_file_id": source.id, "endpoint": "/v1/chat/completions", "completion_window": window}
        estimate = client.post("/batches/estimate", body=body, cast_to=object)
        menu = {option["completion_window"]: option for option in estimate["windows"]}
        assert list(menu) == ["1h", "4h", "24h", "background"] and menu[window]["admitted"] is True
        before = finish_count(live, window)

        done = wait_for(client, client.batches.create(**body).id, timeout=600)  # type: ignore[arg-type]

        assert done.status == "completed" and done.completion_window == window
        with transaction() as session:
            predicted = session.get(Batch, done.id).predicted_finish_at  # type: ignore[union-attr]
        assert predicted is not None
        print(
            f"{window}: menu finish {menu[window]['finish_at'] - estimate['start_at']} s after the estimate, "
            f"predicted at ingest {predicted - done.created_at} s after create, "
            f"actual {done.completed_at - done.created_at} s; error {done.completed_at - predicted} s; "
            f"billed {menu[window]['price']['billed_usd']} at {menu[window]['price']['discount_pct']}% off; "
            f"throughput {estimate['throughput']['source']} {estimate['throughput']['work_per_second']} tokens/s"
        )
        assert finish_count(live, window) == before + 1
