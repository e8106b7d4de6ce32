"""`/v1/moderations` lines: the body's input shapes (a string, strings, text and image parts) and OpenAI's answer,
re-parsed with the SDK's `ModerationCreateResponse`."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types import ModerationCreateResponse

from worker.engine.generation import Output
from worker.engine.wire import parse
from worker.engine.wire.base import BodyError
from worker.engine.wire.openai.moderations import CATEGORIES, FLAG_THRESHOLD, MAX_INPUTS

URL = "/v1/moderations"


def inputs(body: dict[str, Any]) -> tuple[Any, ...]:
    generation = parse(URL, body).generation
    assert generation.kind == "classify"
    return generation.inputs


def test_a_string_a_list_of_strings_and_text_parts_are_classified_as_openai_reads_them() -> None:
    assert inputs({"input": "I will hurt you"}) == ("I will hurt you",)
    assert inputs({"model": "omni-moderation-latest", "input": ["a", "b", "c"]}) == ("a", "b", "c")
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    assert inputs({"input": parts}) == ("first\nsecond",)  # an array of parts is one input, one result


def test_an_input_with_images_is_one_user_turn_of_its_parts_whose_images_the_media_resolver_fetches() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    parts = [{"type": "text", "text": "Describe this image"}, image]
    generation = parse(URL, {"model": "omni-moderation-latest", "input": parts}).generation
    assert generation.kind == "classify" and generation.inputs == ()
    assert generation.messages == ({"role": "user", "content": parts},)
    assert generation.needs_media() and generation.where == "input"  # fetched as a chat's images are


@pytest.mark.parametrize(
    ("body", "code", "says"),
    [
        ({"input": 3}, "invalid_value", "must be a string, an array of strings, or an array of"),
        ({"input": ["a", {"type": "text", "text": "b"}]}, "invalid_value", "must be a string, an array of strings"),
        ({"input": []}, "invalid_value", "input must not be empty"),
        ({"input": ["x"] * (MAX_INPUTS + 1)}, "invalid_value", f"at most {MAX_INPUTS} strings"),
        ({"input": "x", "temperature": 0}, "unsupported_parameter", "'temperature'"),
        ({}, "missing_required_parameter", "'input'"),
    ],
)
def test_what_cannot_run_is_that_lines_clear_error(body: dict[str, Any], code: str, says: str) -> None:
    with pytest.raises(BodyError) as refused:
        parse(URL, body)
    assert refused.value.code == code and says in refused.value.message and refused.value.status_code == 400


def test_the_answer_is_openais_moderation_response_with_every_category() -> None:
    parsed = parse(URL, {"input": ["calm", "angry"]})
    low = dict.fromkeys(CATEGORIES, 0.01)
    high = {**low, "violence": 0.97, "hate": FLAG_THRESHOLD, "some-other-label": 0.99}
    output = Output("r1", response_id="abc", prompt_tokens=9, scores=[low, high])
    result = parsed.answer(output, "backfill-demo-moderation")
    assert result.ok and result.prompt_tokens == 9 and result.completion_tokens == 0  # billed as input only
    answer = ModerationCreateResponse.model_validate(result.body)
    assert answer.id == "modr-abc" and answer.model == "backfill-demo-moderation" and len(answer.results) == 2
    calm, angry = answer.results
    assert not calm.flagged and not any(calm.categories.model_dump().values())
    assert angry.flagged and angry.categories.violence and angry.categories.hate and not angry.categories.sexual
    assert angry.category_scores.violence == pytest.approx(0.97)
    assert set(result.body["results"][1]["category_scores"]) == set(CATEGORIES)  # labels it does not know dropped
    assert angry.category_applied_input_types.violence == ["text"]


def test_a_category_the_model_lacks_scores_zero_and_is_not_flagged() -> None:
    output = Output("r1", prompt_tokens=1, scores=[{"violence": 0.9}])
    answer = ModerationCreateResponse.model_validate(parse(URL, {"input": "x"}).answer(output, "m").body)
    assert answer.results[0].category_scores.harassment == 0.0 and not answer.results[0].categories.harassment
    assert answer.results[0].flagged


@pytest.mark.parametrize(
    ("parts", "applied"),
    [
        ([{"type": "text", "text": "t"}], {"violence": ["text"], "hate": ["text"]}),
        ([{"type": "text", "text": "t"}, "image"], {"violence": ["text", "image"], "hate": ["text"]}),
        (["image"], {"violence": ["image"], "hate": [], "self-harm/intent": ["image"]}),
    ],
)
def test_each_category_names_the_input_types_it_was_applied_to_as_openai_does(
    parts: list[Any], applied: dict[str, list[str]]
) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"input": [image if part == "image" else part for part in parts]}
    result = parse(URL, body).answer(Output("r1", prompt_tokens=3, scores=[{"violence": 0.9}]), "m")
    answer = ModerationCreateResponse.model_validate(result.body)
    types = answer.results[0].category_applied_input_types.model_dump(by_alias=True)
    assert {category: types[category] for category in applied} == applied
