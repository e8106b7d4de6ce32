"""The one bounded reader of request bodies: depth counted over the streamed bytes before anything is built
(issue 18 items 1, 2 and 4), strict values, and the Anthropic create body split into its requests."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.errors import InvalidRequest, RequestTooLarge
from storage.lines.anthropic import RequestsReader
from storage.lines.bounded_json import DepthCounter, RequestsSplitter, TooDeep, check_body, value_problem

ATTACK_PREFIX = b'{"requests":[{"custom_id":"q0","params":{"model":"backfill-demo","max_tokens":4,"x":'


def chunked(data: bytes, size: int) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def peak_bytes(run: Any) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def read_all(body: bytes, *, chunk: int = 65536, **limits: int) -> RequestsReader:
    reader = RequestsReader(
        max_requests=limits.get("max_requests", 100_000),
        max_request_bytes=limits.get("max_request_bytes", 1024 * 1024),
        max_body_bytes=limits.get("max_body_bytes", 256 * 1024 * 1024),
    )
    for _ in reader.lines(chunked(body, chunk)):
        pass
    reader.raise_if_bad()
    return reader


def test_the_100k_bracket_attack_is_refused_in_bounded_memory() -> None:
    """The issue's body (100 KB: a request whose params open 100,000 arrays) drove the server to 22 GB."""
    body = ATTACK_PREFIX + b"[" * 100_000
    caught: list[Exception] = []

    def run() -> None:
        try:
            read_all(body)
        except InvalidRequest as error:
            caught.append(error)

    assert peak_bytes(run) < 4 * 1024 * 1024
    assert caught and "nests deeper than 64 levels" in caught[0].message  # type: ignore[attr-defined]


def test_a_closed_deep_request_is_one_bad_request_and_the_others_are_judged() -> None:
    deep = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "x": None}
    body = orjson.dumps({"requests": [{"custom_id": "ok", "params": deep}]})[:-3]  # open the last value
    good = orjson.dumps({"custom_id": "fine", "params": deep})
    body = body.replace(b"null", b"[" * 5000 + b"]" * 5000) + b"]," + good[:-1] + b"}]}"
    body = body.replace(b"}]},", b"}},", 1)
    with pytest.raises(InvalidRequest) as caught:
        read_all(body, chunk=7)
    assert "1 invalid requests (indices 0): requests.0: nests deeper than 64 levels" in caught.value.message


def test_depth_64_is_the_line_checkers_limit_exactly() -> None:
    def body(levels: int) -> bytes:
        # the request object is level 1 and params level 2, as the stored line and its body are
        value = b"[" * (levels - 2) + b"1" + b"]" * (levels - 2)
        params = b'{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"x"}],"x":' + value + b"}"
        return b'{"requests":[{"custom_id":"a","params":' + params + b"}]}"

    assert read_all(body(64)).count == 1
    with pytest.raises(InvalidRequest, match="nests deeper than 64 levels"):
        read_all(body(65))


def test_one_huge_request_is_dropped_as_it_streams_not_built() -> None:
    """100 MB in one request peaked at 315 MB: now the request is refused with its index, memory flat."""
    params = b'{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"' + b"a" * (30 * 1024 * 1024) + b'"}]}'
    body = b'{"requests":[{"custom_id":"big","params":' + params + b'},{"custom_id":"b","params":{}}]}'
    caught: list[InvalidRequest] = []

    def run() -> None:
        try:
            read_all(body, chunk=1024 * 1024, max_request_bytes=1024 * 1024)
        except InvalidRequest as error:
            caught.append(error)

    assert peak_bytes(run) < 8 * 1024 * 1024
    assert "requests.0: larger than 2097152 bytes" in caught[0].message


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"\\ud800"}]}', "not valid JSON"),
        (b'{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"a"}],"\\udc00":1}', "not valid JSON"),
        (b'{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"a"}],"n":18446744073709551615}', "64-bit"),
    ],
    ids=["lone-surrogate-value", "lone-surrogate-key", "integer-beyond-64-bits"],
)
def test_bad_values_in_a_request_are_that_requests_problem(raw: bytes, reason: str) -> None:
    body = b'{"requests":[{"custom_id":"a","params":' + raw + b"}]}"
    with pytest.raises(InvalidRequest, match=reason):
        read_all(body)


def test_a_custom_id_with_a_trailing_newline_is_refused() -> None:
    body = orjson.dumps(
        {
            "requests": [
                {
                    "custom_id": "a\n",
                    "params": {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
                }
            ]
        }
    )
    with pytest.raises(InvalidRequest, match=r"requests\.0\.custom_id: must match"):
        read_all(body)


def test_unknown_top_level_fields_are_refused_and_named() -> None:
    request = {
        "custom_id": "a",
        "params": {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
    }
    with pytest.raises(InvalidRequest, match="webhook: Extra inputs are not permitted"):
        read_all(orjson.dumps({"requests": [request], "webhook": {"url": "x"}}))
    with pytest.raises(InvalidRequest, match="requests: given more than once"):
        read_all(b'{"requests":[],"requests":[]}')


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[",
        b'{"requests":[',
        b'{"requests":[{}',
        b'{"requests":[]',
        b'{"requests":[],}',
        b'{"requests":[1,]}',
        b'{"requests":[]} x',
        b'{"requests" []}',
    ],
)
def test_a_broken_skeleton_is_a_400_not_a_hang(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        read_all(body, chunk=3)


def test_the_body_size_is_counted_as_it_streams() -> None:
    with pytest.raises(RequestTooLarge):
        read_all(b'{"requests":[' + b" " * 5000 + b"]}", max_body_bytes=1000)


# -- the small-body reader (every JSON route) ----------------------------------------------------------------


def test_depth_is_refused_while_streaming_before_the_end() -> None:
    counter = DepthCounter()
    counter.feed(b'{"a": "[[[[ not counted in a string \\" [[[", "b": ' + b"[" * 62)
    with pytest.raises(TooDeep):
        counter.feed(b"[[")


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"metadata": {"k": "\\ud800"}}', "not valid JSON"),
        (b'{"metadata": {"\\ud800": "v"}}', "not valid JSON"),
        (b'{"name": "a\\u0000b"}', "NUL"),
        (b'{"metadata": {"a\\u0000": "v"}}', "NUL"),
        (b'{"n": 18446744073709551615}', "64-bit"),
        (b"[" * 300 + b"]" * 300, "deeper than 64"),
        (b'{"a": "\xff"}', "not valid JSON"),
    ],
)
def test_small_bodies_with_bad_values_are_400s(raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidRequest, match=reason):
        check_body(list(chunked(raw, 5)))


def test_value_problem_walks_wide_values_without_recursion() -> None:
    assert value_problem([[1] * 1000] * 1000, allow_nul=False) is None


# -- the splitter agrees with a real parser on any valid body, however it is chunked ------------------------

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.text(alphabet=st.sampled_from('ab"\\[]{},: \n\u00e9\U0001f600')),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(items=st.lists(json_value, max_size=5), chunk=st.integers(1, 17), pretty=st.booleans())
def test_the_splitter_yields_each_item_as_a_parser_sees_it(items: list[Any], chunk: int, pretty: bool) -> None:
    body = json.dumps({"other": {"[": "]"}, "requests": items, "n": -12345.5e3}, indent=1 if pretty else None).encode()
    splitter = RequestsSplitter(max_item_bytes=1 << 20)
    got = [raw for part in chunked(body, chunk) for raw, _ in splitter.feed(part)]
    splitter.close()
    assert [orjson.loads(raw) for raw in got] == items  # type: ignore[arg-type]
    assert splitter.unknown_keys == ["other", "n"]


def true_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((true_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((true_depth(v) for v in value), default=0)
    return 0


@settings(max_examples=200, deadline=None)
@given(value=json_value, chunk=st.integers(1, 13), pretty=st.booleans())
def test_the_depth_counter_counts_exactly_however_the_body_is_chunked(value: Any, chunk: int, pretty: bool) -> None:
    raw = json.dumps(value, indent=1 if pretty else None).encode()
    depth = true_depth(value)
    exact = DepthCounter(max_depth=depth)
    for part in chunked(raw, chunk):
        exact.feed(part)
    assert exact.depth == 0
    if depth:
        with pytest.raises(TooDeep):
            shallow = DepthCounter(max_depth=depth - 1)
            for part in chunked(raw, chunk):
                shallow.feed(part)


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_extension_fields_beside_requests_are_kept_and_others_refused(chunk: int) -> None:
    request = {
        "custom_id": "a",
        "params": {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
    }
    body = orjson.dumps({"priority": -5, "requests": [request], "max_cost_usd": "12.50"})
    reader = read_all(body, chunk=chunk)
    assert reader.extensions == {"priority": -5, "max_cost_usd": "12.50"} and reader.count == 1
    with pytest.raises(InvalidRequest, match="max_cost_usd: longer than 64 bytes"):
        read_all(orjson.dumps({"requests": [request], "max_cost_usd": "9" * 100}), chunk=chunk)
    with pytest.raises(InvalidRequest, match="other: Extra inputs are not permitted"):
        read_all(orjson.dumps({"requests": [request], "priority": 1, "other": 2}), chunk=chunk)


@pytest.mark.parametrize("chunk", [1, 7, 64, 65536])
def test_a_trial_and_checks_beside_requests_are_kept_whole_however_the_body_is_cut(chunk: int) -> None:
    request = {
        "custom_id": "a",
        "params": {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
    }
    checks = {"regex": 'say "yes" or [no]', "enum": [f"value {i}, {{}}" for i in range(200)], "max_attempts": 2}
    trial = {"lines": 3, "continue": "auto"}
    body = orjson.dumps({"trial": trial, "requests": [request], "checks": checks})
    reader = read_all(body, chunk=chunk)
    assert reader.extensions == {"trial": trial, "checks": checks} and reader.count == 1
    with pytest.raises(InvalidRequest, match="trial: longer than 1024 bytes"):
        read_all(orjson.dumps({"requests": [request], "trial": {"lines": 3, "pad": "x" * 1100}}), chunk=chunk)
    with pytest.raises(InvalidRequest, match="checks: contains a NUL"):
        read_all(orjson.dumps({"requests": [request], "checks": {"regex": "a\x00"}}), chunk=chunk)
