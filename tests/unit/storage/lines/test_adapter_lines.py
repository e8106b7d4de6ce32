"""Lines naming LoRA adapters: an adapter of the batch's base joins it; anything else is a per-line error."""

from __future__ import annotations

import json

from storage.lines.reader import LineChecker, LineError, ParsedLine

ADAPTERS = {"tone-a": "base", "tone-b": "base", "other-a": "other"}


def line(model: str, custom_id: str = "x") -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}).encode()


def check_all(models: list[str], **kwargs: object) -> list[ParsedLine | LineError | None]:
    checker = LineChecker(endpoint="/v1/chat/completions", max_requests=100, adapters=ADAPTERS, **kwargs)  # type: ignore[arg-type]
    return [checker.check(i + 1, line(m, f"c{i}"), max_line_bytes=10_000) for i, m in enumerate(models)]


def test_a_batch_mixes_the_base_and_its_adapters() -> None:
    results = check_all(["tone-a", "base", "tone-b"])
    assert all(isinstance(r, ParsedLine) for r in results)
    parsed = [r for r in results if isinstance(r, ParsedLine)]
    assert [(p.model, p.adapter) for p in parsed] == [("base", "tone-a"), ("base", None), ("base", "tone-b")]


def test_an_adapter_of_another_base_or_an_unknown_name_fails_its_line() -> None:
    results = check_all(["base", "other-a", "someone-elses-adapter"])
    assert isinstance(results[0], ParsedLine)
    errors = [r for r in results[1:] if isinstance(r, LineError)]
    assert [(e.line, e.code) for e in errors] == [(2, "mismatched_model"), (3, "mismatched_model")]
    assert "'other-a' (an adapter of 'other')" in errors[0].message


def test_a_file_naming_more_adapters_than_the_bound_fails_the_lines_past_it() -> None:
    checker = LineChecker(
        endpoint="/v1/chat/completions",
        max_requests=100,
        adapters={f"a{i}": "base" for i in range(5)},
        max_adapters=3,
    )
    results = [checker.check(i + 1, line(f"a{i}", f"c{i}"), max_line_bytes=10_000) for i in range(5)]
    assert [r.code for r in results if isinstance(r, LineError)] == ["too_many_adapters"] * 2
    again = checker.check(6, line("a0", "c9"), max_line_bytes=10_000)  # one already named: fine
    assert isinstance(again, ParsedLine)
