"""The history checker on synthetic histories: it passes a clean run and catches each kind of breakage in a
batch's lines, counts, cost, files and timing. The batch-control rules' tests are in test_control_rules.py."""

from __future__ import annotations

import pytest

from tests.chaos.history import FaultRecord, check, error_code
from tests.chaos.synthetic_histories import T0, clean_history, error_line, kinds, output_line


def test_a_clean_history_passes() -> None:
    verdict = check(clean_history())
    assert verdict.ok, verdict.findings


def test_a_request_in_neither_file_is_lost() -> None:
    history = clean_history()
    record = history.batches["batch_1"]
    record.output_lines.pop()
    record.request_counts["completed"] = 1
    record.cost = {"input_tokens": 3, "output_tokens": 5}
    assert kinds(history) == {"lost": 1}


def test_a_request_in_both_files_is_duplicated_and_the_counts_disagree() -> None:
    history = clean_history()
    history.batches["batch_1"].error_lines.append(error_line("a", "engine_error", status=500))
    assert kinds(history) == {"duplicated": 1, "unexplained": 1, "other": 1}


def test_a_duplicate_request_error_is_never_explained_even_by_a_worker_kill() -> None:
    history = clean_history()
    record = history.batches["batch_1"]
    record.output_lines.pop()
    record.error_lines.append(error_line("b", "duplicate_request"))
    record.request_counts = {"total": 3, "completed": 1, "failed": 2}
    record.cost = {"input_tokens": 3, "output_tokens": 5}
    verdict = check(history)
    assert verdict.summary()["unexplained"] == 1
    assert verdict.unexplained_codes() == {"duplicate_request": 1}


@pytest.mark.parametrize(("interrupting", "explained"), [(2, False), (3, True)])
def test_engine_error_is_explained_only_by_enough_interrupting_faults(interrupting: int, explained: bool) -> None:
    history = clean_history()
    history.faults = [FaultRecord("pg_stop", "postgres", T0 + i, T0 + i + 1) for i in range(interrupting)]
    history.faults.append(FaultRecord("kill_api", "api", T0 + 5, T0 + 6))  # interrupts no running request
    record = history.batches["batch_1"]
    record.output_lines.pop()
    record.error_lines.append(error_line("b", "engine_error", status=500))
    record.request_counts = {"total": 3, "completed": 1, "failed": 2}
    record.cost = {"input_tokens": 3, "output_tokens": 5}
    assert check(history).ok is explained


def test_a_line_built_to_fail_must_fail_with_its_own_code() -> None:
    history = clean_history()
    history.batches["batch_1"].error_lines = [error_line("c", "context_length_exceeded")]
    assert kinds(history) == {"unexplained": 1}


def test_a_line_built_to_fail_that_succeeds_is_unexplained() -> None:
    history = clean_history()
    record = history.batches["batch_1"]
    record.error_lines = []
    record.output_lines.append(output_line("c"))
    record.request_counts = {"total": 3, "completed": 3, "failed": 0}
    record.cost = {"input_tokens": 9, "output_tokens": 15}
    assert kinds(history) == {"unexplained": 1}


def test_batch_cancelled_lines_are_explained_only_when_the_client_cancelled() -> None:
    history = clean_history()
    record = history.batches["batch_1"]
    record.status = "cancelled"
    record.output_lines.pop()
    record.error_lines.append(error_line("b", "batch_cancelled", status=None))
    record.request_counts = {"total": 3, "completed": 1, "failed": 2}
    record.cost = {"input_tokens": 3, "output_tokens": 5}
    assert kinds(history) == {"unexplained": 1}
    record.cancel_requested = True
    assert check(history).ok


def test_a_batch_cancelled_before_ingest_owes_no_lines() -> None:
    history = clean_history()
    record = history.batches["batch_1"]
    record.status, record.cancel_requested = "cancelled", True
    record.output_lines, record.error_lines, record.cost = [], [], None
    record.request_counts = {"total": 0, "completed": 0, "failed": 0}
    history.objects.remove("files/file-out")
    history.objects.remove("files/file-err")
    del history.file_keys["files/file-out"], history.file_keys["files/file-err"]
    assert check(history).ok


def test_request_counts_must_match_the_files() -> None:
    history = clean_history()
    history.batches["batch_1"].request_counts["completed"] = 3
    assert kinds(history) == {"other": 1}


def test_cost_tokens_must_equal_the_output_usage() -> None:
    history = clean_history()
    history.batches["batch_1"].cost = {"input_tokens": 6, "output_tokens": 11}
    assert kinds(history) == {"other": 1}
    history.batches["batch_1"].cost = None
    assert kinds(history) == {"other": 1}


def test_a_malformed_output_line_is_reported() -> None:
    history = clean_history()
    del history.batches["batch_1"].output_lines[0]["response"]["body"]["choices"]
    assert kinds(history) == {"other": 1}


def test_a_batch_still_open_or_terminal_too_late_after_the_faults_is_stuck() -> None:
    history = clean_history()
    record = history.batches["batch_1"]
    assert kinds(history, stuck_bound_seconds=7.0) == {}  # terminal 7 s after the fault was repaired
    assert kinds(history, stuck_bound_seconds=6.0) == {"stuck": 1}
    record.status, record.terminal_at = "in_progress", None
    assert kinds(history) == {"stuck": 1}


def test_an_accepted_batch_that_failed_loses_its_requests() -> None:
    history = clean_history()
    record = history.batches["batch_1"]
    record.status = "failed"
    record.output_lines, record.error_lines, record.cost = [], [], None
    record.request_counts = {"total": 0, "completed": 0, "failed": 0}
    found = kinds(history)
    assert found["lost"] == 3 and found["other"] >= 1


def test_an_object_without_a_file_row_is_an_orphan_and_a_row_without_its_object_is_reported() -> None:
    history = clean_history()
    history.objects.append("files/file-leftover")
    assert kinds(history) == {"orphan": 1}
    history.objects.remove("files/file-out")
    assert kinds(history) == {"orphan": 1, "other": 1}


def test_a_terminal_batch_whose_files_were_never_read_is_reported() -> None:
    history = clean_history()
    history.batches["batch_1"].downloaded = False
    assert kinds(history) == {"other": 1}


def test_error_code_reads_the_error_object_then_the_response_body() -> None:
    assert error_code(error_line("x", "invalid_value")) == "invalid_value"
    line = error_line("x", "context_length_exceeded")
    line["error"] = None
    assert error_code(line) == "context_length_exceeded"
    assert error_code({"custom_id": "x", "response": None, "error": None}) is None
