"""Line splitting and checking: the rules a user's JSONL is held to."""

from __future__ import annotations

import json

import pytest

from storage.lines.reader import LineChecker, LineError, ParsedLine, check_utf8_jsonl, iter_lines, peek_model


def lines_of(data: bytes, chunk: int = 3, max_line_bytes: int = 1000) -> list[tuple[int, bytes | None]]:
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    return list(iter_lines(chunks, max_line_bytes=max_line_bytes))


def test_lines_are_split_across_chunk_boundaries_with_crlf_and_no_final_newline() -> None:
    assert lines_of(b'{"a":1}\r\n{"b":2}\n{"c":3}') == [(1, b'{"a":1}'), (2, b'{"b":2}'), (3, b'{"c":3}')]


def test_an_over_long_line_is_flagged_without_being_buffered() -> None:
    data = b"short\n" + b"x" * 5000 + b"\nafter\n"
    assert lines_of(data, chunk=64, max_line_bytes=100) == [(1, b"short"), (2, None), (3, b"after")]


def test_checker_reports_duplicates_and_model_mismatch() -> None:
    checker = LineChecker(endpoint="/v1/completions", max_requests=10)

    def line(cid: str, model: str) -> bytes:
        return json.dumps(
            {"custom_id": cid, "method": "POST", "url": "/v1/completions", "body": {"model": model, "prompt": "x"}}
        ).encode()

    assert isinstance(checker.check(1, line("a", "m"), max_line_bytes=100), ParsedLine)
    duplicate = checker.check(2, line("a", "m"), max_line_bytes=100)
    assert isinstance(duplicate, LineError) and duplicate.code == "duplicate_custom_id" and duplicate.line == 2
    other = checker.check(3, line("b", "n"), max_line_bytes=100)
    assert isinstance(other, LineError) and other.code == "mismatched_model"
    assert checker.check(4, b"   ", max_line_bytes=100) is None


def test_azures_unversioned_urls_are_the_same_endpoint_and_are_stored_canonical() -> None:
    checker = LineChecker(endpoint="/v1/chat/completions", max_requests=10)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    for number, url in enumerate(("/chat/completions", "/v1/chat/completions"), start=1):
        line = json.dumps({"custom_id": f"c{number}", "method": "POST", "url": url, "body": body}).encode()
        parsed = checker.check(number, line, max_line_bytes=1000)
        assert isinstance(parsed, ParsedLine) and parsed.url == "/v1/chat/completions"
    other = json.dumps({"custom_id": "c3", "method": "POST", "url": "/embeddings", "body": body}).encode()
    refused = checker.check(3, other, max_line_bytes=1000)
    assert isinstance(refused, LineError) and refused.code == "mismatched_url"


def test_bom_is_stripped_only_on_the_first_line() -> None:
    checker = LineChecker(endpoint="/v1/completions", max_requests=10)
    raw = (
        b"\xef\xbb\xbf"
        + json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m"}}).encode()
    )
    assert isinstance(checker.check(1, raw, max_line_bytes=1000), ParsedLine)
    assert isinstance(checker.check(2, raw, max_line_bytes=1000), LineError)


def test_upload_sniffing_rejects_binary_and_csv() -> None:
    with pytest.raises(ValueError, match="UTF-8"):
        list(check_utf8_jsonl([b"\xff\xfe\x00"]))
    with pytest.raises(ValueError, match="JSONL"):
        list(check_utf8_jsonl([b"a,b\n"]))
    assert b"".join(check_utf8_jsonl([b"\n  ", b'{"x": 1}\n'])) == b'\n  {"x": 1}\n'


@pytest.mark.parametrize(
    "chunks",
    [
        [b'{"x": "caf\xc3', b'\xa9"}\n', b'{"y": 1}\n'],  # a character split across chunks, then ASCII
        [b'{"x": 1}\n', b'{"y": "\xe2\x82', b'\xac"}\n'],  # ASCII first, then a split character
    ],
)
def test_upload_sniffing_passes_utf8_split_anywhere(chunks: list[bytes]) -> None:
    assert b"".join(check_utf8_jsonl(chunks)) == b"".join(chunks)


@pytest.mark.parametrize(
    "chunks",
    [
        [b'{"x": 1}\n', b'{"y": "\xff"}\n'],  # a bad byte after an ASCII chunk
        [b'{"x": "\xc3', b'ascii after a cut character"}\n'],  # a character left unfinished by the next chunk
        [b'{"x": 1}\n', b'{"y": "\xe2\x82'],  # the file ends inside a character
    ],
)
def test_upload_sniffing_rejects_bad_utf8_after_ascii_chunks(chunks: list[bytes]) -> None:
    with pytest.raises(ValueError, match="UTF-8"):
        list(check_utf8_jsonl(chunks))


def test_peek_model_skips_blank_lines() -> None:
    data = [b"\n\n", b'{"body": {"model": "m1"}}\n']
    assert peek_model(data, max_line_bytes=100) == "m1"
    assert peek_model([b"nope\n"], max_line_bytes=100) is None
