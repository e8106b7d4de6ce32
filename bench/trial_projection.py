"""A trial's projected cost against what the whole batch then cost (issue 40 §1), on the fake engine.

A batch of `--lines` chat lines whose prompts and `max_tokens` vary (a seeded log-normal spread, as real files
do) is created with `trial: {"lines": --trial}`; a runner on the fake engine runs the trial, which reports and
pauses the batch; the batch is resumed and run to its end; its billed cost (storage/finance/budgets.py
`batch_spend`) is set against the trial's projection and interval. Prints one JSON object:

    .venv/bin/python bench/trial_projection.py [--lines 5000] [--trial 50] [--seed 7]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODEL = "backfill-demo"


def lines(count: int, seed: int) -> list[dict[str, Any]]:
    """Chat lines of varied prompt length and output budget: the spread a projection must cope with."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        words = max(1, int(rng.lognormvariate(3.0, 0.8)))
        budget = max(1, min(512, int(rng.lognormvariate(3.5, 0.9))))
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": " ".join(["word"] * words)}],
            "max_tokens": budget,
        }
        rows.append({"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=5000)
    parser.add_argument("--trial", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    os.environ.update(
        BACKFILL_DATA_DIR=tempfile.mkdtemp(prefix="bench-trial-"),
        BACKFILL_MODELS=json.dumps({MODEL: {"path": "fake:", "max_num_seqs": 64}}),
    )
    from worker.cli.migrate import migrate_database

    migrate_database()
    print(json.dumps(run(lines(args.lines, args.seed), trial=args.trial)))
    return 0


def run(rows: list[dict[str, Any]], *, trial: int) -> dict[str, Any]:
    from storage.batches.batches import create_batch, get_batch
    from storage.batches.checks import attach_workflow
    from storage.batches.control import resume_batch
    from storage.db import transaction
    from storage.files.blobs import get_blob_store
    from storage.files.files import create_file
    from storage.finance.budgets import batch_spend
    from storage.settings import get_settings
    from storage.tenants import get_or_create_tenant
    from worker.engine.fake import FakeEngine
    from worker.feed.runner import Runner
    from worker.jobs.ingest import ingest_batch

    settings = get_settings()
    with transaction() as session:
        tenant = get_or_create_tenant(session, name="bench").id
        chunks = (json.dumps(row).encode() + b"\n" for row in rows)
        source = create_file(
            session, get_blob_store(), tenant_id=tenant, filename="b.jsonl", purpose="batch", chunks=chunks
        )
        batch = create_batch(
            session, tenant_id=tenant, input_file_id=source.id, endpoint="/v1/chat/completions",
            completion_window="24h", model=MODEL, metadata=None,
        )  # fmt: skip
        attach_workflow(batch, trial={"lines": trial, "continue": "manual", "min_success_rate": 0.95}, checks=None)
        batch_id = batch.id
    with transaction() as session:
        ingest_batch(session, get_blob_store(), settings, batch_id=batch_id)
    runner = Runner(FakeEngine(MODEL, max_num_seqs=64, max_model_len=4096), model=MODEL, settings=settings)
    while runner.run_for(5.0):
        with transaction() as session:
            if get_batch(session, tenant_id=None, batch_id=batch_id).trial_status == "reported":
                break
    with transaction() as session:
        report = get_batch(session, tenant_id=None, batch_id=batch_id).trial["report"]  # type: ignore[index]
        trial_spend = batch_spend(session, settings, batch=get_batch(session, tenant_id=None, batch_id=batch_id))
        resume_batch(session, tenant_id=tenant, batch_id=batch_id)
    while runner.run_for(30.0):
        pass
    runner.close_io()
    with transaction() as session:
        actual = batch_spend(session, settings, batch=get_batch(session, tenant_id=None, batch_id=batch_id))
    projected = report["projected_cost"]
    estimate, low, high = (Decimal(projected[key]) for key in ("estimate_usd", "low_usd", "high_usd"))
    return {
        "lines": len(rows),
        "trial_lines": report["lines_run"],
        "trial_usd": projected["trial_usd"],
        "trial_spend_usd": str(trial_spend.quantize(Decimal("0.000001"))),
        "projected_usd": projected["estimate_usd"],
        "interval_usd": [projected["low_usd"], projected["high_usd"]],
        "actual_usd": str(actual.quantize(Decimal("0.000001"))),
        "error_pct": round(float((estimate - actual) / actual * 100), 2),
        "half_width_pct": round(float((high - low) / 2 / actual * 100), 2),
        "actual_within_interval": low <= actual <= high,
    }


if __name__ == "__main__":
    raise SystemExit(main())
