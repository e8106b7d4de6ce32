"""A retry keeps what its origin was given (issue 36, items 2 and 3): what is left of its spend cap, and its priority
within the tenant's cap; the caller may set its own. Through the official openai SDK's generic `client.post`, the
in-process worker on the fake engine. Prices make one output token bill exactly $1 (as in finance/test_budgets.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import openai
import pytest

from tests.conftest import Backend, LiveServer, make_key, start_server
from tests.integration.api.finance.test_budgets import MODELS, PRICES
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for

QUOTAS = json.dumps({"low": {"max_priority": -10}, "high": {"max_priority": 50}})
pytestmark = pytest.mark.backfill_env(
    {"BACKFILL_MODELS": MODELS, "BACKFILL_PRICE_BOOK": PRICES, "BACKFILL_TENANT_QUOTAS": QUOTAS}
)


@pytest.fixture
def api(backend: Backend) -> Iterator[LiveServer]:
    server, stop = start_server(with_worker=True)
    yield server
    stop()


def create(client: openai.OpenAI, lines: list[dict[str, Any]], **extra: Any) -> Any:
    source = upload(client, to_jsonl(lines))
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", extra_body=extra or None
    )
    return wait_for(client, batch.id)


def retry(client: openai.OpenAI, batch_id: str, **body: Any) -> Any:
    return client.post(f"/batches/{batch_id}/retry", body=body, cast_to=openai.types.Batch)


def half_failed(client: openai.OpenAI, **extra: Any) -> tuple[Any, str]:
    """Two $100 successes and two lines refused by the engine (a client error, re-run when named)."""
    lines = [chat_line(i, max_tokens=100) for i in range(2)] + [
        chat_line(i, max_tokens=2, min_tokens=5) for i in range(2, 4)
    ]
    origin = create(client, lines, **extra)
    assert origin.status == "completed" and origin.request_counts.failed == 2
    return origin, "invalid_value"


def test_a_retry_inherits_what_is_left_of_its_origins_cap_and_says_so(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    origin, code = half_failed(client, max_cost_usd="1000")
    assert Decimal(origin.cost["billed_usd"]) == 200

    again = retry(client, origin.id, codes=[code])
    assert again.max_cost_usd == "800.000000"  # type: ignore[attr-defined]
    [note] = again.model_extra["warnings"]["data"]  # type: ignore[index]
    assert note["code"] == "max_cost_inherited" and origin.id in note["message"] and "$1000.000000" in note["message"]
    wait_for(client, again.id)

    own = retry(client, origin.id, codes=[code], max_cost_usd="50")  # its own cap, no inheritance
    assert own.max_cost_usd == "50.000000" and not own.model_extra.get("warnings")  # type: ignore[attr-defined,union-attr]
    wait_for(client, own.id)
    uncapped = retry(client, origin.id, codes=[code], max_cost_usd=None)  # explicitly none
    assert uncapped.max_cost_usd is None  # type: ignore[attr-defined]


def test_a_retry_of_a_batch_its_cap_stopped_is_refused_unless_it_sets_its_own_cap(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    stopped = create(client, [chat_line(i, max_tokens=100) for i in range(24)], max_cost_usd="150")
    billed = Decimal(stopped.cost["billed_usd"])
    assert billed >= 150 and stopped.request_counts.failed > 0  # stopped by its cap: budget_exceeded lines

    with pytest.raises(openai.BadRequestError, match=r"max_cost_usd of \$150\.000000 is spent") as refused:
        retry(client, stopped.id)  # it used to run every stopped line again, uncapped
    assert refused.value.code == "budget_exceeded"

    again = wait_for(client, retry(client, stopped.id, max_cost_usd="100").id)
    assert again.max_cost_usd == "100.000000"  # type: ignore[attr-defined]
    assert 100 <= Decimal(again.cost["billed_usd"]) < stopped.request_counts.failed * 100


def test_a_retry_keeps_its_origins_priority_within_the_tenants_cap(api: LiveServer) -> None:
    low = api.client(make_key("low"))  # may set priorities up to -10
    origin, code = half_failed(low, priority=-10)
    assert retry(low, origin.id, codes=[code]).priority == -10  # type: ignore[attr-defined]

    high = api.client(make_key("high"))  # up to 50
    origin, code = half_failed(high, priority=10)
    first = retry(high, origin.id, codes=[code])
    assert first.priority == 10  # type: ignore[attr-defined]
    wait_for(high, first.id)
    with pytest.raises(openai.BadRequestError, match="up to 50") as refused:
        retry(high, origin.id, codes=[code], priority=60)
    assert refused.value.code == "priority_not_allowed"
    assert retry(high, origin.id, codes=[code], priority=-5).priority == -5  # type: ignore[attr-defined]
