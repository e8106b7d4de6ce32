"""Event metrics: bounded labels only, every error series there before the first error, forked processes merged."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from storage.metrics import events

# `window`: a completion window, one the operator offers (a create on any other is refused).
ALLOWED_LABELS = {"model", "outcome", "code", "operation", "error", "kind", "status", "role", "window", "le"}


def test_no_event_metric_is_labelled_by_anything_unbounded() -> None:
    families = [family for family in REGISTRY.collect() if family.name.startswith("backfill_")]
    assert len(families) >= 25
    for family in families:
        for sample in family.samples:
            assert set(sample.labels) <= ALLOWED_LABELS, (family.name, sample.labels)


def test_error_and_webhook_series_exist_at_zero_before_anything_happens() -> None:
    for operation in events.S3_OPERATIONS:
        assert REGISTRY.get_sample_value("backfill_s3_errors_total", {"operation": operation}) is not None
    for outcome in events.WEBHOOK_OUTCOMES:
        assert REGISTRY.get_sample_value("backfill_webhook_deliveries_total", {"outcome": outcome}) is not None
    assert REGISTRY.get_sample_value("backfill_ingest_rejected_lines_total", {"code": "invalid_json"}) is not None


def test_the_webhook_sender_counts_deliveries_by_a_known_outcome_only() -> None:
    before = REGISTRY.get_sample_value("backfill_webhook_deliveries_total", {"outcome": "delivered"}) or 0
    events.count_webhook_delivery("delivered")
    assert REGISTRY.get_sample_value("backfill_webhook_deliveries_total", {"outcome": "delivered"}) == before + 1
    with pytest.raises(ValueError, match="unknown webhook outcome"):
        events.count_webhook_delivery("https://example.com/hook")  # type: ignore[arg-type]


def test_an_unknown_rejection_code_is_counted_as_other_not_as_a_new_series() -> None:
    before = REGISTRY.get_sample_value("backfill_ingest_rejected_lines_total", {"code": "other"}) or 0
    problems = [{"code": "made_up_code", "line": 3}, {"code": "token_limit_exceeded", "line": None}]
    events.observe_ingest(enqueued=0, problems=problems, status="failed", seconds=0.1)
    assert REGISTRY.get_sample_value("backfill_ingest_rejected_lines_total", {"code": "other"}) == before + 1
    assert REGISTRY.get_sample_value("backfill_ingest_rejected_lines_total", {"code": "made_up_code"}) is None
    assert REGISTRY.get_sample_value("backfill_ingest_seconds_count", {"outcome": "invalid"})


def test_forked_processes_are_merged_in_multiprocess_mode(tmp_path: Path) -> None:
    """With PROMETHEUS_MULTIPROC_DIR set, children forked after import count into one exposition."""
    code = textwrap.dedent(
        """
        import os
        from storage.metrics import exposition
        from storage.metrics.events import CLAIMED, ENGINE_RUNNING
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                CLAIMED.labels("m").inc(5)
                ENGINE_RUNNING.labels("m").set(2)
                os._exit(0)
            os.waitpid(pid, 0)
        print(exposition()[0].decode())
        """
    )
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "PYTHONPATH": str(Path(__file__).resolve().parents[4]),
    }
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert 'backfill_requests_claimed_total{model="m"} 15.0' in result.stdout
    assert "backfill_engine_running_sequences" in result.stdout
