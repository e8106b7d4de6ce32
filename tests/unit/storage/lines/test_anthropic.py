"""The Anthropic create body streamed into internal JSONL lines (shape checks on the way), and result lines."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from anthropic.types.messages import MessageBatchIndividualResponse

from storage.errors import InvalidRequest, RequestTooLarge
from storage.lines.anthropic import RequestsReader, _ranges, result_line, unqueued_results
from storage.lines.reader import LineChecker, ParsedLine, iter_lines


def request(custom_id: str, model: str = "m", **params: Any) -> dict[str, Any]:
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi \u00e9\U0001f600"}], **params}
    return {"custom_id": custom_id, "params": body}


def reader(**limits: int) -> RequestsReader:
    return RequestsReader(
        max_requests=limits.get("max_requests", 100),
        max_request_bytes=limits.get("max_request_bytes", 10_000),
        max_body_bytes=limits.get("max_body_bytes", 10_000_000),
    )


def chunked(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def read(body: Any, *, chunk: int = 7, **limits: int) -> tuple[RequestsReader, bytes]:
    it = reader(**limits)
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    out = b"".join(it.lines(chunked(data, chunk)))
    it.raise_if_bad()
    return it, out


def test_requests_stream_into_lines_that_the_one_line_checker_accepts() -> None:
    body = {"requests": [request("a-1"), request("b_2", model="other"), request("c", temperature=0.5)]}
    it, out = read(body, chunk=5)  # chunks cut through keys, strings and multi-byte characters
    assert (it.count, it.first_model, it.mixed_models) == (3, "m", True)
    checker = LineChecker(endpoint="/v1/messages", max_requests=10, one_model=False)
    parsed = [checker.check(n, raw, max_line_bytes=10_000) for n, raw in iter_lines([out], max_line_bytes=10_000)]
    assert all(isinstance(p, ParsedLine) for p in parsed)
    assert [(p.custom_id, p.model, p.url) for p in parsed] == [  # type: ignore[union-attr]
        ("a-1", "m", "/v1/messages"),
        ("b_2", "other", "/v1/messages"),
        ("c", "m", "/v1/messages"),
    ]
    assert parsed[2].body["temperature"] == 0.5 and parsed[0].body["messages"][0]["content"] == "Hi \u00e9\U0001f600"  # type: ignore[union-attr]


def test_one_model_is_not_mixed() -> None:
    it, _ = read({"requests": [request("a"), request("b")]})
    assert (it.first_model, it.mixed_models) == ("m", False)


def test_every_bad_request_is_named_by_index_in_one_error() -> None:
    bad = [
        request("ok-0"),
        request("has space"),
        request("x" * 65),
        request("ok-0"),  # duplicate
        {"custom_id": "no-params"},
        request("no-model", model=""),
        request("zero", max_tokens=0),
        request("nomsg", messages=[]),
        {**request("extra"), "method": "POST"},
        "not an object",
        request("ok-10"),
    ]
    with pytest.raises(InvalidRequest) as caught:
        read({"requests": bad})
    message = caught.value.message
    assert "9 invalid requests (indices 1-9)" in message
    for expected in (
        "requests.1.custom_id: must match ^[a-zA-Z0-9_-]{1,64}$",
        "requests.2.custom_id",
        "requests.3.custom_id: duplicate custom_id 'ok-0' (also requests.0)",
        "requests.4.params: Field required",
        "requests.5.params.model",
        "requests.6.params.max_tokens",
        "requests.7.params.messages",
        "requests.8.method: Extra inputs are not permitted",
        "requests.9: must be an object",
    ):
        assert expected in message


def test_a_message_that_is_not_an_object_fails_the_create_as_the_schema_says() -> None:
    """Found by `make fuzz`: a message given as a list was accepted (200), against the create body's schema."""
    ok = {"role": "user", "content": "hi"}
    with pytest.raises(InvalidRequest) as caught:
        read({"requests": [request("a", messages=[ok, ["user", "hi"]]), request("b", messages=["hi"]), request("c")]})
    message = caught.value.message
    assert "2 invalid requests (indices 0-1)" in message
    assert "requests.0.params.messages.1: must be an object with role and content" in message
    assert "requests.1.params.messages.0: must be an object" in message


def test_only_the_first_problems_are_spelled_out_but_every_index_is_listed() -> None:
    with pytest.raises(InvalidRequest) as caught:
        read({"requests": [request(f"bad id {i}") for i in range(30)] + [request("fine")] + [request("bad id 99")]})
    assert "31 invalid requests (indices 0-29, 31)" in caught.value.message and "; and 11 more" in caught.value.message


@pytest.mark.parametrize(
    "body", [{"requests": []}, {"other": 1}, [request("a")], {"requests": {"custom_id": "a"}}], ids=str
)
def test_a_body_without_requests_says_how_to_send_them(body: Any) -> None:
    with pytest.raises(InvalidRequest, match="requests: List should have at least 1 item"):
        read(body)


def test_a_body_that_is_not_json_is_a_400() -> None:
    with pytest.raises(InvalidRequest, match="not valid JSON"):
        read(b'{"requests": [{"custom_id": "a", "params": {]}')


def test_limits_on_requests_bytes_and_one_request() -> None:
    with pytest.raises(InvalidRequest, match="at most 2 requests"):
        read({"requests": [request("a"), request("b"), request("c")]}, max_requests=2)
    with pytest.raises(RequestTooLarge, match="maximum size of 100 bytes"):
        read({"requests": [request("a"), request("b")]}, max_body_bytes=100)
    with pytest.raises(InvalidRequest, match=r"requests\.1: larger than 300 bytes"):
        read({"requests": [request("a"), request("b", system="s" * 400)]}, max_request_bytes=300)


def test_no_line_is_written_once_a_request_is_bad() -> None:
    it = reader()
    out = b"".join(it.lines([orjson.dumps({"requests": [request("bad id"), request("fine")]})]))
    assert out == b"" and len(it.problems) == 1


def test_ranges_compress_runs() -> None:
    assert _ranges([0, 1, 2, 3, 7, 9, 10]) == "0-3, 7, 9-10" and _ranges([5]) == "5"


def message(text: str = "Hi") -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "m",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1},
    }


@pytest.mark.parametrize(
    ("row", "kind", "error_type"),
    [
        ((200, message(), None, None), "succeeded", None),
        (
            (400, {"error": {"message": "x"}}, "unsupported_parameter", "tools: not supported"),
            "errored",
            "invalid_request_error",
        ),
        ((404, None, "model_not_found", "model: 'nope' is not served here"), "errored", "not_found_error"),
        ((500, None, "engine_error", "The request was interrupted 3 times"), "errored", "api_error"),
        ((None, None, "batch_cancelled", "The batch was cancelled"), "canceled", None),
        ((None, None, "batch_expired", "not executed in time"), "expired", None),
    ],
)
def test_each_result_type_parses_as_the_sdk_types_it(row: tuple[Any, ...], kind: str, error_type: str | None) -> None:
    line = result_line("batch_req_1", "c1", *row)
    parsed = MessageBatchIndividualResponse.model_validate(json.loads(orjson.dumps(line)))
    assert parsed.custom_id == "c1" and parsed.result.type == kind
    if error_type is not None:
        assert parsed.result.error.error.type == error_type  # type: ignore[union-attr]
        assert parsed.result.error.error.message == row[3]  # type: ignore[union-attr]


def test_a_batch_refused_before_queueing_reports_each_request_errored_with_the_refusal() -> None:
    _, out = read({"requests": [request("a"), request("b")]})
    refusal = {"code": "token_limit_exceeded", "message": "Enqueued token limit reached"}
    lines = [
        json.loads(x)
        for x in b"".join(
            unqueued_results([out], outcome="errored", refusal=refusal, max_line_bytes=10_000)
        ).splitlines()
    ]
    parsed = [MessageBatchIndividualResponse.model_validate(line) for line in lines]
    assert [p.custom_id for p in parsed] == ["a", "b"]
    assert all(p.result.error.error.type == "rate_limit_error" for p in parsed)  # type: ignore[union-attr]
    cancelled = b"".join(unqueued_results([out], outcome="canceled", refusal=None, max_line_bytes=10_000))
    assert [json.loads(x)["result"] for x in cancelled.splitlines()] == [{"type": "canceled"}] * 2


def test_a_checked_message_result_carries_its_attempts_beside_the_result() -> None:
    from storage.lines.anthropic import result_line

    attempts = {"count": 3, "failed": [{"attempt": i, "check": "schema", "message": "x"} for i in (1, 2, 3)]}
    line = result_line("r", "a", 422, {"content": []}, "checks_failed", "Every one of 3 answers failed", attempts)
    assert line["attempts"] == attempts and line["result"]["type"] == "errored"
    assert line["result"]["error"]["error"]["message"] == "Every one of 3 answers failed"
