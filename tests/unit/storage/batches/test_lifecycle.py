"""Batch status changes: legal moves stamp their time, illegal ones raise 409-typed errors."""

from __future__ import annotations

import pytest

from storage.batches import lifecycle
from storage.errors import BatchNotCancellable, IllegalTransition
from storage.models import Batch


def batch(status: str) -> Batch:
    return Batch(id="batch_x", status=status)


def test_happy_path_stamps_each_timestamp() -> None:
    row = batch(lifecycle.VALIDATING)
    for target, stamp in (
        (lifecycle.IN_PROGRESS, "in_progress_at"),
        (lifecycle.FINALIZING, "finalizing_at"),
        (lifecycle.COMPLETED, "completed_at"),
    ):
        lifecycle.transition(row, target)
        assert row.status == target and getattr(row, stamp)


@pytest.mark.parametrize("status", sorted(lifecycle.TERMINAL | {lifecycle.FINALIZING, lifecycle.CANCELLING}))
def test_finished_or_finalizing_batches_cannot_be_cancelled(status: str) -> None:
    with pytest.raises(BatchNotCancellable) as error:
        lifecycle.transition(batch(status), lifecycle.CANCELLING)
    assert error.value.status == 409


def test_terminal_states_are_final() -> None:
    for status in lifecycle.TERMINAL:
        for target in lifecycle.ALLOWED:
            assert not lifecycle.can_transition(status, target)
    with pytest.raises(IllegalTransition):
        lifecycle.transition(batch(lifecycle.COMPLETED), lifecycle.IN_PROGRESS)
