"""Claims of lines naming LoRA adapters (docs/adapters.md): each adapter's rows together inside the claim, each row
with its adapter's folder (the registry's or a registered one's; none once the adapter was deleted)."""

from __future__ import annotations

import json

import pytest

from storage import lifecycle
from storage.clock import now
from storage.db import transaction
from storage.models import Adapter
from storage.queue.claim import claim
from storage.queue.claim_order import ClaimOrder
from storage.settings import get_settings
from tests.conftest import Backend
from tests.factories import make_batch, make_request, make_tenant

SETTINGS_ADAPTER = "/srv/adapters/tone"
MODELS = {"fake-model": {"path": "fake:", "enable_lora": True, "adapters": {"tone": SETTINGS_ADAPTER}}}
pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps(MODELS)})


def test_a_claim_groups_adapters_and_hands_each_row_its_folder(backend: Backend) -> None:
    named = ["b", None, "tone", "b", "gone", None]
    with transaction() as session:
        tenant = make_tenant(session)
        session.add(
            Adapter(
                id="adapter_1",
                name="b",
                base_model="fake-model",
                tenant_id=tenant.id,
                path="/srv/registered/b",
                rank=8,
                size_bytes=1,
                target_modules=["q_proj"],
                created_at=now(),
            )
        )
        batch = make_batch(session, tenant=tenant, created_at=now())
        for adapter in named:
            row = make_request(session, batch=batch, status=lifecycle.REQ_QUEUED)
            row.adapter = adapter
    with transaction() as session:
        claimed = claim(
            session,
            settings=get_settings(),
            model="fake-model",
            worker_id="w",
            limit=10,
            lease_seconds=60,
            order=ClaimOrder(prefix_ordering=False),
        )
    assert [item.adapter for item in claimed] == [None, None, "b", "b", "gone", "tone"]
    folders = {item.adapter: item.adapter_path for item in claimed}
    assert folders == {None: None, "b": "/srv/registered/b", "gone": None, "tone": SETTINGS_ADAPTER}
