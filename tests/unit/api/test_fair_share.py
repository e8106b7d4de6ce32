"""A tenant's share of the request threads (api/fair_share.py), driven as ASGI on one event loop with a fake app
whose requests end when the test says: a request past the share waits in line and is served when a slot frees,
first come first served; one that waits out its time is answered 429 with Retry-After in its path's envelope;
another tenant and keyless requests never wait."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from api import fair_share
from api.fair_share import TenantShare

TENANTS = {"key-a": "tenant_a", "key-b": "tenant_b"}


class App:
    """A fake route: each request (named by its path) answers 200 once its event is set."""

    def __init__(self) -> None:
        self.release: dict[str, asyncio.Event] = {}
        self.started: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.started.append(scope["path"])
        await self.release.setdefault(scope["path"], asyncio.Event()).wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def call(share: TenantShare, path: str, key: str | None) -> tuple[int, dict[str, str], dict[str, Any]]:
    headers = [] if key is None else [(b"authorization", f"Bearer {key}".encode())]
    scope = {"type": "http", "method": "GET", "path": path, "headers": headers, "query_string": b""}
    answer: dict[str, Any] = {"body": b""}

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
            answer["headers"] = {name.decode(): value.decode() for name, value in message["headers"]}
        else:
            answer["body"] += message.get("body", b"")

    await share(scope, receive, send)
    return answer["status"], answer["headers"], json.loads(answer["body"])


@pytest.fixture
def share(monkeypatch: pytest.MonkeyPatch) -> tuple[TenantShare, App]:
    async def tenant_of(self: TenantShare, key_hash: str) -> str | None:
        return next(tenant for key, tenant in TENANTS.items() if fair_share.hash_key(key) == key_hash)

    monkeypatch.setattr(TenantShare, "_tenant_of", tenant_of)
    monkeypatch.setattr(fair_share, "WAIT_SECONDS", 0.05)
    app = App()
    return TenantShare(app, limit=1), app


async def until(condition: Any) -> None:
    while not condition():
        await asyncio.sleep(0)


def test_a_request_past_the_share_waits_in_line_and_is_served_when_a_slot_frees(
    share: tuple[TenantShare, App], monkeypatch: pytest.MonkeyPatch
) -> None:
    middleware, app = share
    monkeypatch.setattr(fair_share, "WAIT_SECONDS", 60.0)  # the slot frees long before: no timing involved

    async def scenario() -> list[str]:
        first = asyncio.create_task(call(middleware, "/first", "key-a"))
        await until(lambda: app.started == ["/first"])
        second = asyncio.create_task(call(middleware, "/second", "key-a"))
        third = asyncio.create_task(call(middleware, "/third", "key-a"))
        await until(lambda: len(middleware.shares["tenant_a"].waiting) == 2)
        other = await asyncio.wait_for(_served(middleware, app, "/other", "key-b"), 5)  # another tenant: at once
        keyless = await asyncio.wait_for(_served(middleware, app, "/health", None), 5)
        assert other == keyless == 200 and app.started[:2] == ["/first", "/other"]
        app.release["/first"].set()
        await until(lambda: "/second" in app.started)
        app.release["/second"].set()
        await until(lambda: "/third" in app.started)
        app.release["/third"].set()
        answers = await asyncio.gather(first, second, third)
        assert [status for status, _, _ in answers] == [200, 200, 200]
        assert middleware.shares == {}  # every slot given back
        return app.started

    assert [path for path in asyncio.run(scenario()) if path.startswith(("/f", "/s", "/t"))] == [
        "/first",
        "/second",
        "/third",
    ]


async def _served(middleware: TenantShare, app: App, path: str, key: str | None) -> int:
    app.release.setdefault(path, asyncio.Event()).set()
    status, _, _ = await call(middleware, path, key)
    return status


@pytest.mark.parametrize(
    ("path", "envelope"),
    [
        ("/v1/batches", lambda body: body["error"]["code"] == "rate_limit_exceeded"),
        ("/v1/messages/batches", lambda body: body["error"]["type"] == "rate_limit_error"),
    ],
)
def test_a_request_that_waits_out_its_time_is_a_429_with_retry_after(
    share: tuple[TenantShare, App], path: str, envelope: Any
) -> None:
    middleware, app = share

    async def scenario() -> tuple[int, dict[str, str], dict[str, Any]]:
        held = asyncio.create_task(call(middleware, "/held", "key-a"))
        await until(lambda: app.started == ["/held"])
        refused = await call(middleware, path, "key-a")
        assert not middleware.shares["tenant_a"].waiting and middleware.shares["tenant_a"].in_flight == 1
        app.release["/held"].set()
        await held
        return refused

    status, headers, body = asyncio.run(scenario())
    assert status == 429 and headers["retry-after"] == "1" and envelope(body), body


def test_a_request_cancelled_while_it_waits_leaves_no_place_in_line_and_no_slot(
    share: tuple[TenantShare, App], monkeypatch: pytest.MonkeyPatch
) -> None:
    middleware, app = share
    monkeypatch.setattr(fair_share, "WAIT_SECONDS", 60.0)

    async def scenario() -> None:
        held = asyncio.create_task(call(middleware, "/held", "key-a"))
        await until(lambda: app.started == ["/held"])
        waiting = asyncio.create_task(call(middleware, "/gone", "key-a"))
        await until(lambda: len(middleware.shares["tenant_a"].waiting) == 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert not middleware.shares["tenant_a"].waiting
        app.release["/held"].set()
        await held
        assert middleware.shares == {} and "/gone" not in app.started

    asyncio.run(scenario())
