"""A price for every deadline on the real vLLM engine (tiny demo model), embedded, through the official openai SDK
(issue 40 §3): the estimate's menu of windows, batches on four windows at once (1h, 4h, 24h, background), and each
one's predicted finish checked against its actual one on /metrics; then the same through the official anthropic SDK
(Message Batches on 1h and background via `extra_body`, the menu from `POST /v1/messages/batches/estimate`)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anthropic
import httpx
import pytest
from anthropic.types.messages import MessageBatch

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


def test_message_batches_take_a_window_through_the_anthropic_sdk_and_their_estimate_answers_the_same_menu(
    live: LiveServer,
) -> None:
    assert live.worker is not None and live.worker.ready.wait(600)  # type: ignore[attr-defined]  # the engine is loaded
    client = anthropic.Anthropic(api_key=make_key("acme"), base_url=live.base_url, max_retries=0, timeout=120)
    requests = [
        {
            "custom_id": f"q{i}",
            "params": {
                "model": "backfill-demo",
                "max_tokens": 16,
                "messages": [{"role": "user", "content": f"Count to {i}."}],
            },
        }
        for i in range(8)
    ]
    menu = client.post(
        "/v1/messages/batches/estimate", body={"requests": requests, "completion_window": "1h"}, cast_to=object
    )
    assert menu["object"] == "batch.estimate" and (menu["completion_window"], menu["requests"]) == ("1h", 8)
    assert [option["completion_window"] for option in menu["windows"]] == list(WINDOWS)
    assert all(option["admitted"] for option in menu["windows"])
    offered = {option["completion_window"]: option for option in menu["windows"]}
    print("menu:", [(o["completion_window"], o["price"]["billed_usd"], o["admitted"]) for o in menu["windows"]])
    before = finish_count(live, "1h")

    created = {
        window: client.messages.batches.create(requests=requests, extra_body={"completion_window": window})  # type: ignore[arg-type]
        for window in ("1h", "background")
    }
    hour, background = created["1h"], created["background"]
    assert hour.expires_at - hour.created_at == timedelta(hours=1)
    assert background.expires_at == datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)  # no deadline, still a datetime

    for window, batch in created.items():
        done = wait_message_batch(client, batch.id)
        assert done.processing_status == "ended" and done.request_counts.succeeded == 8
        assert (done.model_extra or {})["completion_window"] == window and done.expires_at == batch.expires_at
        lines = list(client.messages.batches.results(done.id))
        assert {line.custom_id for line in lines} == {f"q{i}" for i in range(8)}
        assert all(line.result.type == "succeeded" for line in lines)
        cost = (done.model_extra or {})["cost"]
        assert cost["discount_pct"] == offered[window]["price"]["discount_pct"]  # the menu's discount is the bill's
        with transaction() as session:
            predicted = session.get(Batch, done.id).predicted_finish_at  # type: ignore[union-attr]
        assert predicted is not None
        created_at, ended_at = int(done.created_at.timestamp()), int(done.ended_at.timestamp())  # type: ignore[union-attr]
        print(
            f"message batch on {window}: predicted {predicted - created_at} s after create, actual "
            f"{ended_at - created_at} s; billed {cost['billed_usd']} ({cost['discount_pct']}% off), the menu said "
            f"{offered[window]['price']['billed_usd']}"
        )
    assert finish_count(live, "1h") == before + 1


def wait_message_batch(client: anthropic.Anthropic, batch_id: str, timeout: float = 600) -> MessageBatch:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        time.sleep(0.5)
    raise AssertionError(f"{batch_id} did not end in {timeout} s")
