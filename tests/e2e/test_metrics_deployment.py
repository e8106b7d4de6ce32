"""The Celery deployment's /metrics after a real batch on vLLM: API, GPU worker, io worker and beat each answer,
and together they expose every metric the Grafana dashboard and the alert rules name."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import Backend, LiveServer, configure, free_port, make_key, start_server
from tests.e2e.test_celery_worker import spawn
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for
from tests.observability import named_metrics
from tests.scrape import scrape, total, value

pytestmark = pytest.mark.vllm

ROLES = ("worker-gpu", "worker-io", "beat")
# Its own Redis database: `make test` runs test files on two pytest-xdist workers at once, and a deployment
# that shared test_celery_worker's database would flush and consume that test's messages.
REDIS_URL = "redis://127.0.0.1:6379/6"


@pytest.fixture
def deployment(
    backend: Backend, demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[tuple[LiveServer, dict[str, int]]]:
    if backend.name != "postgres":
        pytest.skip("the Celery deployment runs on Postgres + Redis + S3")
    redis.Redis.from_url(REDIS_URL).flushdb()
    env = {
        **backend.env,
        "BACKFILL_REDIS_URL": REDIS_URL,
        "BACKFILL_MODELS": json.dumps(
            {"backfill-demo": {"path": str(demo_model_path), "max_num_seqs": 8, "dtype": "float32"}}
        ),
        "BACKFILL_REAP_INTERVAL_SECONDS": "1",
        "BACKFILL_RUN_TASK_SECONDS": "5",
        "BACKFILL_METRICS_CACHE_SECONDS": "0",
        "BACKFILL_OBJECT_PREFIX": "backfill",
    }
    configure(monkeypatch, env)
    ports = {role: free_port() for role in ROLES}
    commands = {"worker-gpu": ["worker", "--role", "gpu"], "worker-io": ["worker", "--role", "io"], "beat": ["beat"]}
    procs = [
        spawn([*commands[role], "--metrics-port", str(ports[role])], env, tmp_path / f"{role}.log") for role in ROLES
    ]
    server, stop = start_server(with_worker=False)
    try:
        yield server, ports
    finally:
        stop()
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def wait_until_scrapable(url: str, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered")


def test_every_process_exposes_metrics_and_together_they_cover_the_dashboard_after_a_real_batch(
    deployment: tuple[LiveServer, dict[str, int]],
) -> None:
    server, ports = deployment
    urls = {
        "api": f"{server.base_url}/metrics",
        **{role: f"http://127.0.0.1:{port}/metrics" for role, port in ports.items()},
    }
    for url in urls.values():
        wait_until_scrapable(url)  # the GPU worker answers while its engine still loads
    client = server.client(make_key("acme"))
    lines = [
        {
            "custom_id": f"m{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "backfill-demo",
                "messages": [{"role": "user", "content": f"x{i}"}],
                "max_tokens": 24,
                "ignore_eos": True,
            },
        }
        for i in range(24)
    ]
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines)).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    seen_open = False
    deadline = time.time() + 300
    while (current := client.batches.retrieve(batch.id)).status not in {"completed", "failed", "expired", "cancelled"}:
        assert time.time() < deadline, current
        samples, _ = scrape(urls["api"])
        if total(samples, "backfill_queue_requests") > 0:  # the queue gauges while work is open
            seen_open = True
            assert value(samples, "backfill_queue_earliest_deadline_seconds", model="backfill-demo") > 86000
            assert value(samples, "backfill_queue_deadline_slack_seconds", model="backfill-demo") > 0
        time.sleep(0.5)
    done = wait_for(client, batch.id)
    assert done.status == "completed" and seen_open
    output_tokens = sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in read_lines(client, done.output_file_id)
    )

    scrapes = {role: scrape(url) for role, url in urls.items()}
    api, gpu, io, beat = (scrapes[role][0] for role in ("api", "worker-gpu", "worker-io", "beat"))
    demo = {"model": "backfill-demo"}
    assert value(api, "backfill_requests_finished_total", tenant="acme", outcome="completed", **demo) == 24
    assert value(api, "backfill_batches", status="completed", **demo) == 1
    assert value(api, "backfill_goodput_ratio", **demo) == 1.0
    assert value(gpu, "backfill_engine_results_total", outcome="completed", **demo) == 24
    assert value(gpu, "backfill_engine_output_tokens_total", **demo) == output_tokens == 24 * 24
    assert value(gpu, "backfill_engine_prompt_tokens_total", **demo) > 0
    assert value(gpu, "backfill_engine_busy_seconds_total", **demo) > 0
    assert value(gpu, "backfill_engine_max_num_seqs", **demo) == 8
    assert value(gpu, "backfill_result_latency_seconds_count", **demo) == 24
    assert value(io, "backfill_ingest_lines_total", outcome="enqueued") == 24
    assert value(io, "backfill_finalize_seconds_count", status="completed") == 1
    assert value(io, "backfill_batch_cost_usd_total", kind="billed", **demo) == pytest.approx(
        float(done.model_extra["cost"]["billed_usd"]), abs=1e-6
    )
    for role, samples in (("worker-gpu", gpu), ("worker-io", io), ("beat", beat)):
        assert value(samples, "backfill_process_info", role=role) == 1
        assert total(samples, "backfill_queue_requests") == 0  # queue state is the API's to report
    exposed = {name for samples, families in scrapes.values() for name, _ in samples} | {
        family for _, families in scrapes.values() for family in families
    }
    assert named_metrics() - {"up"} <= exposed, sorted(named_metrics() - {"up"} - exposed)
