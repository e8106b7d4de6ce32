"""A finding of `make chaos` (seed 52): a Redis restart can take the io worker down for good.

When Redis goes away while the io worker (Celery's threads pool) acknowledges a task, kombu's Redis
transport fails in the ack (`AttributeError: 'NoneType' object has no attribute 'hostname'`), Celery logs
`Unrecoverable error` and the worker exits. Nothing is ingested, finalized or reaped until something
restarts it (infra/docker-compose.yml's `restart: unless-stopped` would; a bare process does not).

It takes a lucky moment, so this reproducer kills Redis right after the io worker reports a task done,
up to 40 times (a few minutes). It is opt-in: BACKFILL_CHAOS_SLOW=1.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import pytest

from tests.chaos.run import staged
from tests.chaos.services import Cluster

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(not os.environ.get("BACKFILL_CHAOS_SLOW"), reason="opt-in: BACKFILL_CHAOS_SLOW=1 (minutes)"),
]

RESTARTS = 40


def test_the_io_worker_keeps_consuming_after_every_redis_restart(chaos_cluster: Cluster, tmp_path: Path) -> None:
    rng = random.Random(52)
    with staged(chaos_cluster, run_dir=tmp_path, label="broker", tenants=["acme"]) as stage:
        io = stage.deployment.children["io"]
        for attempt in range(RESTARTS):
            seen = len(io.log.read_text())
            while "succeeded" not in io.log.read_text()[seen:]:  # beat's lease.reap lands every second
                time.sleep(0.005)
            chaos_cluster.redis.kill()
            time.sleep(rng.uniform(0.5, 3.0))
            chaos_cluster.redis.start()
            seen = len(io.log.read_text())
            deadline = time.monotonic() + 20
            while "received" not in io.log.read_text()[seen:] and time.monotonic() < deadline:
                time.sleep(0.2)
            assert io.alive() and "received" in io.log.read_text()[seen:], (
                f"after Redis restart {attempt + 1} the io worker "
                f"{'consumes nothing' if io.alive() else f'exited with {io.returncode()}'}:\n{io.tail(2500)}"
            )
