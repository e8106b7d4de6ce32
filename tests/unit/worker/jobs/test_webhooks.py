"""The retry schedule: exponential backoff with jitter, capped, and no retry past the window."""

from __future__ import annotations

from storage.settings import Settings
from storage.webhooks.deliveries import DueDelivery
from worker.jobs.webhooks import next_attempt_at, retry_delay_seconds


def test_delays_double_with_jitter_between_half_and_all_of_the_nominal_delay() -> None:
    for failures, nominal in ((1, 5), (2, 10), (3, 20), (10, 2560)):
        low = retry_delay_seconds(failures, base_seconds=5, max_interval_seconds=21600, rand=lambda: 0.0)
        high = retry_delay_seconds(failures, base_seconds=5, max_interval_seconds=21600, rand=lambda: 1.0)
        assert (low, high) == (nominal / 2, nominal)


def test_delays_stop_growing_at_the_cap() -> None:
    assert retry_delay_seconds(40, base_seconds=5, max_interval_seconds=3600, rand=lambda: 1.0) == 3600
    assert retry_delay_seconds(10_000, base_seconds=5, max_interval_seconds=3600, rand=lambda: 1.0) == 3600


def test_jittered_delays_spread_out() -> None:
    delays = {round(retry_delay_seconds(3, base_seconds=5, max_interval_seconds=3600), 6) for _ in range(50)}
    assert len(delays) > 10 and all(10 <= delay <= 20 for delay in delays)


def test_retries_go_on_for_the_window_then_stop() -> None:
    settings = Settings(webhook_retry_base_seconds=5, webhook_retry_window_seconds=72 * 3600)
    due = DueDelivery("msg_1", "https://x", ("whsec_",), "{}", attempts=0, created_at=1_000_000)
    assert next_attempt_at(due, at=1_000_000 + 71 * 3600, settings=settings) is not None
    assert next_attempt_at(due, at=1_000_000 + 72 * 3600, settings=settings) is None


def test_the_default_schedule_makes_a_few_dozen_attempts_over_72_hours() -> None:
    settings = Settings()
    elapsed, attempts = 0.0, 1
    while True:
        delay = retry_delay_seconds(
            attempts,
            base_seconds=settings.webhook_retry_base_seconds,
            max_interval_seconds=settings.webhook_retry_max_interval_seconds,
            rand=lambda: 0.5,
        )
        if elapsed + delay > settings.webhook_retry_window_seconds:
            break
        elapsed, attempts = elapsed + delay, attempts + 1
    assert 24 <= attempts <= 36 and elapsed > 60 * 3600  # docs/webhooks.md states this range
