"""Focused reproducers for issue 14's fault items, on the real processes of the chaos harness.

Item 10 (paused work re-claimed as duplicate_request) has its deterministic reproducer beside the runner's
tests: tests/integration/worker/feed/test_lease_handover.py. The two here need whole processes: a GPU worker
killed and restarted (item 11) and Redis gone while a batch finishes (item 12).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.chaos.deployment import MODEL, Timing
from tests.chaos.run import Stage, staged
from tests.chaos.services import Cluster

pytestmark = pytest.mark.chaos

TERMINAL = {"completed", "failed", "expired", "cancelled"}


def submit(client: openai.OpenAI, *, requests: int, max_tokens: int) -> str:
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": max_tokens},
        }
        for i in range(requests)
    ]
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    source = client.files.create(file=("job.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    return batch.id


def wait_until(predicate: Any, *, timeout: float, every: float = 0.2) -> float | None:
    """Seconds until `predicate()` held, or None if it did not within `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if predicate():
            return time.monotonic() - started
        time.sleep(every)
    return None


def counts(client: openai.OpenAI, batch_id: str) -> tuple[str, int]:
    batch = client.batches.retrieve(batch_id)
    done = batch.request_counts.completed + batch.request_counts.failed if batch.request_counts else 0
    return batch.status, done


# Leases and the stale-worker bound far longer than the test waits: the only way the killed worker's requests
# come back within RESTART_BOUND is the restarted worker taking its predecessor's leases at start. The test
# asserts that mechanism, not how fast a loaded machine restarts a process.
ITEM_11 = Timing(lease_seconds=600, reap_interval_seconds=1, run_task_seconds=5, worker_stale_seconds=600)
RESTART_BOUND = 180.0


def test_a_gpu_worker_restarted_after_kill_9_takes_its_predecessors_leases_and_finishes_the_batch(
    chaos_cluster: Cluster, tmp_path: Path
) -> None:
    with staged(chaos_cluster, run_dir=tmp_path, label="item11", tenants=["acme"], timing=ITEM_11) as stage:
        client = stage.client("acme")
        batch_id = submit(client, requests=48, max_tokens=12)  # ~3 s of engine work
        if wait_until(lambda: counts(client, batch_id)[1] >= 8, timeout=60) is None:
            pytest.fail(f"no progress before the kill: {stage.deployment.children['gpu1'].tail()}")
        stage.deployment.kill("gpu1")
        status, done = counts(client, batch_id)
        assert status not in TERMINAL and done < 48, "the batch ended before the kill: nothing was held to take over"
        stage.deployment.restart("gpu1")
        took = wait_until(lambda: counts(client, batch_id)[0] in TERMINAL, timeout=RESTART_BOUND)
        status, done = counts(client, batch_id)
        assert took is not None, (
            f"{RESTART_BOUND:.0f} s after the restart the batch is still {status} with {done}/48 done: the "
            f"requests the killed worker held wait for their {ITEM_11.lease_seconds} s lease to expire\n"
            f"{_logs(stage)}"
        )
        assert (status, done) == ("completed", 48)
        assert "took over from 1 previous worker(s)" in stage.deployment.children["gpu1"].tail(20_000)


ITEM_12 = Timing(lease_seconds=30, reap_interval_seconds=1, run_task_seconds=60)  # one task runs the whole batch


def test_a_batch_whose_last_requests_finish_while_redis_is_down_is_finalized_without_it(
    chaos_cluster: Cluster, tmp_path: Path
) -> None:
    with staged(chaos_cluster, run_dir=tmp_path, label="item12", tenants=["acme"], timing=ITEM_12) as stage:
        client = stage.client("acme")
        batch_id = submit(client, requests=48, max_tokens=12)
        if wait_until(lambda: counts(client, batch_id)[1] >= 1, timeout=60) is None:
            pytest.fail(f"no progress before Redis went down: {stage.deployment.children['gpu1'].tail()}")
        chaos_cluster.redis.kill()
        finished = wait_until(lambda: counts(client, batch_id)[1] == 48, timeout=30)
        if finished is None:
            pytest.fail(f"the requests themselves did not finish with Redis down: {counts(client, batch_id)}")
        finalized = wait_until(lambda: counts(client, batch_id)[0] in TERMINAL, timeout=10)
        status_without_redis = counts(client, batch_id)[0]
        chaos_cluster.redis.start()
        recovered = wait_until(lambda: counts(client, batch_id)[0] == "completed", timeout=30)
        if recovered is None:
            pytest.fail(f"the batch did not complete even after Redis returned: {_logs(stage)}")
        assert finalized is not None, (
            f"all 48 requests finished {finished:.1f} s after Redis went down, but the batch stayed "
            f"{status_without_redis} for 10 s more; it completed {recovered:.1f} s after Redis returned"
        )


def _logs(stage: Stage) -> str:
    return "\n".join(f"--- {name}\n{child.tail(1500)}" for name, child in stage.deployment.children.items())
