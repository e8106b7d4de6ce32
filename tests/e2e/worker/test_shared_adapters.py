"""LoRA adapters in shared mode end to end (docs/adapters.md, "Shared mode"): a real `vllm serve` of the demo model
with LoRA on (`--enable-lora`, one adapter from `--lora-modules`, run-time loading allowed) and Backfill's API and
worker driving it. One batch, through the official SDK, names both adapters and the base: the server's own module,
and an adapter registered with Backfill (from uploaded files) that the server loads at run time; each answer equals
what the server gives for that adapter directly (greedy), and a line naming an adapter that cannot be loaded fails
alone with `adapter_load_failed`."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from bench import vllm_server as server_process
from tests.conftest import configure, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for
from worker.engine.demo_adapter import build_demo_adapter

pytestmark = pytest.mark.vllm

SERVED_NAME = "demo-online"
PROMPTS = ["def f(x):", "import os\n", "class Point:"]
MAX_TOKENS = 10
STATIC = "demo-static"  # on the server from its start (--lora-modules)
REGISTERED = "demo-registered"  # registered with Backfill; the server loads it when a line first names it


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("adapters")
    return {STATIC: build_demo_adapter(folder / STATIC, seed=1), REGISTERED: build_demo_adapter(folder / "r", seed=2)}


@pytest.fixture(scope="module")
def lora_server(
    demo_model_path: Path, adapters: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`vllm serve` on the demo model, priority scheduling, LoRA on with run-time loading, a free port. Two LoRA
    slots, both taken by adapter lines: on CPU a base line sharing a step with them would read the last slot's
    adapter (docs/adapters.md), which `base_lines_under_zero_adapter` prevents."""
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    lora = ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8"]  # two slots: both taken by adapter lines
    lora += ["--lora-modules", f"{STATIC}={adapters[STATIC]}"]
    try:
        proc, url = server_process.start(
            demo_model_path, served_name=SERVED_NAME, max_num_seqs=8, max_model_len=1024, log=log,
            extra_args=lora, extra_env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
        )  # fmt: skip
    except server_process.ServerFailed as error:
        pytest.fail(str(error))
    try:
        yield url
    finally:
        server_process.stop(proc)


def line(custom_id: str, model: str, prompt: str) -> dict[str, object]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS}
    body |= {"temperature": 0, "ignore_eos": True}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def direct(url: str, model: str, prompt: str) -> str:
    """The server's own greedy answer under `model` (its base or one of its LoRA modules), asked alone."""
    body = line("-", model, prompt)["body"]
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])


def register_from_files(base_url: str, admin: str, folder: Path, *, name: str) -> httpx.Response:
    client = openai.OpenAI(api_key=admin, base_url=f"{base_url}/v1", max_retries=0)
    ids = {}
    for part, file in (("config", "adapter_config.json"), ("weights", "adapter_model.safetensors")):
        data = io.BytesIO((folder / file).read_bytes())
        ids[part] = client.files.create(file=(file, data), purpose="adapter").id  # type: ignore[arg-type]
    body = {"name": name, "base_model": "backfill-demo", "files": ids}
    return httpx.post(f"{base_url}/v1/adapters", json=body, headers={"Authorization": f"Bearer {admin}"})


def test_a_batch_naming_two_adapters_and_the_base_answers_each_as_the_shared_server_does_directly(
    demo_model_path: Path,
    adapters: dict[str, Path],
    lora_server: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base_answers = {prompt: direct(lora_server, SERVED_NAME, prompt) for prompt in PROMPTS}  # before any adapter ran
    shared = {"server_url": lora_server, "poll_seconds": 0.1, "base_lines_under_zero_adapter": True}
    spec = {"path": str(demo_model_path), "max_num_seqs": 8, "max_lora_rank": 8, "shared": shared,
            "adapters": {STATIC: str(adapters[STATIC]), "demo-broken": str(tmp_path / "no-such-folder")}}  # fmt: skip
    configure(
        monkeypatch,
        {"BACKFILL_DATA_DIR": str(tmp_path / "data"), "BACKFILL_MODELS": json.dumps({"backfill-demo": spec})},
    )
    from worker.cli.migrate import migrate_database

    migrate_database()
    server, stop = start_server(with_worker=True)
    try:
        admin, client = make_key("ops", admin=True), server.client(make_key("acme"))
        made = register_from_files(server.base_url, admin, adapters[REGISTERED], name=REGISTERED)
        assert made.status_code == 200, made.text
        names = ["backfill-demo", STATIC, REGISTERED]
        lines = [line(f"{name}|{i}", name, prompt) for i, prompt in enumerate(PROMPTS) for name in names]
        lines.append(line("broken", "demo-broken", PROMPTS[0]))
        source = upload(client, to_jsonl(lines))
        batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
        done = wait_for(client, batch.id, timeout=600)
        got = {row["custom_id"]: row["response"]["body"] for row in read_lines(client, done.output_file_id)}
        errors = {row["custom_id"]: row["response"] for row in read_lines(client, done.error_file_id)}
    finally:
        stop()

    assert done.status == "completed" and done.request_counts.completed == len(lines) - 1
    assert list(errors) == ["broken"] and errors["broken"]["status_code"] == 500
    error = errors["broken"]["body"]["error"]
    assert (
        error["code"] == "adapter_load_failed" and "The adapter 'demo-broken' could not be loaded" in error["message"]
    )

    listed = {card["id"]: card for card in httpx.get(f"{lora_server}/v1/models", timeout=10).json()["data"]}
    assert listed[REGISTERED]["parent"] == SERVED_NAME  # loaded at run time, from its registered copy
    assert Path(listed[REGISTERED]["root"]).is_relative_to(tmp_path / "data")
    expected = {("backfill-demo", p): base_answers[p] for p in PROMPTS}
    expected |= {(name, p): direct(lora_server, name, p) for name in (STATIC, REGISTERED) for p in PROMPTS}
    answers = {(name, p): got[f"{name}|{i}"] for i, p in enumerate(PROMPTS) for name in names}
    assert {key: body["model"] for key, body in answers.items()} == {key: key[0] for key in answers}
    texts = {key: body["choices"][0]["message"]["content"] for key, body in answers.items()}
    for prompt in PROMPTS:
        assert len({texts[(name, prompt)] for name in names}) == len(names)  # every adapter answers its own way
    assert texts == expected
