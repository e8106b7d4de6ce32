"""OpenAI's result lines: what finalize writes parses as the SDK's `BatchResultLine`, success or error."""

from __future__ import annotations

import orjson

from storage.lines.openai import BatchResultLine, result_line


def test_a_succeeded_request_becomes_a_response_line_without_an_error() -> None:
    body = {"id": "chatcmpl-1", "choices": [{"message": {"content": "hi"}}]}
    line = BatchResultLine.model_validate_json(orjson.dumps(result_line("batch_req_1", "c1", 200, body, None, None)))
    assert line.response is not None and line.error is None
    assert (line.custom_id, line.response.status_code, line.response.body) == ("c1", 200, body)
    assert line.response.request_id == "batch_req_1"


def test_a_request_that_never_ran_becomes_an_error_line_without_a_response() -> None:
    raw = result_line("batch_req_2", "c2", None, None, "batch_expired", "not run before the window ended")
    line = BatchResultLine.model_validate_json(orjson.dumps(raw))
    assert line.response is None and line.error is not None
    assert (line.error.code, line.error.message) == ("batch_expired", "not run before the window ended")


def test_a_failed_response_keeps_its_status_and_its_error_code() -> None:
    raw = result_line("batch_req_3", "c3", 400, {"error": {"message": "bad"}}, "invalid_request", "bad")
    line = BatchResultLine.model_validate_json(orjson.dumps(raw))
    assert line.response is not None and line.response.status_code == 400
    assert line.error is not None and line.error.code == "invalid_request"


def test_a_checked_line_carries_its_attempts_and_an_unchecked_line_has_none() -> None:
    from storage.lines.openai import BatchResultLine, result_line

    attempts = {"count": 2, "failed": [{"attempt": 1, "check": "regex", "message": "no"}]}
    checked = result_line("batch_req_1", "a", 200, {"ok": True}, None, None, attempts)
    plain = result_line("batch_req_2", "b", 200, {"ok": True}, None, None)
    assert BatchResultLine.model_validate(checked).attempts == attempts
    assert "attempts" not in plain
