"""The estimate (`POST /v1/batches/estimate`) of a file whose lines name LoRA adapters agrees with validation and
admission (docs/adapters.md): the adapter bound with the lines validation names, unknown and other tenants'
adapters as create answers them, the LoRA overhead in the estimated time and compute cost, and the monthly budget
counting every adapter line."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from storage.planning.lora import adapter_factor
from tests.conftest import Backend, LiveServer, make_key, start_server
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for
from worker.engine.demo_adapter import DEMO_SHAPES, write_adapter

MODELS = {"fake-model": {"path": "fake:", "max_num_seqs": 8, "enable_lora": True, "max_lora_rank": 8}}
PRICES = {"prices": [{"model": "fake-model", "effective_from": "2025-01-01", "input_usd_per_mtok": "0",
                      "output_usd_per_mtok": "2000000"}]}  # fmt: skip  # one output token bills $1 at 24h
pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": json.dumps(MODELS),
        "BACKFILL_BATCH_MAX_ADAPTERS": "2",
        "BACKFILL_PRICE_BOOK": json.dumps(PRICES),
    }
)
# A base model with a config.json (the demo model's shapes) so the planner's LoRA factor is more than 1; never
# loaded: its server runs no worker.
LLAMA_BASE = Path(tempfile.mkdtemp(prefix="backfill-test-base-"))
DEMO_CONFIG = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 32000}  # fmt: skip
LLAMA_MODELS = {"llama": {"path": str(LLAMA_BASE), "enable_lora": True, "max_lora_rank": 8}}
BODY = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}


def register(api: LiveServer, admin: str, name: str, folder: Path, *, base: str = "fake-model", **extra: Any) -> None:
    body = {"name": name, "base_model": base, "path": str(folder), **extra}
    answer = httpx.post(f"{api.base_url}/v1/adapters", json=body, headers={"Authorization": f"Bearer {admin}"})
    assert answer.status_code == 200, answer.text


def estimate(client: openai.OpenAI, models: list[str], **line: Any) -> dict[str, Any]:
    source = upload(client, to_jsonl([chat_line(i, model=model, **line) for i, model in enumerate(models)]))
    return dict(client.post("/batches/estimate", body={"input_file_id": source.id, **BODY}, cast_to=object))  # type: ignore[call-overload]


def validated(client: openai.OpenAI, models: list[str]) -> list[tuple[int, str, str]]:
    """(line, code, message) of each line error validation gives the same file."""
    source = upload(client, to_jsonl([chat_line(i, model=model) for i, model in enumerate(models)]))
    batch = wait_for(client, client.batches.create(input_file_id=source.id, **BODY).id)  # type: ignore[arg-type]
    return [(e.line, e.code, e.message) for e in (batch.errors.data if batch.errors else [])]  # type: ignore[misc]


def problems(found: dict[str, Any]) -> list[tuple[int, str, str]]:
    return [(p["line"], p["code"], p["message"]) for p in found["problems"]]


def test_an_estimate_names_the_lines_past_the_adapter_bound_as_validation_does(api: LiveServer, tmp_path: Path) -> None:
    admin, client = make_key("ops", admin=True), api.client(make_key("acme"))
    write_adapter(tmp_path / "a", seed=1)
    for index in range(4):
        register(api, admin, f"tone-{index}", tmp_path / "a")
    # The base and four distinct adapters, two of them twice; BACKFILL_BATCH_MAX_ADAPTERS is 2.
    models = ["fake-model", "tone-0", "tone-1", "tone-2", "tone-0", "tone-3"]

    found = estimate(client, models)

    assert found["model"] == "fake-model" and found["requests"] == 4 and found["skipped_lines"] == 2
    assert [(line, code) for line, code, _ in problems(found)] == [(4, "too_many_adapters"), (6, "too_many_adapters")]
    assert problems(found) == validated(client, models)


def test_an_estimate_answers_unknown_and_other_tenants_adapters_as_create_does(api: LiveServer, tmp_path: Path) -> None:
    admin, acme, beta = make_key("ops", admin=True), api.client(make_key("acme")), api.client(make_key("beta"))
    write_adapter(tmp_path / "a", seed=1)
    register(api, admin, "acme-tone", tmp_path / "a", tenant="acme")

    # First line: the batch is refused at create with model_not_found, and so is the estimate.
    for models in (["acme-tone", "fake-model"], ["no-such-tone", "fake-model"]):
        with pytest.raises(openai.BadRequestError) as refused_estimate:
            estimate(beta, models)
        source = upload(beta, to_jsonl([chat_line(i, model=model) for i, model in enumerate(models)]))
        with pytest.raises(openai.BadRequestError) as refused_create:
            beta.batches.create(input_file_id=source.id, **BODY)  # type: ignore[arg-type]
        assert refused_estimate.value.body == refused_create.value.body
        assert isinstance(refused_create.value.body, dict) and refused_create.value.body["code"] == "model_not_found"

    # A later line: that line fails validation with mismatched_model, and the estimate names it.
    models = ["fake-model", "acme-tone", "no-such-tone", "fake-model"]
    found = estimate(beta, models)
    assert [(line, code) for line, code, _ in problems(found)] == [(2, "mismatched_model"), (3, "mismatched_model")]
    assert problems(found) == validated(beta, models)
    assert estimate(acme, models)["skipped_lines"] == 1  # acme may name its own adapter: only line 3 is bad


def test_a_tenant_budget_counts_every_adapter_line_of_the_file(api: LiveServer, tmp_path: Path) -> None:
    admin, client = make_key("ops", admin=True), api.client(make_key("acme"))
    write_adapter(tmp_path / "a", seed=1)
    register(api, admin, "tone", tmp_path / "a")
    api.client(admin).post(
        "/organization/budgets", body={"tenant": "acme", "monthly_budget_usd": "1500"}, cast_to=object
    )
    models = ["fake-model"] + ["tone"] * 15  # 16 lines x $100 = $1600 > $1500
    assert estimate(client, models, max_tokens=100)["requests"] == 16

    source = upload(client, to_jsonl([chat_line(i, model=model, max_tokens=100) for i, model in enumerate(models)]))
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=source.id, **BODY)  # type: ignore[arg-type]
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "budget_exceeded" and "$1600.000000" in error["message"]


@pytest.fixture
def llama_api(backend: Backend) -> Iterator[LiveServer]:
    (LLAMA_BASE / "config.json").write_text(json.dumps(DEMO_CONFIG))
    server, stop = start_server(with_worker=False)
    yield server
    stop()


@pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps(LLAMA_MODELS)})
def test_an_estimate_of_adapter_lines_weighs_their_lora_overhead(llama_api: LiveServer, tmp_path: Path) -> None:
    admin, client = make_key("ops", admin=True), llama_api.client(make_key("acme"))
    write_adapter(tmp_path / "a", seed=1)  # rank 8 on the seven projections
    register(llama_api, admin, "tonal", tmp_path / "a", base="llama")  # as long a name as "llama": the same bytes
    factor = adapter_factor(str(LLAMA_BASE), rank=8, targets=sorted(DEMO_SHAPES))
    assert factor > 1.005

    base = estimate(client, ["llama"] * 10, max_tokens=2000)
    tuned = estimate(client, ["tonal"] * 10, max_tokens=2000)
    mixed = estimate(client, ["llama", "tonal"] * 5, max_tokens=2000)

    assert base["requests"] == tuned["requests"] == 10 and tuned["model"] == "llama" and not tuned["problems"]
    assert tuned["job_seconds"] == pytest.approx(base["job_seconds"] * factor, rel=1e-3)
    assert mixed["job_seconds"] == pytest.approx(base["job_seconds"] * (1 + factor) / 2, rel=1e-3)
    compute = [float(found["cost"]["compute_usd"]) for found in (base, tuned)]
    assert compute[1] == pytest.approx(compute[0] * factor, rel=1e-3)
    assert tuned["cost"]["list_usd"] == base["cost"]["list_usd"]  # an adapter line is priced as a base line
