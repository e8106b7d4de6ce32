"""Hostile bodies generated on every route that takes one (issue 18 item 4): nesting from 65 to 5,000 levels,
lone surrogates in keys and values, NUL characters, integers beyond 64 bits and invalid UTF-8, spliced into an
otherwise well-formed body at a random place. Every answer is a 4xx in the path's envelope, never a 5xx or a
dropped connection. `MAX_EXAMPLES` per route and class; `make fuzz` runs many more.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import LiveServer, make_key

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}'})
MAX_EXAMPLES = int(os.environ.get("BACKFILL_FUZZ_EXAMPLES", "3"))

MESSAGE = {"model": "fake-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
BASES: dict[str, dict[str, Any]] = {
    "/v1/batches": {
        "input_file_id": "file-x",
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "metadata": {"k": "v"},
    },
    "/v1/batches/estimate": {"input_file_id": "file-x", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
    "/v1/webhook_endpoints": {"url": "https://example.com/hook", "name": "n", "metadata": {"k": "v"}},
    "/v1/messages/batches": {
        "requests": [{"custom_id": "a", "params": MESSAGE}, {"custom_id": "b", "params": MESSAGE}]
    },
    "/v1/messages/batches/estimate": {
        "requests": [{"custom_id": "a", "params": MESSAGE}, {"custom_id": "b", "params": MESSAGE}],
        "completion_window": "24h",
    },
}
GENERIC = {"metadata": {"k": "v"}, "name": "x"}  # for routes whose body is optional or small


def body_routes() -> list[tuple[str, str]]:
    from api.app import create_app

    found = []
    for route in create_app().routes:
        for method in sorted(getattr(route, "methods", set()) & {"POST", "PUT", "PATCH"}):
            if route.path != "/v1/files":  # multipart: its file's lines are fuzzed through the line checker
                found.append((method, route.path))  # type: ignore[attr-defined]
    return found


# A marker string that the hostile fragment replaces in the serialised body.
MARK = "\u2603HOSTILE\u2603"
HOSTILE = {
    "deep": st.integers(65, 5000).map(lambda n: b"[" * n + b"]" * n),
    "deep_unclosed": st.integers(65, 5000).map(lambda n: b"[" * n),
    "lone_surrogate": st.sampled_from([b'"\\ud800"', b'"\\udfff"', b'"a\\udc00b"', b'"\\ud83d"']),
    "nul": st.sampled_from([b'"a\\u0000"', b'"\\u0000"']),
    "big_int": st.sampled_from([b"18446744073709551615", b"9223372036854775808"]),
    "bad_utf8": st.sampled_from([b'"\xff"', b'"\xc3"', b'"\xed\xa0\x80"']),
}
KEY_HOSTILE = {"lone_surrogate_key": [b'"\\ud800"', b'"\\udfff"'], "nul_key": [b'"k\\u0000"']}


def places(value: Any, path: tuple[Any, ...] = (), *, dicts_only: bool = False) -> list[tuple[Any, ...]]:
    """Every place in a JSON value a fragment can go (with `dicts_only`, every object a key can go in)."""
    found = [path] if isinstance(value, dict) or not dicts_only else []
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    for step, child in children:
        found += places(child, (*path, step), dicts_only=dicts_only)
    return found


def splice(base: dict[str, Any], path: tuple[Any, ...], fragment: bytes, *, as_key: bool) -> bytes:
    """The base body with `fragment` as the value at `path` (or as a new key of the object there)."""
    body: Any = orjson.loads(orjson.dumps(base))
    if not path and not as_key:
        return fragment  # the whole body
    parent = body
    for step in path if as_key else path[:-1]:
        parent = parent[step]
    if as_key:
        parent[MARK] = 1
    else:
        parent[path[-1]] = MARK
    return orjson.dumps(body).replace(orjson.dumps(MARK), fragment, 1)


def check(server: LiveServer, key: str, method: str, path: str, body: bytes, *, may_pass: bool) -> None:
    url = server.base_url + path.replace("{", "x").replace("}", "")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    response = httpx.request(method, url, content=body, headers=headers, timeout=60)
    if may_pass and response.status_code == 200:
        return
    assert 400 <= response.status_code < 500, f"{method} {path} -> {response.status_code}: {response.text[:300]}"
    payload = response.json()
    if path.startswith("/v1/messages"):
        assert payload["type"] == "error" and payload["error"]["message"], payload
    else:
        assert set(payload["error"]) == {"message", "type", "param", "code"}, payload


def fuzz_route(api: LiveServer, key: str, method: str, path: str, kind: str) -> str | None:
    """Hostile fragments of one kind at random places of one route's body; the first failure as text."""
    base = BASES.get(path, GENERIC)
    spots = places(base, dicts_only=kind in KEY_HOSTILE)
    fragment = st.sampled_from(KEY_HOSTILE[kind]) if kind in KEY_HOSTILE else HOSTILE[kind]

    @given(spot=st.sampled_from(spots), piece=fragment)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def fuzz(spot: tuple[Any, ...], piece: bytes) -> None:
        # NUL is data inside a request's params (a JSON column holds it): only there may it pass
        may_pass = path.startswith("/v1/messages/batches") and kind in ("nul", "nul_key") and "params" in spot
        check(api, key, method, path, splice(base, spot, piece, as_key=kind in KEY_HOSTILE), may_pass=may_pass)

    try:
        fuzz()
    except AssertionError as failure:
        return f"{method} {path} [{kind}]: {str(failure)[:800]}"
    return None


def test_hostile_fragments_anywhere_in_any_body_are_4xx_in_the_paths_envelope(api: LiveServer) -> None:
    key = make_key("fuzz", admin=True)
    routes = body_routes()
    assert ("POST", "/v1/messages/batches") in routes and len(routes) >= 8
    failures = [
        failure
        for method, path in routes
        for kind in [*HOSTILE, *KEY_HOSTILE]
        if (failure := fuzz_route(api, key, method, path, kind)) is not None
    ]
    assert not failures, "\n\n".join(failures)
