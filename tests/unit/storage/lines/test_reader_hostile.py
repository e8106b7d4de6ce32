"""Hostile lines are per-line validation errors, never exceptions, and their echoes stay small (issue 14)."""

from __future__ import annotations

import json

import orjson

from storage.lines.reader import LineChecker, LineError, ParsedLine

CHAT = "/v1/chat/completions"


def line(body: object, *, custom_id: str = "r1", url: str = CHAT) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def deep(levels: int) -> str:
    """A chat body whose first message content nests `levels` lists deep (written by hand: json can't)."""
    return '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": ' + "[" * levels + "]" * levels + "}"


def check(raw: bytes, *, endpoint: str | None = CHAT, model: str | None = "m") -> ParsedLine | LineError | None:
    return LineChecker(endpoint=endpoint, max_requests=10, model=model).check(1, raw, max_line_bytes=1 << 24)


def test_a_body_nested_deeper_than_the_database_can_write_is_a_line_error() -> None:
    for levels in (253, 300, 1000):
        raw = b'{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": ' + deep(levels).encode()
        outcome = check(raw + b"}")
        assert isinstance(outcome, LineError), levels
        assert outcome.code == "too_deeply_nested" and outcome.param == "body" and outcome.line == 1


def test_a_tool_schema_nested_10000_deep_is_named_as_too_deep_not_as_bad_json() -> None:
    schema = '{"type": "object", "properties": {"a": ' * 10_000 + "{}" + "}}" * 10_000
    tool = '{"type": "function", "function": {"name": "f", "parameters": ' + schema + "}}"
    body = '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [' + tool + "]}"
    raw = b'{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": ' + body.encode() + b"}"
    outcome = check(raw)  # orjson itself stops at 1,024 levels
    assert isinstance(outcome, LineError) and outcome.code == "too_deeply_nested" and outcome.param == "body"
    assert outcome.message == "Line 1 nests deeper than 64 levels."


def test_a_body_of_ordinary_depth_is_accepted() -> None:
    raw = b'{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": ' + deep(20).encode()
    outcome = check(raw + b"}")
    assert isinstance(outcome, ParsedLine)
    orjson.dumps(outcome.body)  # what the queue's JSON column does with it


def test_an_integer_beyond_64_bits_is_a_line_error() -> None:
    for value in (2**63, 2**64 - 1):  # orjson reads larger ones (and any below -2^63) as floats: storable
        body = '{"model": "m", "messages": [], "max_tokens": ' + str(value) + "}"
        outcome = check(
            b'{"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": ' + body.encode() + b"}"
        )
        assert isinstance(outcome, LineError), value
        assert outcome.code == "integer_out_of_range" and outcome.param == "body"


def test_the_largest_64_bit_integers_are_accepted_and_sized_within_the_queue_columns() -> None:
    from storage.planning.shapes import output_limit

    outcome = check(line({"model": "m", "messages": [], "max_tokens": 2**63 - 1, "seed": -(2**63)}))
    assert isinstance(outcome, ParsedLine)
    assert output_limit(outcome.body, CHAT) <= 2**31 - 1  # max_output_tokens is a 32-bit column on Postgres


def test_text_a_database_cannot_store_is_a_line_error() -> None:
    nul = check(line({"model": "m", "messages": []}, custom_id="a\u0000b"))
    assert isinstance(nul, LineError) and nul.code == "invalid_custom_id"


def test_a_mismatched_url_or_model_echoes_at_most_a_few_hundred_characters() -> None:
    huge = "/v1/" + "x" * 1_000_000
    url_error = check(line({"model": "m"}, url=huge))
    assert isinstance(url_error, LineError) and url_error.code == "mismatched_url"
    assert len(url_error.message) < 600
    model_error = check(line({"model": "y" * 1_000_000}))
    assert isinstance(model_error, LineError) and model_error.code == "mismatched_model"
    assert len(model_error.message) < 600


def test_a_duplicate_custom_id_echo_is_capped() -> None:
    checker = LineChecker(endpoint=CHAT, max_requests=10, model="m")
    raw = line({"model": "m"}, custom_id="z" * 512)
    checker.check(1, raw, max_line_bytes=1 << 20)
    duplicate = checker.check(2, raw, max_line_bytes=1 << 20)
    assert isinstance(duplicate, LineError) and duplicate.code == "duplicate_custom_id"
    assert len(duplicate.message) < 400


def test_the_stored_problem_list_keeps_the_first_entries_and_counts_the_rest() -> None:
    from storage.lines.reader import ProblemList

    problems = ProblemList(limit=5)
    for number in range(1, 1001):
        problems.add(LineError(number, "invalid_json", f"Line {number} is not valid JSON."))
    stored = problems.to_json()
    assert len(stored) == 6
    assert [entry["line"] for entry in stored[:5]] == [1, 2, 3, 4, 5]
    summary = stored[-1]
    assert summary["code"] == "too_many_errors" and summary["line"] is None
    assert "995 more" in summary["message"] and "1,000" in summary["message"]
    assert problems.total == 1000 and len(json.dumps(stored)) < 2000
