"""The online users' load generator: a fresh process's first request is untimed (its cold start is not a user's)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench import online_load


def test_one_untimed_request_goes_before_the_go_and_only_the_arrivals_after_it_are_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[Any, ...]] = []

    async def request(client: Any, url: str, index: int, tokens: int, words: int = 0) -> dict[str, Any]:
        calls.append(("request", index, tokens))
        return {"ok": True, "ttft": 0.001, "tpot": None, "tokens": tokens}

    monkeypatch.setattr(online_load, "_online_request", request)
    load = online_load._online_load("http://sim", 200.0, 0.05, 8, seed=3, wait=lambda: calls.append(("go",)))
    rows = asyncio.run(load)
    assert calls[:2] == [("request", -1, 1), ("go",)]  # the warm-up: one token, before the parent's go
    assert rows and len(rows) == len(calls) - 2
    assert [c[1] for c in calls[2:]] == list(range(len(rows)))  # every timed arrival, none of them the warm-up


def test_without_a_wait_there_is_no_warm_up(monkeypatch: pytest.MonkeyPatch) -> None:
    indices: list[int] = []

    async def request(client: Any, url: str, index: int, tokens: int, words: int = 0) -> dict[str, Any]:
        indices.append(index)
        return {"ok": True, "ttft": 0.001, "tpot": None, "tokens": tokens}

    monkeypatch.setattr(online_load, "_online_request", request)
    rows = asyncio.run(online_load._online_load("http://sim", 200.0, 0.05, 8, seed=3))
    assert indices == list(range(len(rows)))
