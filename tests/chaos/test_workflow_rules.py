"""The checker's workflow rules (tests/chaos/workflow_rules.py: merged, continued, trial, billed) on synthetic
histories, and the workload's workflow plan."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from tests.chaos.decode_rules import record_decode
from tests.chaos.history import BatchRecord, ControlEvent, History, RowRecord, check
from tests.chaos.synthetic_histories import T0, clean_history, error_line, output_line
from tests.chaos.workflow import CONTINUE, SHORT_WINDOWS, draw_finishes, plan_workflow
from tests.chaos.workload import SIZES, plan_workload

CHECKS = {"regex": "(lorem|ipsum|dolor)( .*)?", "max_attempts": 3}


def drawn(line: dict[str, Any], count: int) -> dict[str, Any]:
    failed = [{"attempt": i + 1, "check": "regex", "message": "no match"} for i in range(count - 1)]
    return {**line, "attempts": {"count": count, "failed": failed}}


def workflow_history() -> History:
    """The clean history as a checked batch with a one-line trial: line a answered at its second draw (billed
    both draws: 10 tokens), b at its first (5), c built to fail; the engines finished a twice and b once."""
    history = clean_history()
    history.faults = []
    record = history.batches["batch_1"]
    record.checks = CHECKS
    record.trial = {"lines": 1, "status": "reported", "report": {"lines_run": 1, "decision": "continued"}}
    record.output_lines[0] = drawn(record.output_lines[0], 2)
    record.cost = {"input_tokens": 6, "output_tokens": 15}
    history.rows["batch_1"] = [
        RowRecord("a", "completed", T0 + 5, "run-1", None, 10, trial=True, row_id="batch_req_a"),
        RowRecord("b", "completed", T0 + 5, "run-1", None, 5, row_id="batch_req_b"),
        RowRecord("c", "failed", T0 + 5, "run-1", "invalid_value", 0, row_id="batch_req_c"),
    ]
    history.finishes = {"batch_req_a": [5, 5], "batch_req_b": [5]}
    history.generated = {"batch_req_a": 10, "batch_req_b": 5}
    history.merged["batch_1"] = record.output_lines + record.error_lines
    return history


def findings(history: History, kind: str) -> list[str]:
    return [f.detail for f in check(history).findings if f.kind == kind]


def test_a_clean_workflow_history_passes() -> None:
    verdict = check(workflow_history())
    assert verdict.ok, verdict.findings


def test_a_merged_view_holding_a_line_twice_or_missing_one_is_flagged() -> None:
    history = workflow_history()
    lines = history.merged["batch_1"]
    history.merged["batch_1"] = [lines[0], lines[0], lines[2]]
    assert findings(history, "merged") == ["merged view lacks ['b']", "a in 2 merged lines"]


def test_a_line_billed_for_more_draws_than_the_engine_finished_is_flagged() -> None:
    history = workflow_history()
    history.rows["batch_1"][0] = RowRecord(
        "a", "completed", T0 + 5, "run-1", None, 15, trial=True, row_id="batch_req_a"
    )
    history.batches["batch_1"].cost = {"input_tokens": 6, "output_tokens": 20}
    assert findings(history, "billed") == [
        "a: billed 15 completion tokens: not between its answer's 5 and its 2 longest finished answers' 10"
    ]


def test_attempts_the_engine_never_finished_or_the_checks_do_not_allow_are_flagged() -> None:
    history = workflow_history()
    history.finishes["batch_req_a"] = [5]
    assert findings(history, "billed") == ["a: 2 attempts but the engines finished 1 answers"]
    record = history.batches["batch_1"]
    record.output_lines[0] = drawn(output_line("a"), 4)
    assert "a: 4 attempts, the batch allows 3" in findings(history, "billed")


def test_checks_failed_before_every_draw_was_made_is_flagged() -> None:
    history = workflow_history()
    record = history.batches["batch_1"]
    failed = error_line("b", "checks_failed", status=422)
    failed["attempts"] = {"count": 2, "failed": [{"attempt": 1}, {"attempt": 2}]}
    record.output_lines.pop(1)
    record.error_lines.append(failed)
    record.request_counts = {"total": 3, "completed": 1, "failed": 2}
    record.cost = {"input_tokens": 3, "output_tokens": 10}
    history.rows["batch_1"][1] = RowRecord("b", "failed", T0 + 5, "run-1", "checks_failed", 10, row_id="batch_req_b")
    history.merged["batch_1"] = record.output_lines + record.error_lines
    assert findings(history, "billed") == ["b: checks_failed after 2 of 3 draws"]
    assert findings(history, "unexplained") == []  # a checked batch's checks_failed line is explained


def test_a_trial_line_the_engine_finished_twice_is_flagged_unless_a_fault_interrupted_work() -> None:
    history = workflow_history()
    history.batches["batch_1"].output_lines[0] = output_line("a", completion=5)  # one draw, but finished twice
    history.rows["batch_1"][0] = RowRecord("a", "completed", T0 + 5, "run-1", None, 5, trial=True, row_id="batch_req_a")
    history.batches["batch_1"].cost = {"input_tokens": 6, "output_tokens": 10}
    history.merged["batch_1"] = history.batches["batch_1"].output_lines + history.batches["batch_1"].error_lines
    assert findings(history, "trial") == ["trial line a finished 2 times for 1 draws"]
    history.faults = clean_history().faults  # a kill -9 of the GPU worker: a finished answer may go unrecorded
    assert findings(history, "trial") == []


def test_a_trial_that_marked_or_reported_other_than_it_asked_is_flagged() -> None:
    history = workflow_history()
    history.batches["batch_1"].trial = {"share": 0.5, "status": "reported", "report": {"lines_run": 1}}
    assert findings(history, "trial") == ["trial of 2 lines marked 1, reported 1"]


def continued_history(*, merged_from_child: bool = True, child_known: bool = True) -> History:
    """batch_1 (short window, on_expiry) expired with b still running: b continues in batch_2, which answered it."""
    history = workflow_history()
    history.batches["batch_1"].checks = None
    history.batches["batch_1"].output_lines[0] = output_line("a")
    history.rows["batch_1"][0] = RowRecord("a", "completed", T0 + 5, "run-1", None, 5, row_id="batch_req_a")
    history.batches["batch_1"].trial = None
    origin = history.batches["batch_1"]
    origin.status, origin.window, origin.on_expiry = "expired", SHORT_WINDOWS[0], CONTINUE
    expired = error_line("b", "batch_expired", status=None)
    expired["error"]["message"] = "The window expired; it continues in the background in batch batch_2."
    origin.output_lines.pop(1)
    origin.error_lines.append(expired)
    origin.request_counts = {"total": 3, "completed": 1, "failed": 2}
    origin.cost = {"input_tokens": 3, "output_tokens": 5}
    history.rows["batch_1"] = history.rows["batch_1"][:1]
    answer = {**output_line("b"), "id": "batch_req_b2"}
    child = BatchRecord(
        batch_id="batch_2", tenant="t", input_file_id="file-1", created_at=T0 + 4, status="completed",
        request_counts={"total": 1, "completed": 1, "failed": 0}, cost={"input_tokens": 3, "output_tokens": 5},
        output_lines=[answer], terminal_at=T0 + 9, downloaded=True, retry_of="batch_1", retry_expected=["b"],
        window="background",
    )  # fmt: skip
    if child_known:
        history.batches["batch_2"] = child
    history.finishes["batch_req_b2"] = [5]
    history.merged["batch_1"] = [
        origin.output_lines[0],
        answer if merged_from_child else expired,
        origin.error_lines[0],
    ]
    return history


def test_a_continued_line_answered_by_its_child_passes() -> None:
    verdict = check(continued_history())
    assert verdict.ok, verdict.findings


def test_a_merged_view_still_giving_the_expired_line_of_a_continued_line_is_flagged() -> None:
    assert findings(continued_history(merged_from_child=False), "continued") == [
        "the merged view gives b from batch_req_b, not from its child batch_2"
    ]


def test_a_continuation_naming_an_unknown_child_or_none_is_flagged() -> None:
    assert findings(continued_history(child_known=False), "continued") == [
        "b continues in batch_2, which is not a retry of it we know"
    ]
    history = continued_history()
    history.batches["batch_1"].error_lines[1]["error"]["message"] = "The completion window expired."
    assert findings(history, "continued") == ["b expired without a child though the batch continues in the background"]


def test_the_workflow_plan_keeps_the_seeds_lines_and_draws_trials_checks_and_windows() -> None:
    plan = plan_workload(random.Random("workload/3"), model="m", size=SIZES["default"])
    mixed = plan_workflow(plan, random.Random("workflow/3"))
    assert [p.lines for p in mixed] == [p.lines for p in plan] and [p.bodies for p in mixed] == [p.bodies for p in plan]
    many = [b for seed in range(20) for b in plan_workflow(plan, random.Random(f"workflow/{seed}"))]
    assert any("trial" in b.workflow for b in many) and any("checks" in b.workflow for b in many)
    assert any(b.window in SHORT_WINDOWS and b.workflow.get("on_expiry") == CONTINUE for b in many)
    assert all(2 <= b.workflow["checks"]["max_attempts"] <= 3 for b in many if "checks" in b.workflow)


def test_a_lines_draws_are_its_finishes_across_hand_backs_less_an_answer_continued_after_one() -> None:
    ledger = "\n".join(
        [
            "h 1 chaos-model",
            "b 1 req-a 0 1", "f 1 15",  # a draw that failed its checks
            "b 2 req-a 0 1", "a 2",  # the redraw, handed back by a pause: its next claim goes on with it
            "b 3 req-a 0 1", "f 3 15",  # the redraw again, from the prompt (a redraw's seed resumes nothing)
            "b 5 req-b 0 1", "f 5 7", "b 6 req-b 0 1", "a 6",  # b: one draw finished, the next handed back
            "b 7 req-c 0 1", "f 7 9", "b 8 req-c 8 1", "f 8 9",  # c's answer, handed back unstored, continued
            "b 9 req-d 0 1", "a 9",  # d: nothing finished
            "f 9",  # torn by a kill
        ]
    )  # fmt: skip
    assert draw_finishes(ledger) == {"req-a": [15, 15], "req-b": [7], "req-c": [9]}


def test_a_checked_lines_failed_draws_are_judged_answers_not_discarded_decode(tmp_path: Path) -> None:
    history = workflow_history()  # a answered at its second draw: the engine finished two 5-token answers
    draws = [(1, "batch_req_a"), (2, "batch_req_a"), (3, "batch_req_b")]
    ledger = ["h 1 chaos-model"]
    for seq, rid in draws:  # each draw: 5 steps of one token, then its finish
        ledger += [f"b {seq} {rid} 0 1", *[f"s {seq}"] * 5, f"f {seq} 5"]
    (tmp_path / "decode-1-x.log").write_text("\n".join(ledger) + "\n")
    record_decode(history, tmp_path)
    assert history.decode is not None
    assert (history.decode["decoded"], history.decode["discarded"]) == (15, 0)


def test_a_continued_lines_decode_is_counted_once_over_its_origin_and_its_child(tmp_path: Path) -> None:
    history = continued_history()  # b ran 8 tokens in batch_1, then its child resumed from 6 and ended at 10
    child_line = history.batches["batch_2"].output_lines[0]
    child_line["response"]["body"]["usage"]["completion_tokens"] = 10
    history.batches["batch_2"].cost = {"input_tokens": 3, "output_tokens": 10}
    history.rows["batch_2"] = [
        RowRecord("b", "completed", T0 + 8, "run-2", None, 10, row_id="batch_req_b2", copy_of="batch_req_b")
    ]
    ledger = ["h 1 chaos-model", "b 1 batch_req_a 0 1", *["s 1"] * 5, "f 1 5"]
    ledger += ["b 2 batch_req_b 0 1", *["s 2"] * 8, "a 2", "b 3 batch_req_b2 6 1", *["s 3"] * 4, "f 3 10"]
    (tmp_path / "decode-1-x.log").write_text("\n".join(ledger) + "\n")
    record_decode(history, tmp_path)
    assert history.decode is not None
    figures = {k: history.decode[k] for k in ("decoded", "delivered", "discarded", "unaccounted")}
    assert figures == {"decoded": 17, "delivered": 15, "discarded": 2, "unaccounted": 0}


def test_a_trial_line_of_a_batch_paused_before_its_result_was_stored_is_not_judged() -> None:
    history = workflow_history()
    history.batches["batch_1"].output_lines[0] = output_line("a", completion=5)  # one draw, but finished twice
    history.rows["batch_1"][0] = RowRecord("a", "completed", T0 + 5, "run-1", None, 5, trial=True, row_id="batch_req_a")
    history.batches["batch_1"].cost = {"input_tokens": 6, "output_tokens": 10}
    history.merged["batch_1"] = history.batches["batch_1"].output_lines + history.batches["batch_1"].error_lines
    history.controls.append(ControlEvent("pause", "t", "batch_1", T0 + 2, T0 + 2.1))
    history.controls.append(ControlEvent("resume", "t", "batch_1", T0 + 3, T0 + 3.1))
    assert findings(history, "trial") == []


def test_a_continued_lines_draws_count_those_its_origin_made() -> None:
    history = continued_history()  # b failed its first draw in batch_1; its copy in batch_2 made the second
    child = history.batches["batch_2"]
    child.checks = history.batches["batch_1"].checks = CHECKS
    child.output_lines[0] = drawn(child.output_lines[0], 2)
    child.cost = {"input_tokens": 6, "output_tokens": 10}
    history.merged["batch_1"][1] = child.output_lines[0]
    history.rows["batch_2"] = [
        RowRecord("b", "completed", T0 + 8, "run-2", None, 10, row_id="batch_req_b2", copy_of="batch_req_b")
    ]
    history.finishes["batch_req_b"] = [5]
    assert findings(history, "billed") == []
    del history.finishes["batch_req_b"]
    assert findings(history, "billed") == ["b: 2 attempts but the engines finished 1 answers"]
