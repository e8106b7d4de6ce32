"""`backfill files list|rm` against the real API."""

from __future__ import annotations

import json

import pytest

from tests.conftest import LiveServer
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload

pytestmark = [
    pytest.mark.parametrize("backend", ["embedded"], indirect=True),
    pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS}),
]


def test_files_list_and_rm(cli, server: LiveServer, key: str) -> None:  # type: ignore[no-untyped-def]
    uploaded = upload(server.client(key), to_jsonl([chat_line(0)]), name="mine.jsonl")
    code, out, _ = cli("files", "list")
    assert code == 0 and uploaded.id in out and "mine.jsonl" in out
    code, out, _ = cli("files", "rm", uploaded.id)
    assert code == 0 and out.strip() == f"deleted {uploaded.id}"
    code, out, _ = cli("files", "list", "--json")
    assert code == 0 and json.loads(out)["data"] == []
    code, _, err = cli("files", "rm", uploaded.id)
    assert code == 1 and f"No such File object: {uploaded.id}" in err and err.count("\n") == 1
