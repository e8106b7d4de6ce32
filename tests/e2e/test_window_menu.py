"""A price for every deadline on the real vLLM engine (tiny demo model), embedded, through the official openai SDK
(issue 40 §3): the estimate's menu of windows, batches on four windows at once (1h, 4h, 24h, background), and each
one's predicted finish checked against its actual one on /metrics."""

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
    from worker.process import service

    migrate_database()
    # Engines and their runners are cached per process by model name and registry entry: a runner an earlier module
    # left (its I/O threads, its worker identity) must not serve this module's database. Once, in a full run, the
    # warm-up batch of this test sat queued for 600 s behind such a runner while the worker found nothing to do.
    service.close_engines()
    server, stop = start_server(with_worker=True)
    yield server
    stop()


def lines(n: int, *, max_tokens: int) -> bytes:
    body = {"model": "backfill-demo", "max_tokens": max_tokens}
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


def test_batches_on_four_windows_at_once_run_and_each_finish_is_checked_against_its_prediction(
    live: LiveServer,
) -> None:
    client = live.client(make_key("acme"))
    warm = client.batches.create(
        input_file_id=upload(client, lines(48, max_tokens=48)).id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    assert wait_for(client, warm.id, timeout=600).status == "completed"  # engine runs: the rate is measured from here
    windows = ("1h", "4h", "24h", "background")
    before = {window: finish_count(live, window) for window in windows}
    bodies = {
        window: {
            "input_file_id": upload(client, lines(32, max_tokens=32)).id,
            "endpoint": "/v1/chat/completions",
            "completion_window": window,
        }
        for window in windows
    }
    menus = {window: client.post("/batches/estimate", body=body, cast_to=object) for window, body in bodies.items()}
    for estimate in menus.values():
        assert [option["completion_window"] for option in estimate["windows"]] == list(windows)
        assert all(option["admitted"] for option in estimate["windows"])

    created = {window: client.batches.create(**body).id for window, body in bodies.items()}  # type: ignore[arg-type]
    done = {window: wait_for(client, batch_id, timeout=600) for window, batch_id in created.items()}

    for window in windows:
        batch = done[window]
        assert batch.status == "completed" and batch.completion_window == window
        with transaction() as session:
            predicted = session.get(Batch, batch.id).predicted_finish_at  # type: ignore[union-attr]
        assert predicted is not None
        option = next(o for o in menus[window]["windows"] if o["completion_window"] == window)
        rate = menus[window]["throughput"]
        print(
            f"{window}: predicted at ingest {predicted - batch.created_at} s after create, actual "
            f"{batch.completed_at - batch.created_at} s, error {batch.completed_at - predicted:+d} s; billed "
            f"{option['price']['billed_usd']} ({option['price']['discount_pct']}% off); rate {rate['source']} "
            f"{rate['work_per_second']} tokens/s"
        )
        assert finish_count(live, window) == before[window] + 1
