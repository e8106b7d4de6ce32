"""What a GPU worker feeds its engine through: a `Runner` (one model) or an `EngineSlot` (several models,
one loaded at a time). `make_feeder` is the one place that chooses between them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from storage.settings import Settings
from worker.engine import Engine
from worker.feed.runner import Runner
from worker.feed.slot import EngineSlot


class Feeder(Protocol):
    """Keeps one engine fed from the queue for the models it serves."""

    @property
    def models(self) -> list[str]:
        """The models this feeder serves."""
        ...

    @property
    def model(self) -> str | None:
        """The model whose engine is loaded now (None before the first load)."""
        ...

    def warm(self) -> None:
        """Load an engine now rather than on the first task."""
        ...

    def serve_for(self, seconds: float, *, stop: threading.Event | None = None) -> bool:
        """Feed and step for up to `seconds`; False once none of its models has work."""
        ...

    def hand_back(self, *, drain_seconds: float) -> int:
        """Stop claiming, let in-flight work finish for up to `drain_seconds`, re-queue the rest; return how many."""
        ...


def make_feeder(
    models: Sequence[str],
    settings: Settings,
    *,
    load: Callable[[Settings, str], Engine],
    on_batch_done: Callable[[str], None] | None = None,
    worker_id: str | None = None,
) -> Feeder:
    """One model: a runner with its engine loaded now. Several: a slot that loads one when it is warmed."""
    if len(models) == 1:
        engine = load(settings, models[0])
        return Runner(engine, model=models[0], settings=settings, on_batch_done=on_batch_done, worker_id=worker_id)
    return EngineSlot(models, settings, load=load, on_batch_done=on_batch_done, worker_id=worker_id)
