"""Which online requests make the TTFT tail, and why: the join of the simulated server's step trace with the
online requests' times, and the bootstrap interval of the p99 ratio."""

from __future__ import annotations

import pytest

from bench.shared_sim_summary import p99_ratio_interval
from bench.shared_sim_tail import attribute, breakdown, tags
from bench.sim_scheduler import StepTrace


def step(end: float, seconds: float, **kinds: float) -> StepTrace:
    made = {"online_prompts": 0, "online_prefill": 0, "online_decodes": 0, "piece_prefill": 0, "batch_prefill": 0}
    return StepTrace(end=end, seconds=seconds, **{"batch_seconds": 0.0, "batch_decodes": 0, **made, **kinds})


def test_a_request_is_joined_to_the_step_it_waited_out_and_the_step_that_prefilled_it() -> None:
    steps = [
        step(0.003, 0.003, batch_decodes=4, batch_seconds=0.003),  # batch alone: the server would have been idle
        step(0.011, 0.008, online_prompts=2, online_prefill=400, piece_prefill=32, batch_seconds=0.0006),
        step(0.014, 0.003, online_decodes=2),
    ]
    online = [
        {"arrival": 0.001, "first_token": 0.011, "first_sent": 0.0125},
        {"arrival": 0.0025, "first_token": 0.011, "first_sent": 0.0111},
    ]
    first, second = attribute(steps, online)
    assert first["ttft"] == pytest.approx(0.010) and first["own"] is steps[1] and first["cur"] is steps[0]
    assert first["residual"] == pytest.approx(0.002) and first["queued"] == 0
    assert tags(first) == ["collide", "own:piece", "busy", "late"]  # its first chunk left 1.5 ms after its step
    assert tags(second) == ["collide", "own:piece", "busy"]
    tail = breakdown([first, second], threshold=0.0095)
    assert tail["tail"] == 1 and tail["tags"] == {"collide": 1, "own:piece": 1, "busy": 1, "late": 1}
    assert tail["batch_ms_own_step"] == 0.6 and tail["batch_ms_step_in_progress"] == 2.0  # its wait for step 0


def test_a_request_that_found_the_server_idle_waited_for_no_step() -> None:
    steps = [step(0.004, 0.004, online_prompts=1, online_prefill=200)]
    (row,) = attribute(steps, [{"arrival": 0.0, "first_token": 0.004, "first_sent": 0.004}])
    assert row["cur"] is None and row["residual"] == 0.0 and tags(row) == []


def test_the_p99_ratio_interval_brackets_a_known_shift_and_is_one_for_equal_sides() -> None:
    base = [{"ok": True, "ttft": 0.001 * (1 + i % 50)} for i in range(500)]
    slower = [{**row, "ttft": row["ttft"] * 1.2} for row in base]
    low, high = p99_ratio_interval(base, base, "ttft") or (0, 0)
    assert low <= 1.0 <= high
    low, high = p99_ratio_interval(slower, base, "ttft") or (0, 0)
    assert low <= 1.2 <= high and high - low < 0.5
    assert p99_ratio_interval(base[:1], base, "ttft") is None
