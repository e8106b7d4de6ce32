"""File expiry through the official SDK: `expires_after` on upload, `expires_at` on every file, and the
retention sweep removing expired objects (S3 on moto, or the local folder) while a running batch goes on."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from sqlalchemy import update

from storage.clock import now
from storage.db import transaction
from storage.files.blobs import get_blob_store
from storage.models import File
from tests.conftest import LiveServer, make_key
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for

# Steps of 5 ms: 16 requests x 400 tokens on 8 slots keep a batch running for several seconds.
MODELS = json.dumps(  # a name of its own: a worker's engines are cached per model name for the session
    {"slow-model": {"path": "fake:", "max_num_seqs": 8, "max_model_len": 4096, "extra": {"step_seconds": 0.005}}}
)
pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": MODELS, "BACKFILL_REAP_INTERVAL_SECONDS": "1"})


def expire_now(file_id: str) -> None:
    """Move a file's expiry into the past, as if its hour had gone by."""
    with transaction() as session:
        session.execute(update(File).where(File.id == file_id).values(expires_at=now() - 1))


def blob_key_of(file_id: str) -> str:
    """Where the file's object lives (its row keeps the key; the rule is storage/files/blobs/layout.py)."""
    with transaction() as session:
        row = session.get(File, file_id)
        assert row is not None
        return row.blob_key


def wait_gone(client: openai.OpenAI, file_id: str, timeout: float = 20, *, key: str) -> None:
    deadline = time.time() + timeout
    while get_blob_store().exists(key):
        assert time.time() < deadline, f"the retention sweep never removed {file_id}"
        time.sleep(0.2)


def test_a_batch_file_expires_after_30_days_by_default_and_expires_after_sets_it(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    default = upload(client, to_jsonl([chat_line(0, model="slow-model")]))
    assert default.expires_at == default.created_at + 30 * 86400
    short = client.files.create(
        file=("jobs.jsonl", to_jsonl([chat_line(0, model="slow-model")])),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    assert short.expires_at == short.created_at + 3600
    assert client.files.retrieve(short.id).expires_at == short.expires_at
    assert {f.id: f.expires_at for f in client.files.list()} == {
        default.id: default.expires_at,
        short.id: short.expires_at,
    }


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "60"}, "expires_after.seconds"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "2592001"}, "expires_after.seconds"),
        ({"expires_after[anchor]": "created_at", "expires_after[seconds]": "soon"}, "expires_after.seconds"),
        ({"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"}, "expires_after.anchor"),
        ({"expires_after[seconds]": "3600"}, "expires_after.anchor"),
    ],
)
def test_an_expires_after_outside_openais_rules_is_a_400(api: LiveServer, fields: dict[str, str], param: str) -> None:
    key = make_key("acme")
    response = httpx.post(
        f"{api.base_url}/v1/files",
        headers={"Authorization": f"Bearer {key}"},
        data={"purpose": "batch", **fields},
        files={"file": ("jobs.jsonl", to_jsonl([chat_line(0, model="slow-model")]))},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert list(api.client(key).files.list()) == []


def test_an_expired_file_is_swept_from_object_storage_and_404s_while_its_running_batch_completes(
    api: LiveServer,
) -> None:
    client = api.client(make_key("acme"))
    lines = [chat_line(i, model="slow-model", max_tokens=400) for i in range(16)]
    source = client.files.create(
        file=("jobs.jsonl", to_jsonl(lines)), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
    )
    keeper = upload(client, to_jsonl([chat_line(0, model="slow-model")]))  # not expired: the sweep must leave it alone
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for(client, batch.id, {"in_progress"})

    key = blob_key_of(source.id)
    expire_now(source.id)
    with pytest.raises(openai.NotFoundError):  # expired answers 404 at once, before the sweep ran
        client.files.retrieve(source.id)
    wait_gone(client, source.id, key=key)
    assert client.batches.retrieve(batch.id).status == "in_progress"  # the sweep came while it ran
    with transaction() as session:
        assert session.get(File, source.id) is None  # the row went with the object
    for call in (client.files.retrieve, client.files.content):
        with pytest.raises(openai.NotFoundError):
            call(source.id)
    assert source.id not in {f.id for f in client.files.list()}

    done = wait_for(client, batch.id, timeout=120)
    assert done.status == "completed" and done.request_counts.completed == 16
    assert len(read_lines(client, done.output_file_id)) == 16
    assert client.files.retrieve(keeper.id).id == keeper.id
    assert get_blob_store().exists(blob_key_of(keeper.id))


def test_an_output_file_with_output_expires_after_is_swept_once_expired(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([chat_line(0, model="slow-model")]))
    batch = client.batches.create(
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 3600},
    )
    done = wait_for(client, batch.id)
    assert done.output_file_id and client.files.content(done.output_file_id).text
    key = blob_key_of(done.output_file_id)
    expire_now(done.output_file_id)
    wait_gone(client, done.output_file_id, key=key)
    with pytest.raises(openai.NotFoundError):
        client.files.content(done.output_file_id)
    assert client.batches.retrieve(batch.id).status == "completed"
