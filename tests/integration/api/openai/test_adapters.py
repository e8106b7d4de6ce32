"""LoRA adapters over the API (docs/adapters.md): registered by admin keys from uploaded files or a server folder,
checked at registration, listed by /v1/models with their base, named by lines, scoped to a tenant, costed."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer, make_key
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for
from worker.engine.demo_adapter import write_adapter

MODELS = json.dumps(
    {
        "fake-model": {"path": "fake:", "max_num_seqs": 8, "enable_lora": True, "max_lora_rank": 8},
        "other-model": {"path": "fake:"},
    }
)
pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": MODELS, "BACKFILL_ADAPTERS_PER_TENANT_MAX": "2"})


def post(api: LiveServer, key: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{api.base_url}/v1/adapters", json=body, headers={"Authorization": f"Bearer {key}"})


def register_from_files(api: LiveServer, admin: str, folder: Path, **body: Any) -> httpx.Response:
    client = api.client(admin)
    ids = {}
    for part, name in (("config", "adapter_config.json"), ("weights", "adapter_model.safetensors")):
        data = io.BytesIO((folder / name).read_bytes())
        ids[part] = client.files.create(file=(name, data), purpose="adapter").id  # type: ignore[arg-type]
    return post(api, admin, {"base_model": "fake-model", "files": ids, **body})


def run_batch(client: openai.OpenAI, models: list[str]) -> openai.types.Batch:
    lines = [chat_line(i, model=model, max_tokens=6) for i, model in enumerate(models)]
    source = upload(client, to_jsonl(lines))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    return wait_for(client, batch.id)


def test_adapters_register_list_run_and_cost_per_tenant(api: LiveServer, tmp_path: Path) -> None:
    admin, acme, beta = make_key("ops", admin=True), make_key("acme"), make_key("beta")
    for name, seed in (("own", 1), ("shared", 2)):
        write_adapter(tmp_path / name, seed=seed)
    made = register_from_files(api, admin, tmp_path / "own", name="acme-tone", tenant="acme")
    assert made.status_code == 200, made.text
    assert made.json()["rank"] == 8 and made.json()["tenant_id"] is not None
    shared = post(api, admin, {"name": "shared-tone", "base_model": "fake-model", "path": str(tmp_path / "shared")})
    assert shared.status_code == 200, shared.text

    listed = {m.id: m for m in api.client(acme).models.list().data}
    assert listed["acme-tone"].parent == "fake-model"  # as vLLM lists a LoRA module
    assert "shared-tone" in listed and "fake-model" in listed
    assert "acme-tone" not in {m.id for m in api.client(beta).models.list().data}

    client = api.client(acme)
    batch = run_batch(client, ["acme-tone", "fake-model", "shared-tone", "acme-tone"])
    assert batch.status == "completed" and batch.request_counts.completed == 4
    out = {line["custom_id"]: line["response"]["body"] for line in read_lines(client, batch.output_file_id)}
    assert [out[f"req-{i}"]["model"] for i in range(4)] == ["acme-tone", "fake-model", "shared-tone", "acme-tone"]
    texts = [out[f"req-{i}"]["choices"][0]["message"]["content"] for i in range(4)]
    assert texts[0] == texts[3] != texts[2]  # the fake answers by adapter: each line ran under its own

    now = int(time.time())
    costs = httpx.get(
        f"{api.base_url}/v1/organization/costs",
        params={"start_time": now - 86400, "end_time": now + 86400, "group_by": "model,adapter"},
        headers={"Authorization": f"Bearer {acme}"},
    ).json()
    rows = [row for bucket in costs["data"] for row in bucket["results"]]
    per_adapter = {row["adapter"]: row["num_model_requests"] for row in rows}
    assert per_adapter == {"acme-tone": 2, None: 1, "shared-tone": 1}
    assert {row["model"] for row in rows} == {"fake-model"}


def test_another_tenants_adapter_answers_as_an_unknown_model(api: LiveServer, tmp_path: Path) -> None:
    admin, beta = make_key("ops", admin=True), make_key("beta")
    make_key("acme")
    write_adapter(tmp_path / "own", seed=1)
    assert register_from_files(api, admin, tmp_path / "own", name="acme-tone", tenant="acme").status_code == 200
    client = api.client(beta)

    errors = []
    for model in ("acme-tone", "no-such-model"):
        source = upload(client, to_jsonl([chat_line(0, model=model)]))
        with pytest.raises(openai.BadRequestError) as caught:
            client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
        errors.append(caught.value.body)
    assert errors[0]["code"] == errors[1]["code"] == "model_not_found"  # type: ignore[index]
    assert errors[0]["message"].replace("acme-tone", "X") == errors[1]["message"].replace("no-such-model", "X")  # type: ignore[index]

    batch = run_batch(client, ["fake-model", "acme-tone", "no-such-model"])
    assert batch.status == "failed"
    found = [(e.line, e.code) for e in batch.errors.data]  # type: ignore[union-attr]
    assert found == [(2, "mismatched_model"), (3, "mismatched_model")]


def test_registration_refuses_what_the_engine_could_not_run(api: LiveServer, tmp_path: Path) -> None:
    admin, acme = make_key("ops", admin=True), make_key("acme")
    write_adapter(tmp_path / "wide", seed=1, rank=16)
    write_adapter(tmp_path / "ok", seed=1)
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "adapter_config.json").write_bytes((tmp_path / "ok" / "adapter_config.json").read_bytes())
    (tmp_path / "corrupt" / "adapter_model.safetensors").write_bytes(b"\x00" * 64)

    def code(body: dict[str, Any], key: str = admin) -> tuple[int, str]:
        response = post(api, key, {"base_model": "fake-model", **body})
        return response.status_code, response.json()["error"]["code"]

    assert code({"name": "r16", "path": str(tmp_path / "wide")}) == (400, "invalid_adapter")
    assert code({"name": "bad", "path": str(tmp_path / "corrupt")}) == (400, "invalid_adapter")
    assert code({"name": "x", "path": str(tmp_path / "ok"), "base_model": "other-model"})[0] == 400
    assert code({"name": "fake-model", "path": str(tmp_path / "ok")}) == (400, "name_taken")
    assert code({"name": "mine", "path": str(tmp_path / "ok")}, key=acme) == (403, "permission_denied")
    for index in range(2):
        assert post(api, admin, {"name": f"t{index}", "base_model": "fake-model", "path": str(tmp_path / "ok"),
                                 "tenant": "acme"}).status_code == 200  # fmt: skip
    assert code({"name": "t2", "path": str(tmp_path / "ok"), "tenant": "acme"}) == (429, "quota_exceeded")

    headers = {"Authorization": f"Bearer {admin}"}
    assert httpx.delete(f"{api.base_url}/v1/adapters/t0", headers=headers).json()["deleted"] is True
    assert httpx.get(f"{api.base_url}/v1/adapters/t0", headers=headers).status_code == 404
    names = [a["name"] for a in httpx.get(f"{api.base_url}/v1/adapters", headers=headers).json()["data"]]
    assert names == ["t1"]
