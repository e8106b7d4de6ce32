"""Cancelling an Anthropic message batch at every moment of its ingest: before it is queued, while ingest
queues it, just as ingest starts, and right after create. Each request ends once, and the counts match the
results (issue 19, bug 2)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import LiveServer, make_key
from tests.integration.api.anthropic.batches import ENV, client_for, counted, req, wait_ended

pytestmark = pytest.mark.backfill_env(ENV)


def test_a_batch_cancelled_before_it_was_queued_reports_every_request_canceled(backend: Any) -> None:
    from tests.conftest import start_server
    from worker.process import service

    server, stop = start_server(with_worker=False)  # nothing ingests: the batch stays validating
    try:
        client = client_for(server, make_key("acme"))
        batch = client.messages.batches.create(requests=[req("a"), req("b"), req("c")])
        assert batch.request_counts.processing == 3
        canceling = client.messages.batches.cancel(batch.id)
        assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at is not None
        assert service.ingest(batch.id) == "cancelling"  # a late ingest leaves it alone
        assert service.finalize(batch.id) == "cancelled"
        done = client.messages.batches.retrieve(batch.id)
        assert done.processing_status == "ended" and (done.request_counts.canceled, counted(done)) == (3, 3)
        assert {line.custom_id: line.result.type for line in client.messages.batches.results(batch.id)} == {
            "a": "canceled",
            "b": "canceled",
            "c": "canceled",
        }
    finally:
        stop()


def test_a_batch_cancelled_while_its_ingest_is_queueing_ends_every_request_once(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19 bug 2: cancel read the batch as `validating` while ingest held it, then cancelled it once
    ingest had queued every row; each request must end once, canceled, and the counts match the results."""
    import threading

    import api.anthropic.message_batches as message_batches
    import worker.jobs.ingest as ingest_module
    from tests.conftest import start_server
    from worker.process import service

    queued, cancel_read = threading.Event(), threading.Event()
    admit, cancel_batch = ingest_module.admit, message_batches.cancel_batch

    def admit_then_wait(*args: Any, **kwargs: Any) -> Any:
        queued.set()  # ingest holds the batch's lock with every row written, not yet committed
        assert cancel_read.wait(30)
        return admit(*args, **kwargs)

    def cancel_after_reading(*args: Any, **kwargs: Any) -> Any:
        cancel_read.set()  # cancel has read the batch (still `validating`) and now asks for its lock
        return cancel_batch(*args, **kwargs)

    monkeypatch.setattr(ingest_module, "admit", admit_then_wait)
    monkeypatch.setattr(message_batches, "cancel_batch", cancel_after_reading)
    server, stop = start_server(with_worker=False)
    try:
        client = client_for(server, make_key("acme"))
        batch = client.messages.batches.create(requests=[req(f"r{i}") for i in range(5)])
        ingesting = threading.Thread(target=service.ingest, args=(batch.id,))
        ingesting.start()
        assert queued.wait(30)
        canceling = client.messages.batches.cancel(batch.id)
        ingesting.join(30)
        assert canceling.processing_status == "canceling"
        assert service.finalize(batch.id) == "cancelled"
        done = client.messages.batches.retrieve(batch.id)
        assert done.processing_status == "ended"
        counts = done.request_counts
        assert (counts.canceled, counts.succeeded, counted(done)) == (5, 0, 5)
        lines = [line.result.type for line in client.messages.batches.results(batch.id)]
        assert sorted(lines) == ["canceled"] * 5
    finally:
        stop()


def test_a_batch_cancelled_just_as_its_ingest_starts_is_not_queued_afterwards(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19 bug 2: on SQLite the locked read locked nothing, so a cancel could commit between ingest's
    read and its write, and ingest then queued the batch as if nobody had cancelled it: every request ran.
    Cancel now waits for ingest (or ingest for cancel): each request ends once and the counts match."""
    import threading

    import worker.jobs.ingest as ingest_module
    from tests.conftest import start_server
    from worker.process import service

    server, stop = start_server(with_worker=False)
    client = client_for(server, make_key("acme"))
    get_file = ingest_module.get_file
    cancelled: list[Any] = []

    def cancel_then_read(*args: Any, **kwargs: Any) -> Any:
        # Ingest holds the batch (its locked read is done): cancel now. A cancel that can finish while
        # ingest holds the batch is the bug; a correct one waits for ingest's commit, so stop waiting.
        cancelling = threading.Thread(target=lambda: cancelled.append(client.messages.batches.cancel(batch.id)))
        cancelling.start()
        cancelling.join(3)
        threads.append(cancelling)
        return get_file(*args, **kwargs)

    threads: list[threading.Thread] = []
    monkeypatch.setattr(ingest_module, "get_file", cancel_then_read)
    try:
        batch = client.messages.batches.create(requests=[req(f"r{i}") for i in range(5)])
        service.ingest(batch.id)
        for thread in threads:
            thread.join(30)
        assert [c.processing_status for c in cancelled] == ["canceling"]
        assert service.finalize(batch.id) == "cancelled"
        done = client.messages.batches.retrieve(batch.id)
        counts = done.request_counts
        assert (done.processing_status, counts.canceled, counts.succeeded, counted(done)) == ("ended", 5, 0, 5)
        assert sorted(line.result.type for line in client.messages.batches.results(batch.id)) == ["canceled"] * 5
    finally:
        stop()


def test_a_batch_cancelled_right_after_create_counts_each_request_once(api: LiveServer) -> None:
    """Issue 19 bug 2, as a client met it: create 60 requests, cancel at once, poll to the end. Whichever
    requests ran first, the counts add up to 60 and say what `results()` says."""
    client = client_for(api, make_key("acme"))
    batch = client.messages.batches.create(requests=[req(f"r{i}", max_tokens=512) for i in range(60)])
    client.messages.batches.cancel(batch.id)
    done = wait_ended(client, batch.id)
    types = [line.result.type for line in client.messages.batches.results(batch.id)]
    counts = done.request_counts
    assert counted(done) == len(types) == 60
    assert (counts.canceled, counts.succeeded) == (types.count("canceled"), types.count("succeeded"))
