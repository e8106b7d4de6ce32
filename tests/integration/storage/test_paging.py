"""Keyset paging (storage/paging.py) and the lists built on it: walking forwards or backwards page by page
visits every row exactly once, in order, even where rows share a creation second."""

from __future__ import annotations

import ipaddress

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.batches.message_batches import list_message_batches
from storage.models import Batch
from storage.paging import keyset_page
from storage.protocols import ANTHROPIC
from storage.webhooks.deliveries import list_deliveries
from storage.webhooks.endpoints import create_endpoint, list_endpoints
from storage.webhooks.events import record_event
from storage.webhooks.targets import TargetPolicy
from tests.factories import DAY0, make_batch, make_tenant

# Seven batches over three seconds: ties on created_at are broken by id.
SECONDS = [DAY0, DAY0, DAY0 + 1, DAY0 + 1, DAY0 + 1, DAY0 + 2, DAY0 + 2]
POLICY = TargetPolicy(allow_http=True, allowed_networks=(ipaddress.ip_network("127.0.0.0/8"),))


def _batches(session: Session, *, anthropic: bool = False) -> list[Batch]:
    """The tenant's batches, newest first as every list shows them."""
    tenant = make_tenant(session)
    rows = [make_batch(session, tenant=tenant, created_at=at) for at in SECONDS]
    for row in rows:
        row.protocol = ANTHROPIC.name if anthropic else row.protocol
    session.flush()
    return sorted(rows, key=lambda row: (row.created_at, row.id), reverse=True)


def test_paging_forwards_visits_every_batch_once_newest_first(session: Session) -> None:
    newest_first = _batches(session)
    key, seen, anchor = (Batch.created_at, Batch.id), [], None
    while True:
        rows = keyset_page(session, select(Batch), key=key, anchor=anchor, limit=3)
        seen += rows[:3]
        if len(rows) <= 3:
            break
        anchor = (rows[2].created_at, rows[2].id)
    assert [row.id for row in seen] == [row.id for row in newest_first]


def test_paging_backwards_from_the_oldest_returns_the_newer_rows_nearest_first(session: Session) -> None:
    newest_first = _batches(session)
    oldest = newest_first[-1]
    rows = keyset_page(
        session,
        select(Batch),
        key=(Batch.created_at, Batch.id),
        anchor=(oldest.created_at, oldest.id),
        limit=2,
        before=True,
    )
    assert [row.id for row in rows] == [row.id for row in newest_first[-2:-5:-1]]  # two, plus one to say "more"


def test_oldest_first_paging_is_the_reverse_walk(session: Session) -> None:
    newest_first = _batches(session)
    middle = newest_first[3]
    key, anchor = (Batch.created_at, Batch.id), (middle.created_at, middle.id)
    after = keyset_page(session, select(Batch), key=key, anchor=anchor, limit=10, descending=False)
    before = keyset_page(session, select(Batch), key=key, anchor=anchor, limit=10, descending=False, before=True)
    assert [row.id for row in after] == [row.id for row in reversed(newest_first[:3])]
    assert [row.id for row in before] == [row.id for row in newest_first[4:]]


def test_message_batches_page_both_ways_and_meet_in_the_middle(session: Session) -> None:
    newest_first = _batches(session, anthropic=True)
    tenant_id, ids = newest_first[0].tenant_id, [row.id for row in newest_first]
    older, more_older = list_message_batches(session, tenant_id=tenant_id, before_id=None, after_id=ids[2], limit=3)
    assert ([row.id for row in older], more_older) == (ids[3:6], True)
    newer, more_newer = list_message_batches(session, tenant_id=tenant_id, before_id=ids[5], after_id=None, limit=3)
    assert ([row.id for row in newer], more_newer) == (ids[2:5], True)  # shown newest first, like every page
    top, more_top = list_message_batches(session, tenant_id=tenant_id, before_id=ids[2], after_id=None, limit=3)
    assert ([row.id for row in top], more_top) == (ids[:2], False)


def test_webhook_endpoints_and_their_deliveries_page_newest_first(session: Session) -> None:
    tenant = make_tenant(session)
    endpoints = [
        create_endpoint(
            session,
            tenant_id=tenant.id,
            url=f"http://127.0.0.1:9/hook{n}",
            name=None,
            event_types=None,
            policy=POLICY,
            max_per_tenant=10,
        )
        for n in range(5)
    ]
    walked, after = [], None
    while True:
        page = list_endpoints(session, tenant_id=tenant.id, after=after, limit=2)
        walked += page[:2]
        if len(page) <= 2:
            break
        after = page[1].id
    assert [row.id for row in walked] == [row.id for row in reversed(endpoints)]

    for n in range(5):
        record_event(session, tenant_id=tenant.id, type_="batch.completed", subject_id=f"batch_{n}", at=DAY0 + n)
    session.flush()
    first = list_deliveries(session, tenant_id=tenant.id, endpoint_id=endpoints[0].id, after=None, limit=3)
    rest = list_deliveries(
        session, tenant_id=tenant.id, endpoint_id=endpoints[0].id, after=first[2].delivery.id, limit=3
    )
    subjects = [view.event_body for view in first[:3] + rest]
    assert len(first) == 4 and len(rest) == 2
    assert [next(f"batch_{n}" for n in range(5) if f'"batch_{n}"' in body) for body in subjects] == [
        f"batch_{n}" for n in reversed(range(5))
    ]
