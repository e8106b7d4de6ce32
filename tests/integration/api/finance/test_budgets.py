"""Spend caps (issue 20, section 5): a batch's `max_cost_usd` and a tenant's monthly budget, on the fake
engine. Prices are set so one output token bills exactly $1 (list $2, the 24h window's 50% off), input is
free: a request with max_tokens=100 bills $100, and every figure below is exact."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import openai
import pytest

from tests.conftest import Backend, LiveServer, make_key, start_server
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for

MODELS = json.dumps(
    {"fake-model": {"path": "fake:", "max_num_seqs": 8, "max_model_len": 10**6, "extra": {"step_seconds": 0.002}}}
)
PRICES = json.dumps(
    {
        "prices": [
            {
                "model": "fake-model",
                "effective_from": "2025-01-01",
                "input_usd_per_mtok": "0",
                "output_usd_per_mtok": "2000000",
            }
        ]
    }
)
pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": MODELS, "BACKFILL_PRICE_BOOK": PRICES})
PER_REQUEST = Decimal(100)  # max_tokens=100 output tokens at $1 each
IN_FLIGHT = 8 * 2  # the runner leases max_num_seqs x inflight_per_seq (default 2) rows at a time


@pytest.fixture
def api(backend: Backend) -> Iterator[LiveServer]:
    server, stop = start_server(with_worker=True)
    yield server
    stop()


def _job(count: int) -> bytes:
    return to_jsonl([chat_line(i, max_tokens=100) for i in range(count)])


def _create(client: openai.OpenAI, data: bytes, **extra: Any) -> Any:
    source = upload(client, data)
    return client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", extra_body=extra or None
    )


def _billed(batch: Any) -> Decimal:
    return Decimal(batch.cost["billed_usd"]) if batch.cost else Decimal(0)


def _every_line_once(client: openai.OpenAI, batch: Any, total: int) -> tuple[list[Any], list[Any]]:
    outputs, errors = read_lines(client, batch.output_file_id), read_lines(client, batch.error_file_id)
    ids = [line["custom_id"] for line in outputs + errors]
    assert sorted(ids) == sorted(f"req-{i}" for i in range(total))  # exactly once: none lost, none twice
    return outputs, errors


def test_a_batch_stops_at_its_max_cost_and_its_unrun_requests_end_as_budget_exceeded(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    batch = _create(client, _job(64), max_cost_usd="1000")
    assert batch.max_cost_usd == "1000.000000"  # type: ignore[attr-defined]

    done = wait_for(client, batch.id)
    assert done.status == "completed"
    outputs, errors = _every_line_once(client, done, 64)
    assert errors and {line["error"]["code"] for line in errors} == {"budget_exceeded"}
    assert all("max_cost_usd of $1000.000000" in line["error"]["message"] for line in errors)
    billed = _billed(done)
    assert billed == PER_REQUEST * len(outputs)
    # A claim reserves each request's cost at its full max_tokens and leases a capped batch's rows only while
    # spend + reserved is under the cap (docs/decisions/0018): ten $100 requests reach $1000 exactly, and no
    # eleventh is ever leased, though the worker could hold 16.
    assert billed == Decimal(1000) and len(outputs) == 10
    assert done.request_counts.completed == len(outputs) and done.request_counts.failed == len(errors)
    assert any(w["code"] == "budget_exceeded" for w in done.warnings["data"])  # type: ignore[attr-defined]


def _varied_job(count: int) -> tuple[bytes, Decimal]:
    """Lines of 7 to 199 output tokens ($1 each), and what the dearest of them bills."""
    sizes = [7 + (i * 37) % 193 for i in range(count)]
    return to_jsonl([chat_line(i, max_tokens=size) for i, size in enumerate(sizes)]), Decimal(max(sizes))


def test_a_capped_batch_with_many_lines_in_flight_bills_at_most_one_request_past_its_cap(api: LiveServer) -> None:
    """Issue 36 item 4: a cap of $0.003138 billed $0.020115 with 128 lines in flight. A claim now reserves
    each leased request at its full max_tokens, so at most one request crosses the cap, whatever the lease."""
    client = api.client(make_key("acme"))
    data, dearest = _varied_job(80)
    batch = _create(client, data, max_cost_usd="777")
    done = wait_for(client, batch.id)
    assert done.status == "completed"
    _, errors = _every_line_once(client, done, 80)
    assert errors and {line["error"]["code"] for line in errors} == {"budget_exceeded"}
    billed = _billed(done)
    print(f"max_cost_usd=777 billed={billed} overrun={billed - 777} (bound: the dearest request, ${dearest})")
    assert Decimal(777) <= billed <= Decimal(777) + dearest
    assert any(w["code"] == "budget_exceeded" for w in done.warnings["data"])  # type: ignore[attr-defined]


def test_a_max_cost_of_zero_is_refused_on_both_protocols(api: LiveServer) -> None:
    """A cap of 0 used to run every line with no warning: it is refused at create, as OpenAI and as Anthropic."""
    import anthropic

    key = make_key("acme")
    client = api.client(key)
    for zero in ("0", "0.000000", "0.0"):
        with pytest.raises(openai.BadRequestError, match=r"max_cost_usd must be more than \$0") as refused:
            _create(client, _job(1), max_cost_usd=zero)
        assert refused.value.body["param"] == "max_cost_usd"  # type: ignore[index]
    assert list(client.batches.list()) == []
    messages = anthropic.Anthropic(api_key=key, base_url=api.base_url, max_retries=0)
    params = {"model": "fake-model", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(anthropic.BadRequestError, match=r"max_cost_usd must be more than \$0") as denied:
        messages.messages.batches.create(
            requests=[{"custom_id": "r0", "params": params}],  # type: ignore[list-item]
            extra_body={"max_cost_usd": "0"},
        )
    assert denied.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert list(messages.messages.batches.list()) == []


def test_a_max_cost_that_is_not_a_decimal_amount_is_refused(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    for bad in ("ten dollars", "-1", "0.0000001", "NaN"):
        with pytest.raises(openai.BadRequestError) as refused:
            _create(client, _job(1), max_cost_usd=bad)
        assert refused.value.body["param"] == "max_cost_usd"  # type: ignore[index]


def _set_budget(api: LiveServer, key: str, tenant: str, usd: str | None) -> dict[str, Any]:
    """Through the official SDK's generic post: the route is a Backfill extension."""
    body = {"tenant": tenant, "monthly_budget_usd": usd}
    return dict(api.client(key).post("/organization/budgets", body=body, cast_to=object))  # type: ignore[call-overload]


def test_a_tenant_past_its_monthly_budget_is_refused_at_create_and_its_running_batches_stop(api: LiveServer) -> None:
    key, admin = make_key("acme"), make_key("ops", admin=True)
    client = api.client(key)
    with pytest.raises(openai.PermissionDeniedError):  # a tenant cannot raise its own budget
        _set_budget(api, key, "acme", "1000000")
    assert _set_budget(api, admin, "acme", "1500")["remaining_usd"] == "1500.000000"

    with pytest.raises(openai.BadRequestError) as refused:  # estimate: 16 x $100 = $1600 > $1500 left
        _create(client, _job(16))
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "budget_exceeded"
    assert "$1600.000000" in error["message"] and "$1500.000000 left" in error["message"]

    batch = _create(client, _job(15))  # $1500 fits; its spend is what stops it, a little past the budget
    wait_for(client, batch.id)
    first = client.batches.retrieve(batch.id)
    assert first.status == "completed" and _billed(first) == 15 * PER_REQUEST

    _set_budget(api, admin, "acme", "2000")  # $500 left: a 40-request batch (estimate $4000) would be refused
    with pytest.raises(openai.BadRequestError, match=r"monthly budget"):
        _create(client, _job(40))
    small = _create(client, _job(5))  # $500 fits exactly
    done = wait_for(client, small.id)
    assert done.status == "completed" and _billed(done) == 5 * PER_REQUEST

    costs = client.get(
        "/organization/costs", cast_to=object, options={"params": {"start_time": int(time.time()) - 86400}}
    )
    budget = costs["budget"]  # type: ignore[index]
    assert budget["monthly_budget_usd"] == "2000.000000" and budget["spent_usd"] == "2000.000000"
    assert budget["remaining_usd"] == "0.000000"
    with pytest.raises(openai.BadRequestError, match=r"\$0\.000000 left"):
        _create(client, _job(1))


def test_a_running_batch_stops_when_its_tenant_spends_the_month(api: LiveServer) -> None:
    key, admin = make_key("acme"), make_key("ops", admin=True)
    client = api.client(key)
    batch = _create(client, _job(64))  # no budget yet: accepted
    _set_budget(api, admin, "acme", "1000")
    done = wait_for(client, batch.id)
    _, errors = _every_line_once(client, done, 64)
    assert errors and {line["error"]["code"] for line in errors} == {"budget_exceeded"}
    assert "monthly budget of $1000.000000" in errors[0]["error"]["message"]
    assert Decimal(1000) <= _billed(done) <= Decimal(1000) + 2 * IN_FLIGHT * PER_REQUEST
    other = make_key("other")  # another tenant is not stopped by acme's budget
    spared = wait_for(api.client(other), _create(api.client(other), _job(3)).id)
    assert spared.request_counts.completed == 3


def test_a_retry_is_refused_once_the_month_is_spent_and_accepted_when_the_budget_grows(api: LiveServer) -> None:
    """Without this check every retry of a stopped batch ran one more in-flight window past the budget."""
    key, admin = make_key("acme"), make_key("ops", admin=True)
    client = api.client(key)
    batch = _create(client, _job(64))
    _set_budget(api, admin, "acme", "1000")
    done = wait_for(client, batch.id)
    with pytest.raises(openai.BadRequestError) as refused:
        client.post(f"/batches/{done.id}/retry", body={}, cast_to=openai.types.Batch)
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "budget_exceeded"
    assert "monthly budget of $1000.000000" in error["message"]
    assert client.batches.retrieve(done.id).retries == []  # type: ignore[attr-defined]

    _set_budget(api, admin, "acme", "100000")  # room again: the retry runs only the budget_exceeded lines
    retry = client.post(f"/batches/{done.id}/retry", body={}, cast_to=openai.types.Batch)
    assert retry.request_counts is not None and retry.request_counts.total == done.request_counts.failed
    assert wait_for(client, retry.id).request_counts.completed == done.request_counts.failed


def test_an_operator_sets_and_reads_a_monthly_budget_with_the_cli(
    api: LiveServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from worker.cli.main import main

    client = api.client(make_key("acme"))
    assert main(["tenants", "budget", "acme", "--usd", "250.5"]) == 0
    assert "budget $250.500000 per month, $0.000000 spent this month, $250.500000 left" in capsys.readouterr().out
    with pytest.raises(openai.BadRequestError, match=r"\$300\.000000.*\$250\.500000 left"):
        _create(client, _job(3))
    assert main(["tenants", "budget", "acme", "--remove"]) == 0
    assert main(["tenants", "budget", "acme"]) == 0
    assert "budget none per month" in capsys.readouterr().out
    _create(client, _job(3))  # no budget: accepted
    assert main(["tenants", "budget", "nobody", "--usd", "5"]) == 1
    assert main(["tenants", "budget", "acme", "--usd", "five"]) == 1


def test_a_message_batch_past_the_monthly_budget_is_refused_in_anthropics_envelope(api: LiveServer) -> None:
    import anthropic

    key, admin = make_key("acme"), make_key("ops", admin=True)
    _set_budget(api, admin, "acme", "250")
    messages = anthropic.Anthropic(api_key=key, base_url=api.base_url, max_retries=0)
    params = {"model": "fake-model", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    requests = [{"custom_id": f"r{i}", "params": params} for i in range(3)]
    with pytest.raises(anthropic.BadRequestError, match=r"\$300\.000000.*\$250\.000000 left") as refused:
        messages.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert list(messages.messages.batches.list()) == []
    assert messages.messages.batches.create(requests=requests[:2]).request_counts.processing == 2  # type: ignore[arg-type]


def test_submit_with_max_cost_usd_from_the_cli_stops_the_batch_at_its_cap(
    api: LiveServer, tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from worker.cli.main import main

    key = make_key("acme")
    monkeypatch.setenv("BACKFILL_BASE_URL", api.base_url)
    monkeypatch.setenv("BACKFILL_API_KEY", key)
    source = tmp_path / "jobs.jsonl"
    source.write_bytes(_job(40))
    capsys.readouterr()
    assert main(["submit", str(source), "--max-cost-usd", "300", "--json"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert created["max_cost_usd"] == "300.000000"
    client = api.client(key)
    done = wait_for(client, created["id"])
    _, errors = _every_line_once(client, done, 40)
    assert errors and {line["error"]["code"] for line in errors} == {"budget_exceeded"}
