"""LoRA adapters in shared mode against a scripted fake of vLLM's server (docs/adapters.md, "Shared mode"): a line
naming an adapter goes out under the adapter's name; the server's own LoRA modules are used as they are, a
registered adapter it lacks is loaded once through `/v1/load_lora_adapter`, and an adapter it cannot load fails
its own lines only. A real `vllm serve` is in tests/e2e/worker/test_shared_adapters.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletion

from storage.registry import ModelSpec, SharedModeSpec
from worker.engine import EngineRequest, EngineResult, http_calls
from worker.engine.http_adapters import ZERO_ADAPTER
from worker.engine.http_engine import HttpEngine

CHAT = "/v1/chat/completions"
METRICS = ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
DEMO_CONFIG = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
               "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 4096}  # fmt: skip


class LoraServer:
    """vLLM's server with --enable-lora: `static` from --lora-modules; run-time loads when `runtime` is on."""

    def __init__(self, *, runtime: bool = True, static: dict[str, str] | None = None) -> None:
        self.runtime = runtime
        self.loras: dict[str, str] = dict(static or {})
        self.loads: list[dict[str, Any]] = []
        self.bodies: list[dict[str, Any]] = []

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            cards = [{"id": "served-name", "max_model_len": 1024, "root": "/models/demo"}]
            cards += [{"id": name, "root": path, "parent": "served-name"} for name, path in self.loras.items()]
            return httpx.Response(200, json={"object": "list", "data": cards})
        if request.url.path == "/metrics":
            text = "".join(f'vllm:{name}{{engine="0"}} 0\n' for name in METRICS)
            return httpx.Response(200, text=text)
        payload = json.loads(await request.aread())
        if request.url.path == "/v1/load_lora_adapter":
            return self._load(payload)
        self.bodies.append(payload)
        model = payload["model"]
        if model != "served-name" and model not in self.loras:  # as vLLM answers an unknown model
            error = {"message": f"The model `{model}` does not exist.", "type": "NotFoundError", "code": 404}
            return httpx.Response(404, json={"error": error})
        choice = {"index": 0, "message": {"role": "assistant", "content": f"by {model}"}, "finish_reason": "length"}
        usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        answer = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": model, "choices": [choice]}
        return httpx.Response(200, json={**answer, "usage": usage})

    def _load(self, payload: dict[str, Any]) -> httpx.Response:
        if not self.runtime:  # VLLM_ALLOW_RUNTIME_LORA_UPDATING off: the route does not exist
            return httpx.Response(404, json={"detail": "Not Found"})
        self.loads.append(payload)
        name, path = payload["lora_name"], payload["lora_path"]
        if name in self.loras and not payload.get("load_inplace"):
            message = f"The lora adapter '{name}' has already been loaded."
            return httpx.Response(400, json={"error": {"message": message, "type": "BadRequestError", "code": 400}})
        if not (Path(path) / "adapter_config.json").is_file():
            message = f"Loading lora {name} failed: No adapter found for {path}"
            return httpx.Response(404, json={"error": {"message": message, "type": "NotFoundError", "code": 404}})
        self.loras[name] = path
        return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")


def start(server: LoraServer, *, path: str = "served-elsewhere", **shared: Any) -> HttpEngine:
    knobs = {"server_url": "http://fake", "poll_seconds": 0.01, "min_inflight": 8, **shared}
    spec = ModelSpec(path=path, max_num_seqs=8, enable_lora=True, shared=SharedModeSpec(**knobs))
    return HttpEngine("backfill-demo", spec, transport=httpx.MockTransport(server.handle))


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_calls, "RETRY_BASE_SECONDS", 0.01)


def chat(request_id: str, adapter: str | None = None, path: Path | str | None = None) -> EngineRequest:
    body = {"model": adapter or "backfill-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    return EngineRequest(request_id, CHAT, body, adapter=adapter, adapter_path=None if path is None else str(path))


def run(engine: HttpEngine, requests: list[EngineRequest]) -> dict[str, EngineResult]:
    results: list[EngineResult] = []
    try:
        for request in requests:
            refused = engine.add(request)
            results += [] if refused is None else [refused]
        until = time.monotonic() + 10
        while engine.has_unfinished():
            assert time.monotonic() < until, "the engine never finished"
            results.extend(engine.step())
    finally:
        engine.close()
    assert len(results) == len(requests)  # one result each
    return {result.request_id: result for result in results}


def adapter_folder(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}')
    return folder


def text_and_model(result: EngineResult) -> tuple[str | None, str]:
    body = ChatCompletion.model_validate(result.body)
    return body.choices[0].message.content, body.model


def test_each_line_runs_under_its_adapter_and_a_missing_one_is_loaded_once(tmp_path: Path) -> None:
    server = LoraServer(static={"static-tone": "/server/static-tone"})
    fresh = adapter_folder(tmp_path, "fresh-tone")
    engine = start(server)
    requests = [chat("base"), chat("static", "static-tone", "/server/static-tone")]
    requests += [chat(f"fresh-{i}", "fresh-tone", fresh) for i in range(5)]

    results = run(engine, requests)

    assert text_and_model(results["base"]) == ("by served-name", "backfill-demo")
    assert text_and_model(results["static"]) == ("by static-tone", "static-tone")  # the server's own module
    assert {text_and_model(results[f"fresh-{i}"]) for i in range(5)} == {("by fresh-tone", "fresh-tone")}
    assert server.loads == [{"lora_name": "fresh-tone", "lora_path": str(fresh), "load_inplace": False}]  # once
    assert {body["priority"] for body in server.bodies} == {1_000_000}
    stats = engine.stats().extra
    assert (stats["adapter_loads"], stats["adapters_in_flight"], stats["adapters_seen"]) == (1, 0, 2)


def test_an_adapter_the_server_cannot_load_fails_its_own_lines_only(tmp_path: Path) -> None:
    server = LoraServer()
    good = adapter_folder(tmp_path, "good")
    engine = start(server)

    results = run(engine, [chat("a", "broken", tmp_path / "missing"), chat("b", "good", good), chat("c"),
                           chat("d", "broken", tmp_path / "missing")])  # fmt: skip

    for rid in ("a", "d"):
        assert results[rid].status_code == 500 and results[rid].error_code == "adapter_load_failed"
        assert "The adapter 'broken' could not be loaded" in (results[rid].error_message or "")
        assert "No adapter found for" in (results[rid].error_message or "")  # the server's reason
    assert results["b"].status_code == results["c"].status_code == 200
    assert [load["lora_name"] for load in server.loads].count("broken") == 1  # remembered: not asked per line


def test_a_server_without_run_time_loading_says_how_to_start_it_and_its_own_modules_still_run(tmp_path: Path) -> None:
    server = LoraServer(runtime=False, static={"static-tone": "/server/static-tone"})
    engine = start(server)

    results = run(
        engine,
        [
            chat("new", "new-tone", adapter_folder(tmp_path, "new-tone")),
            chat("s", "static-tone", "/server/static-tone"),
        ],
    )

    assert results["new"].error_code == "adapter_load_failed"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in (results["new"].error_message or "")
    assert text_and_model(results["s"]) == ("by static-tone", "static-tone")


def test_an_adapter_the_server_lost_is_loaded_again_and_the_line_answered_once(tmp_path: Path) -> None:
    server = LoraServer()
    folder = adapter_folder(tmp_path, "tone")
    engine = start(server)
    engine.lora.known["tone"] = str(folder)  # the server had it, then restarted without it

    results = run(engine, [chat("r", "tone", folder)])

    assert text_and_model(results["r"]) == ("by tone", "tone")
    assert [body["model"] for body in server.bodies] == ["tone", "tone"] and len(server.loads) == 1


def test_a_deleted_adapter_fails_without_a_call(tmp_path: Path) -> None:
    server = LoraServer()
    results = run(start(server), [chat("r", "gone", None)])
    assert (results["r"].status_code, results["r"].error_code) == (404, "adapter_not_found")
    assert server.bodies == [] and server.loads == []


def test_adapter_folders_are_sent_as_the_server_mounts_them(tmp_path: Path) -> None:
    server = LoraServer()
    folder = adapter_folder(tmp_path, "tone")
    mounted = {str(tmp_path): "/mnt/backfill"}
    results = run(start(server, adapter_path_map=mounted), [chat("r", "tone", folder)])
    assert server.loads == [{"lora_name": "tone", "lora_path": "/mnt/backfill/tone", "load_inplace": False}]
    assert results["r"].error_code == "adapter_load_failed"  # the fake server cannot read /mnt: its reason is kept


def test_base_lines_can_run_under_a_zero_adapter_loaded_on_the_server(tmp_path: Path) -> None:
    server = LoraServer()
    (tmp_path / "config.json").write_text(json.dumps(DEMO_CONFIG))
    engine = start(server, path=str(tmp_path), base_lines_under_zero_adapter=True)

    results = run(engine, [chat("base")])

    assert [load["lora_name"] for load in server.loads] == [ZERO_ADAPTER]
    assert server.bodies[0]["model"] == ZERO_ADAPTER
    assert text_and_model(results["base"])[1] == "backfill-demo"  # answered under the base's name
    with pytest.raises(RuntimeError, match=r"config\.json"):
        start(LoraServer(), base_lines_under_zero_adapter=True)


def test_another_adapter_the_server_serves_under_the_name_is_not_used_and_a_re_registered_one_is_reloaded(
    tmp_path: Path,
) -> None:
    server = LoraServer(static={"their-tone": "/server/their-tone"})
    first, second = adapter_folder(tmp_path, "first"), adapter_folder(tmp_path, "second")
    engine = start(server)

    results = run(engine, [chat("theirs", "their-tone", "/backfill/their-tone"), chat("r1", "tone", first)])
    engine = start(server)
    engine.lora.known["tone"], engine.lora._ours = str(first), {"tone"}  # as this worker left it
    results |= run(engine, [chat("r2", "tone", second)])  # "tone" deleted and registered again, new files

    assert results["theirs"].error_code == "adapter_load_failed"  # never the wrong weights
    assert "serves another adapter under the name 'their-tone'" in (results["theirs"].error_message or "")
    assert [load["lora_name"] for load in server.loads] == ["tone", "tone"]
    assert server.loads[1] == {"lora_name": "tone", "lora_path": str(second), "load_inplace": True}
    assert server.loras["tone"] == str(second) and results["r2"].status_code == 200
