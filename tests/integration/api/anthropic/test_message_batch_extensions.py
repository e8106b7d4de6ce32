"""Backfill's create extensions on a Message Batch, through the anthropic SDK's `extra_body` (issue 20): the
same `priority` and `max_cost_usd` an OpenAI batch takes, read beside `requests` by the one bounded reader."""

from __future__ import annotations

import anthropic
import pytest

from tests.conftest import LiveServer, make_key
from tests.integration.api.anthropic.test_message_batches import ENV, client_for, req

pytestmark = pytest.mark.backfill_env(ENV)


def test_priority_and_a_spend_cap_go_in_extra_body(api: LiveServer) -> None:
    client = client_for(api, make_key("acme"))
    batch = client.messages.batches.create(
        requests=[req("a"), req("b")],  # type: ignore[list-item]
        extra_body={"priority": -5, "max_cost_usd": "12.50"},
    )
    assert batch.to_dict()["priority"] == -5
    from storage.db import transaction
    from storage.models import Batch

    with transaction() as session:
        row = session.get(Batch, batch.id)
        assert row is not None and (row.priority, row.max_cost_micro_usd) == (-5, 12_500_000)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"priority": "high"}, "priority must be an integer"),
        ({"priority": 50}, "priority"),  # above the operator's cap (0 by default)
        ({"max_cost_usd": "lots"}, "max_cost_usd"),
        ({"webhook": "https://example.com"}, "webhook: Extra inputs are not permitted"),
    ],
)
def test_a_bad_extension_is_a_400_in_anthropics_envelope(
    api: LiveServer, extra: dict[str, object], message: str
) -> None:
    client = client_for(api, make_key("acme"))
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.batches.create(requests=[req("a")], extra_body=extra)  # type: ignore[list-item]
    assert message in str(caught.value)
    assert client.messages.batches.list().data == []
