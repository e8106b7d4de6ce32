"""Completion windows: when a batch expires, and the background tier, whose batches have no deadline."""

from __future__ import annotations

from storage.settings import BACKGROUND_WINDOW, window_seconds

# A background batch's deadline (and its requests'): 9999-12-31T23:59:59Z, so the reaper never expires it and
# earliest-deadline-first puts it after every request that has a deadline. The API shows no `expires_at`.
BACKGROUND_DEADLINE = 253_402_300_799

__all__ = ["BACKGROUND_DEADLINE", "BACKGROUND_WINDOW", "deadline_for", "is_background_window"]


def is_background_window(completion_window: str) -> bool:
    """True for the background tier's window."""
    return completion_window == BACKGROUND_WINDOW


def deadline_for(completion_window: str, *, created_at: int) -> int:
    """When a batch created at `created_at` with this window expires (never, for background)."""
    if is_background_window(completion_window):
        return BACKGROUND_DEADLINE
    return created_at + window_seconds(completion_window)
