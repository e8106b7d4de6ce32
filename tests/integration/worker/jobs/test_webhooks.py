"""Webhook delivery to a real HTTP receiver: signed, retried with one id, durable across crashes, never private.

The first tests drive the outbox and the deliverer directly (as a restarted process would); the last ones
run real batches through the API and the embedded worker on the fake engine.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator

import openai
import pytest
from openai.types.webhooks import BatchCompletedWebhookEvent
from sqlalchemy import func, select

from storage import lifecycle
from storage.db import transaction
from storage.models import WebhookDelivery, WebhookEvent
from storage.settings import get_settings
from storage.webhooks.deliveries import claim_due
from storage.webhooks.endpoints import create_endpoint, delete_endpoint, rotate_secret
from storage.webhooks.targets import TargetPolicy
from tests.conftest import Backend, LiveServer, make_key, start_server
from tests.factories import make_batch, make_tenant
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for
from tests.integration.jobs import create_job
from tests.integration.receiver import WEBHOOK_TEST_ENV, Receiver, Reply, running_receiver
from worker.jobs.webhooks import deliver_due

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, **WEBHOOK_TEST_ENV})
SDK = openai.OpenAI(api_key="unused")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


def register(url: str, *, tenant: str = "acme", events: list[str] | None = None) -> tuple[str, str]:
    """An endpoint for the tenant, registered as the API does; returns (endpoint id, secret)."""
    with transaction() as session:
        owner = make_tenant(session, tenant)
        endpoint = create_endpoint(
            session,
            tenant_id=owner.id,
            url=url,
            name="test",
            event_types=events,
            policy=TargetPolicy.from_settings(get_settings()),
            max_per_tenant=20,
        )
        return endpoint.id, endpoint.secret


def end_batch(*, tenant: str = "acme", status: str = lifecycle.COMPLETED) -> str:
    """A batch moved to an end state through lifecycle, committed (the outbox row commits with it)."""
    start = lifecycle.FINALIZING if status == lifecycle.COMPLETED else lifecycle.CANCELLING
    with transaction() as session:
        batch = make_batch(session, tenant=make_tenant(session, tenant), status=start)
        lifecycle.transition(batch, status)
        return batch.id


def delivery_rows() -> list[WebhookDelivery]:
    with transaction() as session:
        return list(session.scalars(select(WebhookDelivery)))


def deliver_until(predicate, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    """Run the deliverer, as beat would, until `predicate()` holds."""
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "deliveries did not settle"
        deliver_due(budget_seconds=5)
        time.sleep(0.05)


def test_an_event_committed_before_a_crash_is_sent_by_the_next_deliverer(backend: Backend, receiver: Receiver) -> None:
    endpoint_id, secret = register(f"{receiver.url}/hooks/backfill")
    batch_id = end_batch()  # committed; no deliverer ran: as if the process died right after the commit
    assert receiver.received == [] and [d.status for d in delivery_rows()] == ["pending"]
    assert deliver_due() == 1  # a fresh deliverer (a restarted worker, or beat) reads the outbox
    [post] = receiver.wait_for(1)
    assert post.method == "POST" and post.path == "/hooks/backfill"
    event = SDK.webhooks.unwrap(post.body, post.headers, secret=secret)
    assert isinstance(event, BatchCompletedWebhookEvent) and event.data.id == batch_id
    assert post.headers["webhook-id"] == delivery_rows()[0].id and post.headers["content-type"] == "application/json"
    [row] = delivery_rows()
    assert row.status == "delivered" and row.attempts == 1 and row.endpoint_id == endpoint_id
    assert deliver_due() == 0 and len(receiver.received) == 1  # a 2xx ends it


def test_a_status_change_that_rolls_back_leaves_no_event(backend: Backend, receiver: Receiver) -> None:
    register(f"{receiver.url}/hook")
    with pytest.raises(RuntimeError), transaction() as session:
        batch = make_batch(session, tenant=make_tenant(session), status=lifecycle.FINALIZING)
        lifecycle.transition(batch, lifecycle.COMPLETED)
        raise RuntimeError("the finalize step failed after the transition")
    with transaction() as session:
        assert session.scalar(select(func.count()).select_from(WebhookEvent)) == 0
    assert delivery_rows() == [] and deliver_due() == 0


def test_a_sender_that_dies_mid_attempt_is_retried_with_the_same_id(backend: Backend, receiver: Receiver) -> None:
    _, secret = register(f"{receiver.url}/hook")
    end_batch(status=lifecycle.CANCELLED)
    with transaction() as session:  # a deliverer claims the row, then dies before it sends or records anything
        [claimed] = claim_due(session, at=time.time(), limit=10, claim_seconds=3)
    assert deliver_due() == 0  # still claimed: no second sender while the first might be sending
    time.sleep(3.1)
    assert deliver_due() == 1
    [post] = receiver.wait_for(1)
    assert post.headers["webhook-id"] == claimed.id
    assert SDK.webhooks.unwrap(post.body, post.headers, secret=secret).type == "batch.cancelled"


def delivered_metric(outcome: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value("backfill_webhook_deliveries_total", {"outcome": outcome}) or 0.0


def test_a_failing_receiver_gets_retries_with_one_id_and_fresh_signatures(backend: Backend, receiver: Receiver) -> None:
    receiver.script = [Reply(500, b"boom"), Reply(503, b"later"), Reply(204, b"")]
    before = {outcome: delivered_metric(outcome) for outcome in ("delivered", "http_error")}
    _, secret = register(f"{receiver.url}/hook")
    end_batch()
    deliver_until(lambda: delivery_rows()[0].status == "delivered")
    assert delivered_metric("http_error") - before["http_error"] == 2  # what an operator's dashboard counts
    assert delivered_metric("delivered") - before["delivered"] == 1
    posts = receiver.wait_for(3)
    assert len(posts) == 3 and len({post.headers["webhook-id"] for post in posts}) == 1
    for post in posts:
        SDK.webhooks.verify_signature(post.body, post.headers, secret=secret)
    assert posts[0].body == posts[2].body
    gaps = [later.at - earlier.at for earlier, later in itertools.pairwise(posts)]
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2, gaps  # 0.2 s then 0.4 s nominal, jittered down to half at most
    [row] = delivery_rows()
    assert row.attempts == 3 and row.last_status_code == 204 and row.delivered_at is not None


@pytest.mark.backfill_env(
    {"BACKFILL_MODELS": FAKE_MODELS, **WEBHOOK_TEST_ENV, "BACKFILL_WEBHOOK_RETRY_WINDOW_SECONDS": "2"}
)
def test_retries_stop_when_the_window_ends(backend: Backend, receiver: Receiver) -> None:
    receiver.default = Reply(500, b"down")
    register(f"{receiver.url}/hook")
    end_batch()
    deliver_until(lambda: delivery_rows()[0].status == "failed", timeout=30)
    [row] = delivery_rows()
    assert row.next_attempt_at is None and row.attempts == len(receiver.received) >= 2


def test_redirects_are_not_followed_and_only_a_prefix_of_the_answer_is_kept(
    backend: Backend, receiver: Receiver
) -> None:
    receiver.script = [Reply(302, b"", {"location": f"{receiver.url}/elsewhere"}), Reply(200, b"x" * 100_000)]
    register(f"{receiver.url}/hook")
    end_batch()
    deliver_until(lambda: delivery_rows()[0].status == "delivered")
    assert [(post.method, post.path) for post in receiver.received] == [("POST", "/hook"), ("POST", "/hook")]
    with transaction() as session:
        from storage.models import WebhookAttempt

        attempts = list(session.scalars(select(WebhookAttempt).order_by(WebhookAttempt.number)))
    assert attempts[0].status_code == 302 and "redirects are not followed" in (attempts[0].error or "")
    assert attempts[1].status_code == 200 and attempts[1].response_body == "x" * 1024


@pytest.mark.backfill_env(
    {"BACKFILL_MODELS": FAKE_MODELS, **WEBHOOK_TEST_ENV, "BACKFILL_WEBHOOK_TIMEOUT_SECONDS": "0.5"}
)
def test_a_receiver_that_hangs_times_out_and_is_retried(backend: Backend, receiver: Receiver) -> None:
    receiver.script = [Reply(200, b"too late", delay_seconds=3)]
    register(f"{receiver.url}/hook")
    end_batch()
    started = time.monotonic()
    assert deliver_due(budget_seconds=0.3) == 1  # the pass claims no more after 0.3 s: not the retry 0.2 s later
    assert time.monotonic() - started < 2.5
    [row] = delivery_rows()
    assert row.status == "pending" and row.attempts == 1 and row.last_status_code is None
    deliver_until(lambda: delivery_rows()[0].status == "delivered")


def test_deleting_an_endpoint_drops_its_pending_deliveries(backend: Backend, receiver: Receiver) -> None:
    endpoint_id, _ = register(f"{receiver.url}/hook")
    end_batch()
    with transaction() as session:
        tenant = make_tenant(session)
        delete_endpoint(session, tenant_id=tenant.id, endpoint_id=endpoint_id)
    assert delivery_rows() == [] and deliver_due() == 0 and receiver.received == []


def test_after_a_rotation_that_keeps_the_old_secret_both_verify(backend: Backend, receiver: Receiver) -> None:
    endpoint_id, old = register(f"{receiver.url}/hook")
    with transaction() as session:
        new = rotate_secret(session, tenant_id=make_tenant(session).id, endpoint_id=endpoint_id, keep_old=True).secret
    end_batch()
    deliver_due()
    [post] = receiver.wait_for(1)
    for secret in (old, new):
        SDK.webhooks.verify_signature(post.body, post.headers, secret=secret)


def test_only_subscribed_endpoints_of_the_batchs_tenant_get_the_event(backend: Backend, receiver: Receiver) -> None:
    register(f"{receiver.url}/acme-failures", events=["batch.failed"])
    register(f"{receiver.url}/acme-all")
    register(f"{receiver.url}/globex-all", tenant="globex")
    end_batch(status=lifecycle.CANCELLED)
    deliver_due()
    assert [post.path for post in receiver.wait_for(1)] == ["/acme-all"]
    time.sleep(0.2)
    assert len(receiver.received) == 1


# Real batches through the API and the embedded worker (fake engine).


@pytest.fixture
def live(backend: Backend) -> Iterator[LiveServer]:
    server, stop = start_server(with_worker=True)
    yield server
    stop()


def test_a_real_batch_completion_reaches_the_receiver_and_the_sdk_unwraps_it(
    live: LiveServer, receiver: Receiver
) -> None:
    client = live.client(make_key("acme"))
    endpoint = client.webhooks.create(name="ci", url=f"{receiver.url}/hook", event_types=["batch.completed"])
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl([chat_line(i) for i in range(5)])).id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    done = wait_for(client, batch.id)
    [post] = receiver.wait_for(1)
    event = client.webhooks.unwrap(post.body, post.headers, secret=endpoint.signing_secret)
    assert isinstance(event, BatchCompletedWebhookEvent)
    assert event.data.id == batch.id and event.created_at == done.completed_at and event.id.startswith("evt_")
    assert json.loads(post.body) == {
        "object": "event",
        "id": event.id,
        "type": "batch.completed",
        "created_at": done.completed_at,
        "data": {"id": batch.id},
    }
    deadline = time.time() + 10
    while True:  # the attempt is recorded just after the receiver answered
        page = client.get(f"/webhooks/{endpoint.id}/deliveries", cast_to=object)
        if (page["data"] and page["data"][0]["status"] == "delivered") or time.time() > deadline:
            break
        time.sleep(0.1)
    [delivery] = page["data"]
    assert delivery["id"] == post.headers["webhook-id"] and delivery["event"]["data"]["id"] == batch.id
    assert delivery["status"] == "delivered" and delivery["attempt_count"] == 1
    assert delivery["attempts"][0]["status_code"] == 200 and delivery["attempts"][0]["response_body"] == "ok"


def test_failed_cancelled_and_expired_batches_each_send_their_event(live: LiveServer, receiver: Receiver) -> None:
    client = live.client(make_key("acme"))
    endpoint = client.webhooks.create(
        name="ends", url=f"{receiver.url}/hook", event_types=["batch.failed", "batch.cancelled", "batch.expired"]
    )
    bad = upload(client, b'{"custom_id": "x", "method": "POST"\nnot json\n')
    failed = client.batches.create(input_file_id=bad.id, endpoint="/v1/chat/completions", completion_window="24h")
    slow = upload(client, to_jsonl([chat_line(i, max_tokens=10**8) for i in range(4)]))
    cancelled = client.batches.create(input_file_id=slow.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for(client, cancelled.id, {"in_progress"})
    client.batches.cancel(cancelled.id)
    expired = create_job([chat_line(i, max_tokens=10**8) for i in range(2)], deadline=int(time.time()) + 1)
    for batch_id in (failed.id, cancelled.id, expired):
        wait_for(client, batch_id, timeout=60)
    posts = receiver.wait_for(3, timeout=30)
    events = [client.webhooks.unwrap(post.body, post.headers, secret=endpoint.signing_secret) for post in posts]
    assert {(event.type, event.data.id) for event in events} == {
        ("batch.failed", failed.id),
        ("batch.cancelled", cancelled.id),
        ("batch.expired", expired),
    }


def test_a_target_refused_at_delivery_time_is_never_contacted(
    live: LiveServer, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = live.client(make_key("acme"))
    endpoint = client.webhooks.create(name="ci", url=f"{receiver.url}/hook", event_types=["batch.completed"])
    # The operator withdraws the loopback allowance (as if the host's DNS now pointed at 127.0.0.1).
    monkeypatch.setenv("BACKFILL_WEBHOOK_ALLOWED_NETWORKS", "")
    get_settings.cache_clear()
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl([chat_line(0)])).id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    wait_for(client, batch.id)
    deadline = time.time() + 15
    attempts: list[dict[str, object]] = []
    while not attempts and time.time() < deadline:
        page = client.get(f"/webhooks/{endpoint.id}/deliveries", cast_to=object)
        attempts = page["data"][0]["attempts"] if page["data"] else []
        time.sleep(0.2)
    assert attempts, "the delivery was never attempted"
    assert attempts[0]["status_code"] is None and "refused" in str(attempts[0]["error"])
    assert "loopback address" in str(attempts[0]["error"]) and page["data"][0]["status"] == "pending"
    assert receiver.received == []
