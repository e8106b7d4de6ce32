"""SIGTERM's hand-back fits the grace: the drain is what the grace leaves after the margin, from the signal."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import signals

from storage.settings import Settings
from worker.process import readiness, shutdown

HOOKED = (signals.worker_ready, signals.worker_shutting_down, signals.worker_shutdown)


class Feeder:
    """Records the drain the hand-back was given; hands nothing back (no wake-up sent)."""

    model = "m"

    def __init__(self) -> None:
        self.drains: list[float] = []

    def hand_back(self, *, drain_seconds: float) -> int:
        self.drains.append(drain_seconds)
        return 0


@pytest.fixture(autouse=True)
def restore_signals() -> Iterator[None]:
    saved = {signal: list(signal.receivers) for signal in HOOKED}
    yield
    for signal, receivers in saved.items():
        signal.receivers[:] = receivers
        signal.sender_receivers_cache.clear()
    shutdown.stopping.clear()
    readiness.mark_not_ready()


@pytest.mark.parametrize(("drain", "grace", "low", "high"), [(10, 30, 10, 10), (60, 30, 19, 20), (60, 8, 0, 0)])
def test_sigterm_stops_claiming_and_hands_back_within_the_grace(
    tmp_path: Path, drain: int, grace: int, low: float, high: float
) -> None:
    feeder = Feeder()
    settings = Settings(data_dir=tmp_path, shutdown_drain_seconds=drain, shutdown_grace_seconds=grace)
    shutdown.install(feeder, settings=settings)  # type: ignore[arg-type]
    signals.worker_shutting_down.send(sender=None, sig="SIGTERM", how="Warm", exitcode=0)
    assert shutdown.stopping.is_set() and not readiness.is_ready()
    signals.worker_shutdown.send(sender=None)
    assert len(feeder.drains) == 1
    assert low <= feeder.drains[0] <= high
