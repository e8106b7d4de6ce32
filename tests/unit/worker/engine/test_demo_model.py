"""The demo model's tokenizer and chat template: thinking and tool-call markers as single tokens that stay in the
decoded text (what vLLM's "deepseek_r1" and "hermes" parsers read), tools and tool turns rendered, thinking off
unless asked; and a demo model an older Backfill built is rebuilt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from worker.engine import demo_model
from worker.engine.demo_model import MARKER_FILE, MARKER_TOKENS, VOCAB_SIZE, _retire_outdated, _train_tokenizer

ASK = [{"role": "user", "content": "Weather?"}]


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return _train_tokenizer(extra_tokens=MARKER_TOKENS)


def test_the_markers_are_single_tokens_at_the_end_of_the_vocabulary_and_stay_in_the_text(tokenizer: Any) -> None:
    ids = [tokenizer.convert_tokens_to_ids(token) for token in MARKER_TOKENS]
    assert ids == list(range(VOCAB_SIZE - 4, VOCAB_SIZE)) and len(tokenizer) == VOCAB_SIZE
    text = 'a<think>b</think>c<tool_call>{"name": "f"}</tool_call>'
    encoded = tokenizer.encode(text, add_special_tokens=False)
    assert set(ids) <= set(encoded) and tokenizer.decode(encoded, skip_special_tokens=True) == text


def test_thinking_is_off_unless_asked_and_an_effort_other_than_none_turns_it_on(tokenizer: Any) -> None:
    def tail(**kwargs: Any) -> str:
        text = tokenizer.apply_chat_template(ASK, add_generation_prompt=True, tokenize=False, **kwargs)
        return str(text).rsplit("<|assistant|>\n", 1)[1]

    off, on = "<think>\n\n</think>\n\n", "<think>\n"
    assert tail() == off and tail(enable_thinking=False) == off and tail(reasoning_effort="none") == off
    assert tail(enable_thinking=True) == on and tail(reasoning_effort="low") == on
    assert tail(reasoning_effort="high", enable_thinking=False) == off


def test_tools_calls_and_results_are_rendered(tokenizer: Any) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    turns = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "18"}]
    text = tokenizer.apply_chat_template(turns, tools=[tool], add_generation_prompt=True, tokenize=False)
    assert json.dumps(tool) in text
    assert (
        '<|assistant|>\n<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call><|eos|>' in text
    )
    assert "<|tool|>\n18<|eos|>" in text
    plain = tokenizer.apply_chat_template(ASK, add_generation_prompt=True, tokenize=False)
    assert plain == "<|bos|><|user|>\nWeather?<|eos|>\n<|assistant|>\n<think>\n\n</think>\n\n"


def test_a_demo_model_of_an_older_version_is_moved_aside_for_a_rebuild(tmp_path: Path) -> None:
    old, current = tmp_path / "old", tmp_path / "current"
    for folder, version in ((old, None), (current, demo_model.VERSION)):
        folder.mkdir()
        facts = {"vocab_size": VOCAB_SIZE} | ({"version": version} if version else {})
        (folder / MARKER_FILE).write_text(json.dumps(facts))
    _retire_outdated(old)
    _retire_outdated(current)
    assert not old.exists() and (current / MARKER_FILE).is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["current"]


def test_the_embedded_default_serves_it_with_vllms_hermes_and_deepseek_r1_parsers(tmp_path: Path) -> None:
    from storage.settings import Settings

    spec = Settings(data_dir=tmp_path).served_models()["backfill-demo"]
    assert (spec.tool_parser, spec.reasoning_parser) == ("hermes", "deepseek_r1")


def test_every_demo_model_of_an_older_build_is_rebuilt_and_a_current_one_kept(tmp_path: Path) -> None:
    """The vision-language and moderation demo models (no version in their markers before the 32k context) too."""
    from worker.engine.demo_model import build_offline

    built: list[Path] = []

    def write(folder: Path) -> None:
        built.append(folder)
        (folder / "m.json").write_text(json.dumps({"version": 2}))

    path = tmp_path / "backfill-demo-vl"
    path.mkdir()
    (path / "m.json").write_text(json.dumps({"seed": 0}))  # an older build: no version
    build_offline(path, marker="m.json", write=write, version=2)
    build_offline(path, marker="m.json", write=write, version=2)
    assert len(built) == 1 and json.loads((path / "m.json").read_text()) == {"version": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["backfill-demo-vl"]
