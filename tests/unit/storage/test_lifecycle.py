"""Batch status changes: legal moves stamp their time, illegal ones raise 409-typed errors."""

from __future__ import annotations

import ast

import pytest

from storage import lifecycle
from storage.errors import BatchNotCancellable, IllegalTransition
from storage.models import Batch
from tests.unit.test_layering import sources


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


# -- request (queue row) statuses ------------------------------------------------------------------------------


@pytest.mark.parametrize("ended", sorted(lifecycle.REQ_TERMINAL))
def test_an_ended_request_row_never_moves_again(ended: str) -> None:
    for target in lifecycle.REQ_ALLOWED:
        with pytest.raises(IllegalTransition, match=f"from status '{ended}'"):
            lifecycle.rows_moving(ended, to=target)


def test_a_queued_row_cannot_end_completed_without_running() -> None:
    with pytest.raises(IllegalTransition, match="from status 'queued' to 'completed'"):
        lifecycle.request_move(lifecycle.REQ_QUEUED, to=(lifecycle.REQ_RUNNING, lifecycle.REQ_COMPLETED))


def test_the_moves_the_queue_makes_are_allowed() -> None:
    open_ = sorted(lifecycle.REQ_OPEN)
    for target in (lifecycle.REQ_CANCELLED, lifecycle.REQ_EXPIRED, lifecycle.REQ_FAILED):
        assert "IN" in str(lifecycle.rows_moving(*open_, to=target)).upper()  # cancel, expiry: queued and running
    assert "=" in str(lifecycle.rows_moving(lifecycle.REQ_QUEUED, to=lifecycle.REQ_RUNNING))  # the claim
    assert lifecycle.request_move(lifecycle.REQ_RUNNING, to=lifecycle.REQ_QUEUED) == (lifecycle.REQ_RUNNING,)


def test_every_request_status_has_a_row_in_the_table() -> None:
    statuses = {value for name, value in vars(lifecycle).items() if name.startswith("REQ_") and isinstance(value, str)}
    assert statuses == set(lifecycle.REQ_ALLOWED)
    assert set(lifecycle.REQ_ALLOWED) == lifecycle.REQ_TERMINAL | lifecycle.REQ_OPEN
    assert all(lifecycle.REQ_ALLOWED[status] for status in lifecycle.REQ_OPEN)


def test_every_request_status_the_queue_writes_is_in_the_table() -> None:
    """Statuses set (`.values(status=...)`), inserted (`"status": ...`) or moved between (`rows_moving`,
    `request_move` with literal statuses) are rows of the table, and the literal moves are allowed by it."""
    written, moves = set(), []
    for _path, tree in sources("storage/queue"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "values":
                written |= {ast.unparse(k.value) for k in node.keywords if k.arg == "status"}
            elif isinstance(node, ast.Dict):
                written |= {
                    ast.unparse(v)
                    for k, v in zip(node.keys, node.values, strict=True)
                    if isinstance(k, ast.Constant) and k.value == "status"
                }
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(("rows_moving", "request_move")):
                moves.append(node)
    constants = {name for name in written if name.startswith("lifecycle.")}
    assert constants and {getattr(lifecycle, name.split(".")[1]) for name in constants} <= set(lifecycle.REQ_ALLOWED)
    literal = [call for call in moves if all(ast.unparse(arg).startswith("lifecycle.REQ_") for arg in call.args)]
    assert len(literal) >= 6  # the claim, take_back, release, hand-back, the reaper's two, results, unserved
    for call in literal:
        sources_ = [getattr(lifecycle, ast.unparse(arg).split(".")[1]) for arg in call.args]
        target = eval(ast.unparse(call.keywords[0].value), {"lifecycle": lifecycle})  # our own source's expression
        lifecycle.request_move(*sources_, to=target)  # raises on a move the table forbids
