"""Completion windows: how a window ('24h', '90m', '7d') parses, which windows a server offers at which discount,
when a batch expires, and the background tier, whose batches have no deadline."""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal

_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The completion window with no deadline (storage/batches/control.py): claimed only when no deadline work waits.
BACKGROUND_WINDOW = "background"
# A background batch's deadline (and its requests'): 9999-12-31T23:59:59Z, so the reaper never expires it and
# earliest-deadline-first puts it after every request that has a deadline. The API shows no `expires_at`.
BACKGROUND_DEADLINE = 253_402_300_799


def window_seconds(window: str) -> int:
    """Parse a completion window such as '24h', '90m' or '7d' into seconds (not 'background': it has none)."""
    unit = window[-1:]
    number = window[:-1]
    if unit not in _DURATION_UNITS or not number.isdigit() or int(number) <= 0:
        raise ValueError(f"bad completion window {window!r}: use a number and s, m, h or d, e.g. '24h'")
    return int(number) * _DURATION_UNITS[unit]


def offered_windows(discounts: dict[str, Decimal]) -> dict[str, Decimal]:
    """The windows a server offers ({window: discount}, 24h always among them); ValueError naming a bad one."""
    for window, discount in discounts.items():
        if window != BACKGROUND_WINDOW:
            window_seconds(window)
        if not Decimal(0) <= discount < Decimal(1):
            raise ValueError(f"discount for {window!r} must be in [0, 1)")
    windows = {"24h": Decimal("0.5"), **discounts}
    if BACKGROUND_WINDOW in windows and windows[BACKGROUND_WINDOW] <= windows["24h"]:
        raise ValueError(f"the discount for {BACKGROUND_WINDOW!r} must be deeper than 24h's ({windows['24h']})")
    return windows


def is_background_window(completion_window: str) -> bool:
    """True for the background tier's window."""
    return completion_window == BACKGROUND_WINDOW


def deadline_for(completion_window: str, *, created_at: int) -> int:
    """When a batch created at `created_at` with this window expires (never, for background)."""
    if is_background_window(completion_window):
        return BACKGROUND_DEADLINE
    return created_at + window_seconds(completion_window)


def by_length(windows: Iterable[str]) -> list[str]:
    """Windows shortest first, the background tier last (a menu's order)."""
    return sorted(windows, key=lambda window: (is_background_window(window), _length(window), window))


def _length(window: str) -> int:
    return 0 if is_background_window(window) else window_seconds(window)
