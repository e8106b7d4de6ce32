"""The checker's batch-control rules (issue 20, tests/chaos/control_rules.py) on synthetic histories: a retry
(rerun), a pause (paused_progress), a spend cap and a tenant budget (overrun, budget_exceeded lines)."""

from __future__ import annotations

from tests.chaos.control_rules import paused_spans
from tests.chaos.history import BatchRecord, ControlEvent, History, RowRecord, check
from tests.chaos.synthetic_histories import T0, clean_history, error_line, kinds, output_line


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
