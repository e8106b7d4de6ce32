"""Retrying a Message Batch (a Backfill extension) through the official anthropic SDK's generic `post`."""

from __future__ import annotations

import json
import time

import anthropic
import pytest
from anthropic.types.messages import MessageBatch

from tests.conftest import LiveServer, make_key
from tests.integration.api.anthropic.test_message_batches import ENV, client_for, counted, raw, req, results, wait_ended

pytestmark = pytest.mark.backfill_env(ENV)


def test_an_expired_message_batch_retried_runs_only_its_expired_requests(api: LiveServer) -> None:
    from sqlalchemy import update

    from storage.db import transaction
    from storage.models import Batch, BatchRequest

    client = client_for(api, make_key("acme"))
    batch = client.messages.batches.create(
        requests=[req("done", max_tokens=2)] + [req(f"late{i}", max_tokens=2000) for i in range(12)]
    )
    while client.messages.batches.retrieve(batch.id).request_counts.succeeded < 1:
        time.sleep(0.05)
    with pytest.raises(anthropic.BadRequestError, match="only an ended batch"):  # Anthropic says 400 for a 409
        client.post(f"/v1/messages/batches/{batch.id}/retry", body={}, cast_to=MessageBatch)
    past = int(time.time()) - 1  # the 24 hours are up
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch.id).values(expires_at=past))
        session.execute(update(BatchRequest).where(BatchRequest.batch_id == batch.id).values(deadline=past))
    ended = wait_ended(client, batch.id, timeout=30)  # those in flight end cut short, the others expired
    expired = {custom_id for custom_id, result in results(client, batch.id).items() if result.type == "expired"}
    assert len(expired) == ended.request_counts.expired >= 4 and ended.request_counts.succeeded == 13 - len(expired)

    again = client.post(f"/v1/messages/batches/{batch.id}/retry", body={}, cast_to=MessageBatch)
    assert again.id.startswith("msgbatch_") and again.model_extra and again.model_extra["retry_of"] == batch.id
    done = wait_ended(client, again.id)
    assert (done.request_counts.succeeded, counted(done)) == (len(expired), len(expired))  # no success ran again
    assert set(results(client, again.id)) == expired
    assert client.messages.batches.retrieve(batch.id).model_extra["retries"] == [again.id]  # type: ignore[index]
    listed = {item.id: item.model_extra for item in client.messages.batches.list()}  # the list carries them too
    assert listed[batch.id] and listed[batch.id]["retries"] == [again.id]
    assert listed[again.id] and (listed[again.id]["retries"], listed[again.id]["retry_of"]) == ([], batch.id)


def _too_long(custom_id: str) -> dict[str, object]:
    """A request other-model (2,048 tokens of context on the fake engine) refuses when it runs: a client error,
    `invalid_request_error` in the result an Anthropic user reads."""
    return req(custom_id, model="other-model", messages=[{"role": "user", "content": "word " * 2100}])


def test_an_anthropic_retry_names_client_errors_by_the_error_type_its_users_see(api: LiveServer) -> None:
    client = client_for(api, make_key("acme"))
    batch = wait_ended(client, client.messages.batches.create(requests=[req("fine"), _too_long("long")]).id)
    assert results(client, batch.id)["long"].error.error.type == "invalid_request_error"  # type: ignore[union-attr]
    with pytest.raises(anthropic.BadRequestError, match="No request"):
        client.post(f"/v1/messages/batches/{batch.id}/retry", body={}, cast_to=MessageBatch)  # not retried unnamed
    again = client.post(
        f"/v1/messages/batches/{batch.id}/retry", body={"codes": ["invalid_request_error"]}, cast_to=MessageBatch
    )
    assert counted(wait_ended(client, again.id)) == 1 and set(results(client, again.id)) == {"long"}


def test_deleting_an_anthropic_origin_leaves_its_retries_whole_and_retryable(api: LiveServer) -> None:
    client = client_for(api, make_key("acme"))
    origin = wait_ended(client, client.messages.batches.create(requests=[req("fine"), _too_long("long")]).id)
    codes = {"codes": ["invalid_request_error"]}
    first = client.post(f"/v1/messages/batches/{origin.id}/retry", body=codes, cast_to=MessageBatch)
    wait_ended(client, first.id)
    client.messages.batches.delete(origin.id)

    merged = raw(api, "GET", f"/v1/batches/{first.id}/results?merged=true", headers={"x-api-key": client.api_key})
    assert merged.status_code == 200, merged.text  # it answered 404 naming the deleted origin
    assert [json.loads(line)["custom_id"] for line in merged.text.splitlines()] == ["long"]
    second = client.post(f"/v1/messages/batches/{first.id}/retry", body=codes, cast_to=MessageBatch)
    assert second.model_extra and second.model_extra["retry_of"] == first.id
    assert set(results(client, wait_ended(client, second.id).id)) == {"long"}
