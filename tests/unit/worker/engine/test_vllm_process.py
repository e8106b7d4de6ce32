"""worker/engine/vllm_process.py: the exit hook that closes an engine whose core may be a child process."""

from __future__ import annotations

import atexit
import gc
import weakref

import pytest

from worker.engine.vllm_process import close_at_exit


class _Engine:
    def __init__(self) -> None:
        self.closed = False
        self.closes = 0

    def close(self) -> None:
        self.closes += 1
        self.closed = True


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    hooks: list[object] = []
    monkeypatch.setattr(atexit, "register", hooks.append)
    return hooks


def test_the_hook_is_registered_and_closes_an_open_engine(registered: list[object]) -> None:
    engine = _Engine()
    hook = close_at_exit(engine)
    assert registered == [hook]
    hook()
    assert engine.closes == 1


def test_an_engine_closed_before_exit_is_not_closed_again(registered: list[object]) -> None:
    engine = _Engine()
    hook = close_at_exit(engine)
    engine.close()
    hook()
    assert engine.closes == 1


def test_the_hook_does_not_keep_the_engine_alive(registered: list[object]) -> None:
    engine = _Engine()
    hook, ref = close_at_exit(engine), weakref.ref(engine)
    del engine
    gc.collect()
    assert ref() is None  # a switched-out model's engine can be freed
    hook()  # nothing left to close, no error
