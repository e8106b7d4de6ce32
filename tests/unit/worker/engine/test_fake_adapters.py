"""The fake engine runs lines under their LoRA adapters as the vLLM adapter does: each adapter answers its own way,
an adapter that cannot load fails only its lines, and swaps are counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from openai.types.chat import ChatCompletion

from tests.unit.worker.engine.test_fake import CHAT, drain
from worker.engine import EngineRequest
from worker.engine.demo_adapter import write_adapter
from worker.engine.fake import FakeEngine


def chat(request_id: str, adapter: str | None = None, path: Path | None = None) -> EngineRequest:
    body: dict[str, Any] = {"model": adapter or "fake-model", "messages": [{"role": "user", "content": "hi"}]}
    body["max_tokens"] = 6
    return EngineRequest(request_id, CHAT, body, adapter=adapter, adapter_path=None if path is None else str(path))


def test_each_adapter_answers_its_own_way_under_its_own_name(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_adapter(tmp_path / name, seed=1)
    engine = FakeEngine(max_num_seqs=8)
    for request in [chat("r"), chat("r-a", "a", tmp_path / "a"), chat("r-b", "b", tmp_path / "b")]:
        assert engine.add(request) is None
    done = drain(engine)
    answers = {rid: ChatCompletion.model_validate(result.body) for rid, (result, _) in done.items()}
    assert [answers[rid].model for rid in ("r", "r-a", "r-b")] == ["fake-model", "a", "b"]
    texts = {answers[rid].choices[0].message.content for rid in ("r", "r-a", "r-b")}
    assert len(texts) == 3
    assert engine.stats().extra["adapter_loads"] == 2


def test_an_adapter_that_cannot_load_fails_only_its_lines(tmp_path: Path) -> None:
    write_adapter(tmp_path / "good", seed=1)
    (tmp_path / "broken").mkdir()
    engine = FakeEngine()
    failed = engine.add(chat("bad", "broken", tmp_path / "broken"))
    gone = engine.add(chat("gone", "deleted", None))
    assert engine.add(chat("ok", "good", tmp_path / "good")) is None
    assert failed is not None and failed.status_code == 500 and failed.error_code == "adapter_load_failed"
    assert gone is not None and gone.status_code == 404 and gone.error_code == "adapter_not_found"
    assert drain(engine)["ok"][0].ok


def test_an_adapter_coming_back_after_leaving_the_batch_counts_a_swap(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_adapter(tmp_path / name, seed=1)
    engine = FakeEngine(max_num_seqs=1)
    for index, name in enumerate(["a", "a", "b"]):  # in flight together (queued counts): no swap
        engine.add(chat(f"r{index}", name, tmp_path / name))
    drain(engine)
    assert engine.stats().extra["adapter_swaps"] == 0
    engine.add(chat("again", "a", tmp_path / "a"))  # a left the engine and comes back: its slot is taken again
    drain(engine)
    assert engine.stats().extra["adapter_swaps"] == 1 and engine.stats().extra["adapter_loads"] == 2
