"""Which error lines a retry re-runs by default, and which only when their code is named (in the protocol's words)."""

from __future__ import annotations

import pytest

from storage.batches.retries import is_retryable
from storage.protocols import ANTHROPIC, OPENAI
from storage.queue.retry_rows import Failure


def row(status: str, status_code: int | None, code: str | None) -> Failure:
    return ("batch_req_1", status, status_code, code)


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
    for protocol in (OPENAI, ANTHROPIC):
        assert is_retryable(row(status, status_code, code), codes=frozenset(), protocol=protocol)


@pytest.mark.parametrize("code", ["context_length_exceeded", "invalid_value", "model_not_found"])
def test_client_errors_are_retried_only_when_named(code: str) -> None:
    line = row("failed", 400, code)
    assert not is_retryable(line, codes=frozenset(), protocol=OPENAI)
    assert is_retryable(line, codes=frozenset({code}), protocol=OPENAI)


def test_an_anthropic_retry_names_client_errors_by_the_error_type_its_users_see() -> None:
    bad_parameter = row("failed", 400, "unsupported_parameter")
    not_found = row("failed", 404, "model_not_found")
    assert is_retryable(bad_parameter, codes=frozenset({"invalid_request_error"}), protocol=ANTHROPIC)
    assert not is_retryable(not_found, codes=frozenset({"invalid_request_error"}), protocol=ANTHROPIC)
    assert is_retryable(not_found, codes=frozenset({"not_found_error"}), protocol=ANTHROPIC)
    # OpenAI's lines show no error types: the same name re-runs nothing there.
    assert not is_retryable(bad_parameter, codes=frozenset({"invalid_request_error"}), protocol=OPENAI)


def test_a_success_is_never_retried_even_when_its_code_is_named() -> None:
    assert not is_retryable(row("completed", 200, None), codes=frozenset({"batch_expired"}), protocol=OPENAI)
