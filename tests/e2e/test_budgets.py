"""Spend caps (issue 20, section 5) on the real engine: the official SDK's `extra_body` and generic `post`,
and the operator's CLI, against the demo model. One output token bills $1 (list $2, 24h 50% off)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import LiveServer, configure, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.vllm
PRICES = {
    "prices": [
        {"model": "*", "effective_from": "2025-01-01", "input_usd_per_mtok": "0", "output_usd_per_mtok": "2000000"}
    ]
}


@pytest.fixture(scope="module")
def live(demo_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    from worker.cli.migrate import migrate_database
    from worker.process import service

    data = tmp_path_factory.mktemp("budgets")
    models = {"backfill-demo": {"path": str(demo_model_path), "max_num_seqs": 4, "max_model_len": 1024}}
    env = {
        "BACKFILL_DATA_DIR": str(data),
        "BACKFILL_MODELS": json.dumps(models),
        "BACKFILL_PRICE_BOOK": json.dumps(PRICES),
    }
    service.close_engines()
    with pytest.MonkeyPatch.context() as patch:
        configure(patch, env)
        migrate_database()
        server, stop = start_server(with_worker=True)
        try:
            yield server
        finally:
            stop()
            service.close_engines()


def _lines(count: int) -> list[dict[str, Any]]:
    body = {"model": "backfill-demo", "max_tokens": 24, "min_tokens": 24}
    return [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {**body, "messages": [{"role": "user", "content": f"count to {i}"}]},
        }
        for i in range(count)
    ]


def test_spend_caps_on_the_real_engine_through_the_sdk_and_the_cli(live: LiveServer) -> None:
    from worker.cli.main import main

    client = live.client(make_key("acme"))
    source = upload(client, to_jsonl(_lines(40)))
    batch = client.batches.create(
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"max_cost_usd": "100"},
    )
    done = wait_for(client, batch.id, timeout=600)
    assert done.status == "completed" and done.model_extra and done.model_extra["max_cost_usd"] == "100.000000"
    outputs, errors = read_lines(client, done.output_file_id), read_lines(client, done.error_file_id)
    assert sorted(line["custom_id"] for line in outputs + errors) == sorted(f"r{i}" for i in range(40))
    assert errors and {line["error"]["code"] for line in errors} == {"budget_exceeded"}
    billed = Decimal(done.model_extra["cost"]["billed_usd"])
    print(f"real engine: max_cost_usd=100 billed={billed} overrun={billed - 100} with {len(outputs)} of 40 run")
    # A claim reserves each request at its max_tokens ($24) while spend + reserved is under the cap: at most one
    # request crosses it (docs/decisions/0018), whatever the worker could hold (2 x 4 x 2 rows).
    assert Decimal(100) <= billed <= Decimal(100) + 24

    assert main(["tenants", "budget", "acme", "--usd", str(billed + 50)]) == 0  # $50 left this month
    with pytest.raises(openai.BadRequestError, match=r"\$72\.000000.*\$50\.000000 left") as refused:
        client.batches.create(
            input_file_id=upload(client, to_jsonl(_lines(3))).id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
    assert refused.value.code == "budget_exceeded"
    admin = live.client(make_key("ops", admin=True))  # an admin lifts it through the SDK's generic post
    budget = admin.post("/organization/budgets", body={"tenant": "acme", "monthly_budget_usd": None}, cast_to=object)
    assert budget["monthly_budget_usd"] is None  # type: ignore[index]
