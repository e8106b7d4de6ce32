"""Bad adapters and bad adapter batches (issue 39 §5, docs/adapters.md): each a clear OpenAI error envelope or a
per-line error with its line number, and nothing else harmed: other tenants' adapters and batches run."""

from __future__ import annotations

import io
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from storage.adapters.registry import REGISTERED_FOLDER
from storage.settings import get_settings
from tests.conftest import Backend, LiveServer, make_key, start_server
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for
from worker.engine.demo_adapter import DEMO_SHAPES, write_adapter

ADAPTER_MAX_BYTES = 1_000_000  # a demo adapter of rank 8 is ~0.62 MB
MODELS = {"fake-model": {"path": "fake:", "max_num_seqs": 8, "enable_lora": True, "max_lora_rank": 8}}
pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": json.dumps(MODELS),
        "BACKFILL_ADAPTER_MAX_BYTES": str(ADAPTER_MAX_BYTES),
        "BACKFILL_ADAPTERS_PER_TENANT_MAX": "3",
        "BACKFILL_BATCH_MAX_ADAPTERS": "2",
    }
)
# A base model with a config.json (the demo model's shapes) for the architecture check; never loaded: its server
# runs no worker.
LLAMA_BASE = Path(tempfile.mkdtemp(prefix="backfill-test-base-"))
DEMO_CONFIG = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 64}  # fmt: skip
LLAMA_MODELS = {"llama": {"path": str(LLAMA_BASE), "enable_lora": True, "max_lora_rank": 8}}


def post(api: LiveServer, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{api.base_url}/v1/adapters", json=body, headers={"Authorization": f"Bearer {key}"})


def error_of(response: httpx.Response) -> tuple[int, str, str]:
    """(status, code, message) of an OpenAI error envelope."""
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}
    return response.status_code, error["code"], error["message"]


def run_batch(client: openai.OpenAI, models: list[str]) -> openai.types.Batch:
    source = upload(client, to_jsonl([chat_line(i, model=model) for i, model in enumerate(models)]))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    return wait_for(client, batch.id)


def test_a_2_gb_adapter_is_refused_by_its_size(api: LiveServer, tmp_path: Path) -> None:
    admin = make_key("ops", admin=True)
    write_adapter(tmp_path / "huge", seed=1)
    with (tmp_path / "huge" / "adapter_model.safetensors").open("r+b") as weights:
        weights.truncate(2 * 1024**3)  # sparse: nothing written
    refused = post(api, admin, {"name": "huge", "base_model": "fake-model", "path": str(tmp_path / "huge")})
    status, code, message = error_of(refused)
    assert (status, code) == (400, "invalid_adapter") and "BACKFILL_ADAPTER_MAX_BYTES" in message

    # Uploaded with the Files API: refused from the files' recorded sizes, before a byte is copied.
    client = api.client(admin)
    write_adapter(tmp_path / "ok", seed=1)
    config = client.files.create(
        file=("adapter_config.json", io.BytesIO((tmp_path / "ok" / "adapter_config.json").read_bytes())),
        purpose="adapter",  # type: ignore[arg-type]
    )
    big = client.files.create(
        file=("adapter_model.safetensors", io.BytesIO(b"\0" * (ADAPTER_MAX_BYTES + 1))),
        purpose="adapter",  # type: ignore[arg-type]
    )
    files = {"config": config.id, "weights": big.id}
    refused = post(api, admin, {"name": "big", "base_model": "fake-model", "files": files})
    assert error_of(refused)[:2] == (400, "invalid_adapter") and "larger than" in error_of(refused)[2]
    assert not any((get_settings().data_dir / REGISTERED_FOLDER).glob("*"))  # no folder was made


def test_a_rank_above_max_lora_rank_and_a_corrupt_file_are_refused_by_name(api: LiveServer, tmp_path: Path) -> None:
    admin = make_key("ops", admin=True)
    write_adapter(tmp_path / "r16", seed=1, rank=16, layers=1)  # small: the size bound passes it
    status, code, message = error_of(post(api, admin, {"name": "r16", "base_model": "fake-model",
                                                         "path": str(tmp_path / "r16")}))  # fmt: skip
    assert (status, code) == (400, "invalid_adapter")
    assert "rank 16 is above the base model's max_lora_rank 8" in message
    write_adapter(tmp_path / "cut", seed=1)
    weights = tmp_path / "cut" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[: len(weights.read_bytes()) // 2])
    status, code, message = error_of(post(api, admin, {"name": "cut", "base_model": "fake-model",
                                                         "path": str(tmp_path / "cut")}))  # fmt: skip
    assert (status, code) == (400, "invalid_adapter") and "corrupt" in message
    assert httpx.get(f"{api.base_url}/v1/adapters", headers={"Authorization": f"Bearer {admin}"}).json()["data"] == []


@pytest.fixture
def llama_api(backend: Backend) -> Iterator[LiveServer]:
    (LLAMA_BASE / "config.json").write_text(json.dumps(DEMO_CONFIG))
    server, stop = start_server(with_worker=False)
    yield server
    stop()


@pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps(LLAMA_MODELS)})
def test_an_adapter_of_another_architecture_is_refused(llama_api: LiveServer, tmp_path: Path) -> None:
    admin = make_key("ops", admin=True)
    wider = {name: (fan_in * 2, fan_out * 2) for name, (fan_in, fan_out) in DEMO_SHAPES.items()}
    write_adapter(tmp_path / "wide", seed=1, shapes=wider)  # a larger model's adapter
    write_adapter(tmp_path / "gpt", seed=1, shapes={"c_attn": (256, 768)})  # GPT-2's fused projection
    write_adapter(tmp_path / "ok", seed=1)
    for name, why in (("wide", "does not fit the base model"), ("gpt", "c_attn of layer 0")):
        answer = post(llama_api, admin, {"name": name, "base_model": "llama", "path": str(tmp_path / name)})
        status, code, message = error_of(answer)
        assert (status, code) == (400, "invalid_adapter") and why in message
    assert (
        post(llama_api, admin, {"name": "ok", "base_model": "llama", "path": str(tmp_path / "ok")}).status_code == 200
    )


def test_a_tenant_past_its_adapter_quota_gets_429_and_nothing_else_changes(api: LiveServer, tmp_path: Path) -> None:
    admin, acme, beta = make_key("ops", admin=True), make_key("acme"), make_key("beta")
    write_adapter(tmp_path / "a", seed=1)

    def register(name: str, tenant: str | None) -> httpx.Response:
        body = {"name": name, "base_model": "fake-model", "path": str(tmp_path / "a")}
        return post(api, admin, body if tenant is None else {**body, "tenant": tenant})

    assert [register(f"acme-{i}", "acme").status_code for i in range(3)] == [200, 200, 200]
    status, code, message = error_of(register("acme-3", "acme"))
    assert (status, code) == (429, "quota_exceeded") and "BACKFILL_ADAPTERS_PER_TENANT_MAX" in message
    assert register("beta-0", "beta").status_code == 200  # another tenant's quota is its own
    assert register("everyone", None).status_code == 200  # adapters for every tenant count against no tenant
    batch = run_batch(api.client(acme), ["acme-2", "fake-model", "everyone"])
    assert batch.status == "completed" and batch.request_counts.completed == 3
    assert "acme-0" not in {m.id for m in api.client(beta).models.list().data}


def test_a_batch_naming_more_adapters_than_the_bound_fails_at_validation_with_line_numbers(
    api: LiveServer, tmp_path: Path
) -> None:
    admin, acme, beta = make_key("ops", admin=True), make_key("acme"), make_key("beta")
    write_adapter(tmp_path / "a", seed=1)
    for index in range(4):
        body = {"name": f"tone-{index}", "base_model": "fake-model", "path": str(tmp_path / "a")}
        assert post(api, admin, body).status_code == 200

    # Lines 1-6: the base and four distinct adapters, two of them twice; BACKFILL_BATCH_MAX_ADAPTERS is 2.
    models = ["fake-model", "tone-0", "tone-1", "tone-2", "tone-0", "tone-3"]
    source = upload(api.client(acme), to_jsonl([chat_line(i, model=m) for i, m in enumerate(models)]))
    greedy = api.client(acme).batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    fine = run_batch(api.client(beta), ["tone-3", "fake-model", "tone-1"])  # another tenant's batch meanwhile
    greedy = wait_for(api.client(acme), greedy.id)

    assert greedy.status == "failed"
    errors = [(e.line, e.code) for e in greedy.errors.data]  # type: ignore[union-attr]
    assert errors == [(4, "too_many_adapters"), (6, "too_many_adapters")]
    assert "more than 2 adapters (BACKFILL_BATCH_MAX_ADAPTERS)" in greedy.errors.data[0].message  # type: ignore[union-attr,index]
    assert fine.status == "completed" and fine.request_counts.completed == 3
    out = {line["custom_id"]: line["response"]["body"]["model"] for line in read_lines(api.client(beta),
                                                                                         fine.output_file_id)}  # fmt: skip
    assert out == {"req-0": "tone-3", "req-1": "fake-model", "req-2": "tone-1"}
