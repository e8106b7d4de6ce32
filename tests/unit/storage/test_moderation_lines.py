"""`/v1/moderations` in the registry and on the ingest path: a classifier serves it (and only it), a line that names
no model runs on the registry's moderation model, and its lines ask for no output tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from storage.endpoints import CHAT_URL, EMBEDDINGS_URL, MODERATIONS_URL, RESPONSES_URL
from storage.lines.reader import LineChecker, LineError, ParsedLine, peek_model
from storage.planning.shapes import request_size, shape_of_jsonl
from storage.protocols import OPENAI
from storage.registry import STRUCTURED_OUTPUTS, ModelSpec
from storage.settings import Settings

CLASSIFIER = {"path": "/m/clf", "runner": "pooling", "convert": "classify"}


def line(url: str = MODERATIONS_URL, custom_id: str = "a", **body: Any) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).encode()


def test_moderations_is_one_of_openais_batch_endpoints() -> None:
    assert MODERATIONS_URL in OPENAI.endpoints


@pytest.mark.parametrize(
    ("spec", "serves"),
    [
        ({"path": "/m/chat"}, {CHAT_URL, RESPONSES_URL}),
        ({"path": "/m/embed", "runner": "pooling"}, {EMBEDDINGS_URL}),
        ({"path": "/m/embed", "runner": "pooling", "convert": "embed"}, {EMBEDDINGS_URL}),
        (CLASSIFIER, {MODERATIONS_URL}),
    ],
)
def test_a_model_serves_the_endpoints_of_what_it_computes(spec: dict[str, Any], serves: set[str]) -> None:
    model = ModelSpec.model_validate(spec)
    assert {url for url in (CHAT_URL, RESPONSES_URL, EMBEDDINGS_URL, MODERATIONS_URL) if model.serves(url)} == serves


def test_convert_needs_a_pooling_runner_and_a_known_task() -> None:
    with pytest.raises(ValidationError, match="convert needs runner 'pooling'"):
        ModelSpec(path="/m", convert="classify")
    with pytest.raises(ValidationError, match="convert must be 'embed' or 'classify'"):
        ModelSpec(path="/m", runner="pooling", convert="reward")


def test_the_structured_outputs_choice_is_one_default_an_entry_may_replace() -> None:
    assert ModelSpec(path="/m").engine_extra()["structured_outputs_config"] == STRUCTURED_OUTPUTS
    assert STRUCTURED_OUTPUTS["backend"] == "guidance"
    own = ModelSpec(path="/m", extra={"structured_outputs_config": {"backend": "xgrammar"}}).engine_extra()
    assert own["structured_outputs_config"] == {"backend": "xgrammar"}
    assert ModelSpec.model_validate(CLASSIFIER).engine_extra() == {"convert": "classify"}


def test_the_default_moderation_model_is_the_setting_else_the_first_classifier(tmp_path: Path) -> None:
    models = {"chat": {"path": "/m/chat"}, "clf-a": CLASSIFIER, "clf-b": CLASSIFIER}
    assert Settings(data_dir=tmp_path, models=models).default_models() == {MODERATIONS_URL: "clf-a"}
    chosen = Settings(data_dir=tmp_path, models=models, moderation_model="clf-b")
    assert chosen.default_models() == {MODERATIONS_URL: "clf-b"}
    assert Settings(data_dir=tmp_path, models={"chat": {"path": "/m/chat"}}).default_models() == {}
    embedded = Settings(data_dir=tmp_path)  # the embedded default serves the demo classifier
    assert embedded.default_models() == {MODERATIONS_URL: "backfill-demo-moderation"}


def test_a_moderation_model_that_does_not_classify_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="BACKFILL_MODERATION_MODEL='chat' is not a served classifier"):
        Settings(data_dir=tmp_path, models={"chat": {"path": "/m/chat"}}, moderation_model="chat")


def test_a_moderation_line_without_a_model_runs_on_the_default_one() -> None:
    checker = LineChecker(endpoint=MODERATIONS_URL, max_requests=10, default_models={MODERATIONS_URL: "clf"})
    first = checker.check(1, line(input="hello"), max_line_bytes=10_000)
    second = checker.check(2, line(custom_id="b", model="clf", input="x"), max_line_bytes=10_000)
    assert isinstance(first, ParsedLine) and first.model == "clf" and "model" not in first.body
    assert isinstance(second, ParsedLine) and checker.model == "clf"
    other = checker.check(3, line(custom_id="c", model="omni-moderation-latest", input="x"), max_line_bytes=10_000)
    assert isinstance(other, LineError) and other.code == "mismatched_model"  # one batch, one model
    assert peek_model([line(input="x")], max_line_bytes=10_000, default_models={MODERATIONS_URL: "clf"}) == "clf"


def test_other_lines_still_need_their_model() -> None:
    checker = LineChecker(endpoint=CHAT_URL, max_requests=10, default_models={MODERATIONS_URL: "clf"})
    missing = checker.check(1, line(CHAT_URL, messages=[]), max_line_bytes=10_000)
    assert isinstance(missing, LineError) and missing.code == "missing_required_parameter"
    lone = LineChecker(endpoint=MODERATIONS_URL, max_requests=10)  # no classifier served: nothing to default to
    refused = lone.check(1, line(input="x"), max_line_bytes=10_000)
    assert isinstance(refused, LineError) and refused.param == "body.model"


def test_moderation_lines_ask_for_no_output_tokens() -> None:
    assert request_size(MODERATIONS_URL, {"input": "x", "max_tokens": 99}, line_bytes=400) == (100, 0)
    shape = shape_of_jsonl(
        [line(input="hello") + b"\n" + line(custom_id="b", input="there")],
        max_line_bytes=10_000,
        max_requests=10,
        default_models={MODERATIONS_URL: "clf"},
    )
    assert (shape.requests, shape.output_tokens, shape.model) == (2, 0, "clf")
