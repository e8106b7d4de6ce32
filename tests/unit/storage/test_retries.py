"""Which error lines a retry re-runs by default, and which only when their code is named."""

from __future__ import annotations

import pytest

from storage.batches.retries import is_retryable


def row(status: str, status_code: int | None, code: str | None) -> tuple[tuple[object, ...], str, int]:
    return ("batch_req_1", "c1", status_code, None, code, "message"), status, 1


@pytest.mark.parametrize(
    ("status", "status_code", "code"),
    [
        ("expired", None, "batch_expired"),
        ("cancelled", None, "batch_cancelled"),
        ("failed", 500, "engine_error"),
        ("failed", None, "budget_exceeded"),
        ("failed", 503, "server_error"),
    ],
)
def test_expired_cancelled_budget_and_server_failures_are_retried_by_default(
    status: str, status_code: int | None, code: str
) -> None:
    assert is_retryable(row(status, status_code, code), codes=frozenset())  # type: ignore[arg-type]


@pytest.mark.parametrize("code", ["context_length_exceeded", "invalid_value", "model_not_found"])
def test_client_errors_are_retried_only_when_named(code: str) -> None:
    line = row("failed", 400, code)
    assert not is_retryable(line, codes=frozenset())  # type: ignore[arg-type]
    assert is_retryable(line, codes=frozenset({code}))  # type: ignore[arg-type]


def test_a_success_is_never_retried_even_when_its_code_is_named() -> None:
    assert not is_retryable(row("completed", 200, None), codes=frozenset({"batch_expired"}))  # type: ignore[arg-type]
