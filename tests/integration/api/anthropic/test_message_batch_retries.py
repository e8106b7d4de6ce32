"""Retrying a Message Batch (a Backfill extension) through the official anthropic SDK's generic `post`."""

from __future__ import annotations

import time

import anthropic
import pytest
from anthropic.types.messages import MessageBatch

from tests.conftest import LiveServer, make_key
from tests.integration.api.anthropic.test_message_batches import ENV, client_for, counted, req, results, wait_ended

pytestmark = pytest.mark.backfill_env(ENV)


def test_an_expired_message_batch_retried_runs_only_its_expired_requests(api: LiveServer) -> None:
    from sqlalchemy import update

    from storage.db import transaction
    from storage.models import Batch, BatchRequest

    client = client_for(api, make_key("acme"))
    batch = client.messages.batches.create(
        requests=[req("done", max_tokens=2)] + [req(f"late{i}", max_tokens=2000) for i in range(3)]
    )
    while client.messages.batches.retrieve(batch.id).request_counts.succeeded < 1:
        time.sleep(0.05)
    with pytest.raises(anthropic.BadRequestError, match="only an ended batch"):  # Anthropic says 400 for a 409
        client.post(f"/v1/messages/batches/{batch.id}/retry", body={}, cast_to=MessageBatch)
    past = int(time.time()) - 1  # the 24 hours are up
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch.id).values(expires_at=past))
        session.execute(update(BatchRequest).where(BatchRequest.batch_id == batch.id).values(deadline=past))
    assert wait_ended(client, batch.id, timeout=30).request_counts.expired == 3

    again = client.post(f"/v1/messages/batches/{batch.id}/retry", body={}, cast_to=MessageBatch)
    assert again.id.startswith("msgbatch_") and again.model_extra and again.model_extra["retry_of"] == batch.id
    done = wait_ended(client, again.id)
    assert (done.request_counts.succeeded, counted(done)) == (3, 3)  # "done" did not run again
    assert set(results(client, again.id)) == {f"late{i}" for i in range(3)}
    assert client.messages.batches.retrieve(batch.id).model_extra["retries"] == [again.id]  # type: ignore[index]
    listed = {item.id: item.model_extra for item in client.messages.batches.list()}  # the list carries them too
    assert listed[batch.id] and listed[batch.id]["retries"] == [again.id]
    assert listed[again.id] and (listed[again.id]["retries"], listed[again.id]["retry_of"]) == ([], batch.id)
