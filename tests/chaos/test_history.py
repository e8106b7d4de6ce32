"""The history checker on synthetic histories: it passes a clean run and catches each kind of breakage."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos.control_rules import paused_spans
from tests.chaos.history import (
    BatchRecord,
    ControlEvent,
    FaultRecord,
    History,
    InputFile,
    InputLine,
    RowRecord,
    check,
    error_code,
)

T0 = 1_000_000.0


def output_line(custom_id: str, *, prompt: int = 3, completion: int = 5) -> dict[str, Any]:
    body = {
        "id": f"chatcmpl-{custom_id}",
        "object": "chat.completion",
        "created": 1,
        "model": "chaos-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "lorem"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": f"batch_req_{custom_id}", "body": body},
        "error": None,
    }


def error_line(custom_id: str, code: str, *, status: int | None = 400) -> dict[str, Any]:
    response = None
    if status is not None:
        body = {"error": {"message": "no", "type": "invalid_request_error", "param": None, "code": code}}
        response = {"status_code": status, "request_id": f"batch_req_{custom_id}", "body": body}
    return {
        "id": f"batch_req_{custom_id}",
        "custom_id": custom_id,
        "response": response,
        "error": {"code": code, "message": "no"},
    }


def clean_history() -> History:
    """Three lines, one built to fail: everything as promised."""
    lines = (InputLine("a"), InputLine("b"), InputLine("c", expect_error="invalid_value"))
    record = BatchRecord(
        batch_id="batch_1",
        tenant="t",
        input_file_id="file-1",
        created_at=T0 + 1,
        status="completed",
        request_counts={"total": 3, "completed": 2, "failed": 1},
        cost={"input_tokens": 6, "output_tokens": 10},
        output_file_id="file-out",
        error_file_id="file-err",
        output_lines=[output_line("a"), output_line("b")],
        error_lines=[error_line("c", "invalid_value")],
        terminal_at=T0 + 10,
        downloaded=True,
    )
    keys = {"files/file-1": "file-1", "files/file-out": "file-out", "files/file-err": "file-err"}
    return History(
        seed=0,
        scenario="kill_gpu",
        started_at=T0,
        faults=[FaultRecord("kill_gpu", "gpu1", T0 + 2, T0 + 3)],
        inputs={"file-1": InputFile("file-1", "t", lines)},
        batches={"batch_1": record},
        objects=list(keys),
        file_keys=dict(keys),
    )


def kinds(history: History, **bound: float) -> dict[str, int]:
    return {kind: n for kind, n in check(history, **bound).summary().items() if n}


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


# Batch control (issue 20): a retry, a pause, a spend cap.


def retried_history() -> History:
    """batch_1 cancelled with b unrun; its retry batch_2 runs b alone: as promised."""
    history = clean_history()
    origin = history.batches["batch_1"]
    origin.status, origin.cancel_requested = "cancelled", True
    origin.output_lines = [output_line("a")]
    origin.error_lines = [error_line("b", "batch_cancelled", status=None), error_line("c", "invalid_value")]
    origin.request_counts = {"total": 3, "completed": 1, "failed": 2}
    origin.cost = {"input_tokens": 3, "output_tokens": 5}
    retry = BatchRecord(
        batch_id="batch_2",
        tenant="t",
        input_file_id="file-1",
        created_at=T0 + 11,
        status="completed",
        request_counts={"total": 1, "completed": 1, "failed": 0},
        cost={"input_tokens": 3, "output_tokens": 5},
        output_file_id="file-out2",
        output_lines=[output_line("b")],
        terminal_at=T0 + 14,
        downloaded=True,
        retry_of="batch_1",
        retry_expected=["b"],
    )
    history.batches["batch_2"] = retry
    history.objects.append("files/file-out2")
    history.file_keys["files/file-out2"] = "file-out2"
    history.rows = {
        "batch_1": [RowRecord("a", "completed", T0 + 5, "run-1"), RowRecord("b", "failed", T0 + 6, None)],
        "batch_2": [RowRecord("b", "completed", T0 + 13, "run-2")],
    }
    history.controls = [ControlEvent("retry", "t", "batch_1", T0 + 10.5, T0 + 11, value="batch_2")]
    return history


def test_a_retry_of_only_the_failed_lines_passes() -> None:
    verdict = check(retried_history())
    assert verdict.ok, verdict.findings


def test_a_retry_that_re_runs_a_success_is_a_rerun_and_bills_it_twice() -> None:
    history = retried_history()
    retry = history.batches["batch_2"]
    retry.output_lines.append(output_line("a"))  # "a" succeeded in batch_1
    retry.request_counts = {"total": 2, "completed": 2, "failed": 0}
    retry.cost = {"input_tokens": 6, "output_tokens": 10}
    found = check(history)
    assert found.total("rerun") == 2  # held by the retry, and billed in two batches of the tree
    assert any("succeeded there" in f.detail for f in found.findings)


def test_a_retry_row_for_a_success_is_a_rerun_even_before_it_has_a_line() -> None:
    history = retried_history()
    history.rows["batch_2"].append(RowRecord("a", "queued", None, None))
    assert {f.kind for f in check(history).findings} == {"rerun"}


def test_a_retry_missing_a_failed_line_loses_it() -> None:
    history = retried_history()
    history.batches["batch_2"].retry_expected = ["b", "c2"]
    assert {f.kind for f in check(history).findings} >= {"lost"}


def paused_history() -> History:
    """batch_1 paused from T0+4 (answered) to T0+7 (resume sent); its results land before and after."""
    history = clean_history()
    history.rows = {
        "batch_1": [
            RowRecord("a", "completed", T0 + 3.9, "run-1"),
            RowRecord("b", "completed", T0 + 7.2, "run-2"),
            RowRecord("c", "failed", T0 + 7.3, "run-2", "invalid_value"),
        ]
    }
    history.controls = [
        ControlEvent("pause", "t", "batch_1", T0 + 3.8, T0 + 4.0),
        ControlEvent("resume", "t", "batch_1", T0 + 7.0, T0 + 7.1),
    ]
    return history


def test_a_paused_batch_with_no_result_between_pause_and_resume_passes() -> None:
    history = paused_history()
    assert paused_spans(history, "batch_1") == [(T0 + 4.0, T0 + 7.0)]
    assert check(history).ok


def test_a_result_recorded_while_paused_is_progress() -> None:
    history = paused_history()
    history.rows["batch_1"][1] = RowRecord("b", "completed", T0 + 5.5, "run-1")
    assert kinds(history) == {"paused_progress": 1}


def test_a_pause_never_resumed_lasts_to_the_end_and_a_refused_pause_pauses_nothing() -> None:
    history = paused_history()
    history.controls.pop()  # no resume
    assert kinds(history) == {"paused_progress": 2}
    history.controls = [ControlEvent("pause", "t", "batch_1", T0 + 3.8, None, "conflict")]
    assert check(history).ok


def test_lines_a_cancel_ends_while_paused_are_not_progress() -> None:
    history = paused_history()
    history.rows["batch_1"][1] = RowRecord("b", "failed", T0 + 5.5, None, "batch_cancelled")
    assert check(history).ok


def capped_history(cap: str) -> History:
    """batch_1 capped at `cap` USD; its two output lines bill 5 output tokens ($1 each) apiece."""
    history = clean_history()
    history.batches["batch_1"].max_cost_usd = cap
    return history


def test_a_capped_batch_within_its_cap_plus_one_request_passes() -> None:
    assert check(capped_history("5")).ok  # $10 billed <= $5 + its dearest request, $5


def test_a_capped_batch_past_its_cap_plus_one_request_overruns() -> None:
    assert kinds(capped_history("4.99")) == {"overrun": 1}


def test_a_caps_bound_is_one_request_whatever_the_workers_hold() -> None:
    """A claim reserves each request's cost and the claims of a capped batch take turns (its row lock), so the
    bound no longer grows with the GPU workers or what each may hold in flight."""
    history = capped_history("4.99")
    history.gpu_workers, history.inflight_bound_per_worker = 2, 32
    assert kinds(history) == {"overrun": 1}


def test_cap_overruns_measure_what_each_capped_batch_billed_past_its_cap() -> None:
    from decimal import Decimal

    from tests.chaos.control_rules import cap_overruns

    assert cap_overruns(capped_history("7")) == {"batch_1": (Decimal(3), Decimal(5))}
    assert cap_overruns(capped_history("12")) == {"batch_1": (Decimal(0), Decimal(5))}  # stopped under it


def test_the_in_flight_bound_of_a_tenant_budget_grows_with_the_gpu_workers() -> None:
    history = clean_history()  # 10 output tokens billed, the dearest request 5
    history.inflight_bound_per_worker = 1
    history.controls = [ControlEvent("budget", "t", None, T0 + 1, T0 + 2, value="4", spent_usd="2")]
    history.gpu_workers = 2
    assert check(history).ok  # 10 <= 4 + 2 x $5


def test_a_budgeted_tenant_past_its_budget_plus_the_bound_overruns() -> None:
    history = clean_history()  # 10 output tokens billed, the dearest request 5
    history.inflight_bound_per_worker = 1
    history.controls = [ControlEvent("budget", "t", None, T0 + 1, T0 + 2, value="4", spent_usd="2")]
    assert kinds(history) == {"overrun": 1}  # 10 > 4 + 1 x $5
    history.controls = [ControlEvent("budget", "t", None, T0 + 1, T0 + 2, value="4", spent_usd="5")]
    assert check(history).ok  # already spent 5 when it was set: 10 <= 5 + 5


def test_budget_exceeded_lines_are_explained_only_by_a_cap_or_a_tenant_budget() -> None:
    history = clean_history()
    record = history.batches["batch_1"]
    record.output_lines.pop()
    record.error_lines.append(error_line("b", "budget_exceeded", status=None))
    record.request_counts = {"total": 3, "completed": 1, "failed": 2}
    record.cost = {"input_tokens": 3, "output_tokens": 5}
    assert kinds(history) == {"unexplained": 1}
    record.max_cost_usd = "100"
    assert check(history).ok
    record.max_cost_usd = None
    history.controls = [ControlEvent("budget", "t", None, T0 + 1, T0 + 2, value="100", spent_usd="0")]
    assert check(history).ok


def test_an_answer_cut_short_at_expiry_while_paused_is_not_progress() -> None:
    history = paused_history()  # the window closed inside the pause: its lines end, b cut from its tokens
    history.rows["batch_1"][1] = RowRecord("b", "completed", T0 + 5.5, "run-1", row_id="batch_req_b")
    assert kinds(history) == {"paused_progress": 1}
    line = next(line for line in history.batches["batch_1"].output_lines if line["custom_id"] == "b")
    line["response"]["body"]["backfill"] = {"cut_by": "expiry"}
    assert "paused_progress" not in kinds(history)


def test_a_result_recorded_after_a_paused_batchs_window_closed_is_not_progress() -> None:
    history = paused_history()  # the window closed at T0+5, inside the pause: b's answer ended the line
    history.rows["batch_1"][1] = RowRecord("b", "completed", T0 + 5.5, "run-1", row_id="batch_req_b")
    history.batches["batch_1"].expires_at = T0 + 6
    assert kinds(history) == {"paused_progress": 1}
    history.batches["batch_1"].expires_at = T0 + 5
    assert "paused_progress" not in kinds(history)
