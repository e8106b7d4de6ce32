"""API edges of batch control, budgets and results (issue 36 §9), through the official openai and anthropic SDKs
on the fake engine: a resume of an ended batch is refused, an ending batch is no longer paused, an admin reads a
budget by tenant name or id, money, priorities and result cursors are parsed strictly (storage/strict.py: one rule
and one code, `invalid_value`, on both protocols), Anthropic's errors speak its status names, and a Message
Batch's results and spend cap are reachable the way an Anthropic client calls."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types.messages import MessageBatch

from tests.conftest import LiveServer, make_key
from tests.integration.api.anthropic.batches import ENV, client_for, req, wait_ended
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.backfill_env({**ENV, "BACKFILL_TENANT_MAX_PRIORITY": "20"})
EMBEDDED = pytest.mark.parametrize("backend", ["embedded"], indirect=True)  # parsing: the database plays no part
FOREVER = 10**8  # the fake engine runs such a request until it is aborted

# Each one was taken as money before (issue 36 §9); the last ones are JSON numbers, which money never is here.
BAD_MONEY: list[Any] = ["1_000", "+5", ".5", "5\n", "\u0665", "5.", "1e3", " 3", "-0", "0x10", "NaN", "12.1234567"]
BAD_MONEY += [5, 0.5, True]
BAD_PRIORITY: list[Any] = [True, "7", 7.0, 101, -101, None, "\u0667"]


def create(client: openai.OpenAI, lines: list[dict[str, Any]], **extra: Any) -> openai.types.Batch:
    source = upload(client, to_jsonl(lines))
    return client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", extra_body=extra or None
    )


def control(client: openai.OpenAI, batch_id: str, verb: str, **body: Any) -> openai.types.Batch:
    return client.post(f"/batches/{batch_id}/{verb}", body=body, cast_to=openai.types.Batch)


def message_control(client: anthropic.Anthropic, batch_id: str, verb: str, **body: Any) -> MessageBatch:
    return client.post(f"/v1/messages/batches/{batch_id}/{verb}", body=body, cast_to=MessageBatch)


def openai_refusal(call: Any, value: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as refused:
        call(value)
    assert isinstance(refused.value.body, dict)
    return refused.value.body


def test_an_ended_batch_cannot_be_resumed_and_an_ending_batch_is_no_longer_paused(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    done = wait_for(client, create(client, [chat_line(0)]).id)
    with pytest.raises(openai.ConflictError) as refused:  # it was never paused: the no-op answered 200
        control(client, done.id, "resume")
    assert refused.value.code == "batch_not_controllable" and "status is 'completed'" in refused.value.message

    hog = create(client, [chat_line(i, max_tokens=FOREVER) for i in range(2)])
    wait_for(client, hog.id, {"in_progress"})
    assert control(client, hog.id, "pause").model_extra["paused_at"] is not None  # type: ignore[index]
    cancelled = client.batches.cancel(hog.id)
    assert cancelled.model_extra and cancelled.model_extra["paused_at"] is None  # it was kept past the cancel
    ended = wait_for(client, hog.id)
    assert ended.status == "cancelled" and ended.model_extra and ended.model_extra["paused_at"] is None
    assert len(read_lines(client, ended.error_file_id)) == 2

    anthropic_client = client_for(api, client.api_key)
    message = anthropic_client.messages.batches.create(requests=[req("a", max_tokens=FOREVER)])  # type: ignore[list-item]
    message_control(anthropic_client, message.id, "pause")
    anthropic_client.messages.batches.cancel(message.id)
    ended_message = wait_ended(anthropic_client, message.id)
    assert ended_message.to_dict().get("paused_at") is None
    with pytest.raises(anthropic.BadRequestError) as caught:  # Anthropic's words, not the internal 'cancelled'
        message_control(anthropic_client, message.id, "resume")
    text = str(caught.value)
    assert "processing_status is 'ended'" in text and "'cancelled'" not in text


def test_an_admin_reads_a_budget_by_tenant_name_or_id_and_an_unknown_tenant_is_a_404(api: LiveServer) -> None:
    acme, admin = make_key("acme"), make_key("ops", admin=True)
    ops = api.client(admin)
    set_to = ops.post("/organization/budgets", body={"tenant": "acme", "monthly_budget_usd": "250.5"}, cast_to=object)
    acme_id = set_to["tenant_id"]  # type: ignore[index]

    def read(client: openai.OpenAI, tenant: str | None = None) -> dict[str, Any]:
        params = {} if tenant is None else {"tenant_id": tenant}
        return dict(client.get("/organization/budgets", options={"params": params}, cast_to=object))  # type: ignore[call-overload]

    by_name, by_id, own = read(ops, "acme"), read(ops, acme_id), read(api.client(acme))
    assert by_name == by_id == own and by_name["monthly_budget_usd"] == "250.500000" and by_name["tenant_id"] == acme_id
    assert read(api.client(acme), "acme") == own  # a tenant may name itself
    for unknown in ("nobody", "tenant_nope"):
        with pytest.raises(openai.NotFoundError) as missing:
            read(ops, unknown)
        assert missing.value.code == "tenant_not_found" and missing.value.param == "tenant_id"
    with pytest.raises(openai.NotFoundError):
        ops.post("/organization/budgets", body={"tenant": "nobody", "monthly_budget_usd": "1"}, cast_to=object)
    with pytest.raises(openai.PermissionDeniedError):  # another tenant's, named or not, stays an admin's
        read(api.client(acme), "ops")


@EMBEDDED
def test_money_is_ascii_digits_with_at_most_six_decimals_everywhere_with_one_code(api: LiveServer) -> None:
    key, admin = make_key("acme"), make_key("ops", admin=True)
    client, ops, messages = api.client(key), api.client(admin), client_for(api, key)
    source = upload(client, to_jsonl([chat_line(0)]))
    estimate = {"input_file_id": source.id, "endpoint": "/v1/chat/completions"}
    openai_calls = [
        lambda bad: create(client, [chat_line(0)], max_cost_usd=bad),
        lambda bad: client.post("/batches/estimate", body={**estimate, "max_cost_usd": bad}, cast_to=object),
        lambda bad: ops.post(
            "/organization/budgets", body={"tenant": "acme", "monthly_budget_usd": bad}, cast_to=object
        ),
    ]
    for bad in BAD_MONEY:
        refusals = [openai_refusal(call, bad) for call in openai_calls]
        for error in refusals:
            assert error["code"] == "invalid_value" and error["param"] in ("max_cost_usd", "monthly_budget_usd"), bad
        assert refusals[0]["message"] == refusals[1]["message"]  # one rule, one message
        with pytest.raises(anthropic.BadRequestError) as caught:
            messages.messages.batches.create(requests=[req("a")], extra_body={"max_cost_usd": bad})  # type: ignore[list-item]
        assert caught.value.body["error"]["message"] == refusals[0]["message"], bad  # type: ignore[index]
    for digits in ("\u00b2", "\u0663\u0666\u0660\u0660"):  # a superscript two was a 500, Arabic-Indic 3600 taken
        expiry = {"anchor": "created_at", "seconds": digits}
        with pytest.raises(openai.BadRequestError) as refused:
            client.files.create(file=("a.jsonl", to_jsonl([chat_line(0)])), purpose="batch", expires_after=expiry)  # type: ignore[arg-type]
        assert refused.value.param == "expires_after.seconds"
    good = create(client, [chat_line(0)], max_cost_usd="0.000001")
    assert good.model_extra and good.model_extra["max_cost_usd"] == "0.000001"
    capped = messages.messages.batches.create(requests=[req("a")], extra_body={"max_cost_usd": "12.5"})  # type: ignore[list-item]
    assert capped.to_dict()["max_cost_usd"] == "12.500000"  # the MessageBatch shows its cap
    assert messages.messages.batches.retrieve(capped.id).to_dict()["max_cost_usd"] == "12.500000"


@EMBEDDED
def test_a_priority_is_a_json_integer_on_every_route_of_both_protocols(api: LiveServer) -> None:
    key = make_key("acme")
    client, messages = api.client(key), client_for(api, key)
    running = create(client, [chat_line(0, max_tokens=FOREVER)])
    message = messages.messages.batches.create(requests=[req("a", max_tokens=FOREVER)])  # type: ignore[list-item]
    openai_calls = [
        lambda bad: control(client, running.id, "priority", priority=bad),
        lambda bad: create(client, [chat_line(0)], priority=bad),
    ]
    anthropic_calls = [
        lambda bad: message_control(messages, message.id, "priority", priority=bad),
        lambda bad: messages.messages.batches.create(requests=[req("b")], extra_body={"priority": bad}),  # type: ignore[list-item]
    ]
    for bad in BAD_PRIORITY:
        refusals = [openai_refusal(call, bad) for call in openai_calls]
        for error in refusals:
            assert (error["code"], error["param"]) == ("invalid_value", "priority"), bad
        for call in anthropic_calls:
            with pytest.raises(anthropic.BadRequestError) as caught:
                call(bad)
            assert caught.value.body["error"]["message"] == refusals[0]["message"], bad  # type: ignore[index]
    assert control(client, running.id, "priority", priority=7).model_extra["priority"] == 7  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as capped:
        control(client, running.id, "priority", priority=21)
    assert capped.value.code == "priority_not_allowed"  # within -100..100 but above this tenant's cap of 20
    client.batches.cancel(running.id)
    messages.messages.batches.cancel(message.id)


def test_a_results_cursor_is_ascii_digits_one_the_server_gave_and_a_message_batch_reads_with_x_api_key(
    api: LiveServer,
) -> None:
    key = make_key("acme")
    client = api.client(key)
    done = wait_for(client, create(client, [chat_line(i) for i in range(3)]).id)

    def results(after: str | None, **headers: str) -> httpx.Response:
        params = {} if after is None else {"after": after}
        auth = headers or {"Authorization": f"Bearer {key}"}
        return httpx.get(f"{api.base_url}/v1/batches/{done.id}/results", params=params, headers=auth, timeout=30)

    first = results(None)
    assert first.status_code == 200 and first.headers["X-Next-After"] == "rs_3"
    assert results("rs_3").text == "" and results("rs_0").text == first.text
    for bad in ("rs_\u0663", "rs_\uff13", "rs_3\n", "rs_+3", "rs_ 3", "rs_-1", "rs_999999", "rs_4"):
        refused = results(bad)
        assert refused.status_code == 400, bad  # a forged cursor past the last result was echoed back
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("invalid_value", "after") and "X-Next-After" not in refused.headers

    messages = client_for(api, key)
    message = wait_ended(messages, messages.messages.batches.create(requests=[req("a"), req("b")]).id)  # type: ignore[list-item]
    url = f"{api.base_url}/v1/batches/{message.id}/results"
    with_header = httpx.get(url, headers={"x-api-key": key}, timeout=30)  # how an Anthropic client authenticates
    assert with_header.status_code == 200, with_header.text
    assert sorted(json.loads(line)["custom_id"] for line in with_header.text.splitlines()) == ["a", "b"]
    assert httpx.get(url, headers={"x-api-key": "sk-nope"}, timeout=30).status_code == 401
