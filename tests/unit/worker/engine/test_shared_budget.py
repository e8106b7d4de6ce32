"""The shared-mode dispatch budget: grow slowly into idle capacity, give it back at once to online users."""

from __future__ import annotations

import pytest

from storage.registry import SharedModeSpec
from worker.engine.shared_budget import (
    DispatchBudget,
    MetricsError,
    ServerLoad,
    StepModel,
    decide,
    parse_load,
    slack_cap,
)

SLOTS = 8


def knobs(**overrides: object) -> SharedModeSpec:
    """The default knobs, but one slot of headroom, which keeps the arithmetic below small."""
    return SharedModeSpec(server_url="http://127.0.0.1:1", **{"headroom_seqs": 1, **overrides})  # type: ignore[arg-type]


def load(running: int, waiting: int = 0, kv: float = 0.1) -> ServerLoad:
    return ServerLoad(running=running, waiting=waiting, kv_usage=kv)


def test_an_idle_server_is_filled_one_step_per_sample_up_to_all_slots_but_the_headroom() -> None:
    budget = DispatchBudget(knobs(), slots=SLOTS)
    limits = []
    for _ in range(10):
        ours = budget.limit  # the runner keeps the budget full
        limits.append(budget.update(load(running=ours), ours=ours).limit)
    assert limits == [1, 2, 3, 4, 5, 6, 7, 7, 7, 7]


def test_running_online_requests_shrink_the_budget_at_once_to_the_slots_they_leave_free() -> None:
    decision = decide(7, load(running=7 + 3), ours=7, slots=SLOTS, knobs=knobs(), urgent=False)
    # 3 online requests already run beside our 7 (slots were briefly oversubscribed): room = 8 - 3 - 1.
    assert (decision.online, decision.room, decision.limit, decision.reason) == (3, 4, 4, "shrink")
    assert decision.yield_count == 0  # nobody waits: our extra requests just finish and are not replaced


def test_online_requests_waiting_halve_the_budget_and_give_back_one_slot_per_waiting_request() -> None:
    # All 8 slots busy (7 ours + 1 online), 2 more online requests queued behind them.
    decision = decide(7, load(running=8, waiting=2), ours=7, slots=SLOTS, knobs=knobs(), urgent=False)
    assert decision.online == 3 and decision.online_waiting == 2
    assert decision.limit == 3  # int(7 * 0.5), under room 8 - 3 - 1 = 4
    assert decision.yield_count == 2


def test_waiting_requests_that_are_our_own_are_not_taken_for_online_ones() -> None:
    # 8 of ours run and 2 of ours wait (preempted): nothing here is online, so the budget may still grow.
    decision = decide(10, load(running=8, waiting=2), ours=10, slots=SLOTS, knobs=knobs(), urgent=False)
    assert decision.online == 0 and decision.online_waiting == 0 and decision.yield_count == 0
    assert decision.limit == 7  # clamped to the room, not shrunk by half


def test_a_request_waiting_beside_a_free_slot_is_only_arriving_and_makes_nobody_yield() -> None:
    # 6 of ours + 1 online run, 1 request just sent waits for the next engine step: a slot is free.
    decision = decide(7, load(running=7, waiting=1), ours=7, slots=SLOTS, knobs=knobs(), urgent=False)
    assert decision.online_waiting == 0 and decision.yield_count == 0
    assert decision.limit == 6  # not halved: only the room left by the 1 online request caps it


def test_an_online_request_waiting_for_kv_cache_makes_the_youngest_batch_work_yield() -> None:
    decision = decide(4, load(running=5, waiting=1, kv=0.97), ours=4, slots=SLOTS, knobs=knobs(), urgent=False)
    assert decision.online_waiting == 1 and decision.limit == 2 and decision.yield_count == 1


def test_high_kv_cache_usage_shrinks_the_budget_although_nobody_waits() -> None:
    decision = decide(6, load(running=6, kv=0.95), ours=6, slots=SLOTS, knobs=knobs(), urgent=False)
    assert (decision.limit, decision.reason, decision.yield_count) == (3, "shrink", 0)


def test_after_a_burst_the_budget_recovers_additively() -> None:
    budget = DispatchBudget(knobs(), slots=SLOTS)
    budget.limit = 6
    # 5 online requests arrive (3 of them queue), then finish; ours drain to what the budget allows.
    trace = [load(8, 3), load(5, 0), load(3, 0), load(2, 0), load(2, 0), load(2, 0)]
    ours = [6, 3, 3, 2, 2, 2]
    limits = [budget.update(sample, ours=mine).limit for sample, mine in zip(trace, ours, strict=True)]
    assert limits == [2, 3, 4, 5, 6, 7]  # room 8 - 5 - 1 = 2 first, then one more per sample


def test_ceiling_floor_and_urgency() -> None:
    capped = decide(4, load(running=4), ours=4, slots=SLOTS, knobs=knobs(max_inflight=4), urgent=False)
    assert capped.limit == 4
    busy = load(running=8, waiting=5)  # the server is full of online work
    floor = knobs(min_inflight=1, urgent_extra_inflight=2)
    assert decide(2, busy, ours=2, slots=SLOTS, knobs=floor, urgent=False).limit == 1
    urgent = decide(2, busy, ours=2, slots=SLOTS, knobs=floor, urgent=True)
    assert urgent.limit == 3 and urgent.yield_count == 0  # urgency takes slots from online, within its limit
    huge = decide(8, busy, ours=8, slots=SLOTS, knobs=knobs(min_inflight=8, urgent_extra_inflight=8), urgent=True)
    assert huge.limit == SLOTS  # never more than the server has


def test_yielding_can_be_turned_off() -> None:
    decision = decide(7, load(8, 2), ours=7, slots=SLOTS, knobs=knobs(yield_to_online=False), urgent=False)
    assert decision.limit == 3 and decision.yield_count == 0


@pytest.mark.parametrize("online", range(SLOTS))
def test_batch_work_never_takes_the_slot_an_arriving_online_request_needs(online: int) -> None:
    """Whatever the budget was, after one sample batch + online + headroom fit in the server's slots."""
    for limit in range(SLOTS + 1):
        ours = min(limit, SLOTS - online)
        decision = decide(limit, load(running=ours + online), ours=ours, slots=SLOTS, knobs=knobs(), urgent=False)
        assert decision.limit + online + 1 <= SLOTS or decision.limit == 0


METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="demo"} 3.0
vllm:num_requests_running{engine="1",model_name="demo"} 2.0
vllm:num_requests_waiting{engine="0",model_name="demo"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="demo",reason="capacity"} 9.0
vllm:kv_cache_usage_perc{engine="0",model_name="demo"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="demo"} 0.5
vllm:num_preemptions_total{engine="0",model_name="demo"} 4.0
"""


def test_metrics_add_up_over_engines_and_take_the_fullest_kv_cache() -> None:
    assert parse_load(METRICS) == ServerLoad(running=5, waiting=1, kv_usage=0.5)


def test_a_page_without_the_vllm_gauges_is_refused() -> None:
    with pytest.raises(MetricsError, match="vllm:kv_cache_usage_perc"):
        parse_load("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n")


# -- the latency slack: a step-time model fitted to the server's own inter-token latency -----------------


def test_the_step_model_recovers_fixed_and_per_sequence_cost_from_noisy_samples() -> None:
    model = StepModel()
    assert model.fit() is None
    for i in range(200):
        sequences = 1 + i % 8
        noise = 0.0002 if i % 3 == 0 else -0.0001
        model.observe(sequences, 0.004 + 0.00025 * sequences + noise)
    fit = model.fit()
    assert fit is not None
    fixed, per_seq = fit
    assert fixed == pytest.approx(0.004, abs=0.0002) and per_seq == pytest.approx(0.00025, abs=0.00003)


def test_the_step_model_needs_samples_at_several_batch_sizes_and_keeps_its_last_fit() -> None:
    model = StepModel()
    for _ in range(50):
        model.observe(6, 0.006)
    assert model.fit() is None  # one batch size says nothing about the slope
    for sequences in (1, 8) * 10:
        model.observe(sequences, 0.004 + 0.00025 * sequences)
    first = model.fit()
    assert first is not None
    for _ in range(2000):  # the cap then holds the batch at one size: the old samples fade, the fit stays
        model.observe(2, 0.0045)
    assert model.fit() == first


def test_the_slack_cap_is_small_when_compute_bound_and_large_when_memory_bound() -> None:
    # A CPU: 4.2 ms fixed + 0.25 ms per sequence. 10% slack over an online-only step of 1-2 sequences.
    assert slack_cap((0.0042, 0.00025), slack=0.10, online=0) == 1
    assert slack_cap((0.0042, 0.00025), slack=0.10, online=3) == 1
    # 70B FP8 on 8xH100: 70 GB of weights vs ~0.33 GB of KV per 2k-token sequence, per step.
    assert slack_cap((70 / 26.8e3, 0.33 / 26.8e3), slack=0.10, online=1) == 21
    assert slack_cap((0.0042, 0.0), slack=0.10, online=0) is None  # no measurable cost per sequence
    # A step so compute-bound that one sequence already costs more than the slack: still one, never none
    # (at none, no batch work would run, no samples would come, and the fit could never be corrected).
    assert slack_cap((0.001, 0.001), slack=0.10, online=0) == 1
    assert slack_cap((0.0042, 0.00025), slack=None, online=0) is None  # knob off


def test_with_a_latency_slack_the_budget_keeps_batch_work_under_the_cap() -> None:
    step = (0.0042, 0.00025)  # cap = int(0.1 * (16.8 + online))
    idle = decide(7, load(running=7), ours=7, slots=SLOTS, knobs=knobs(latency_slack=0.1), urgent=False, step=step)
    assert idle.slack_cap == 1 and idle.limit == 1
    assert idle.yield_count == 0  # the extra calls finish; none is cancelled (it would prefill twice)
    beside = decide(7, load(running=8), ours=7, slots=SLOTS, knobs=knobs(latency_slack=0.1), urgent=False, step=step)
    assert beside.limit == 1 and beside.yield_count == 0
    waiting = decide(
        7, load(running=8, waiting=2), ours=7, slots=SLOTS, knobs=knobs(latency_slack=0.1), urgent=False, step=step
    )
    assert waiting.limit == 1 and waiting.yield_count == 2  # online users queue: yield as without the slack
    urgent = decide(1, load(running=1), ours=1, slots=SLOTS, knobs=knobs(latency_slack=0.1), urgent=True, step=step)
    assert urgent.limit == 2  # work near its deadline still gets urgent_extra_inflight
    unfitted = decide(3, load(running=3), ours=3, slots=SLOTS, knobs=knobs(latency_slack=0.1), urgent=False)
    assert unfitted.slack_cap is None and unfitted.limit == 4  # no model yet: grow and so gather samples


def test_the_budget_fits_its_step_model_from_successive_metrics_samples() -> None:
    budget = DispatchBudget(knobs(latency_slack=0.1), slots=SLOTS)
    seconds = tokens = 0.0
    for _ in range(40):
        running = max(1, budget.limit)
        tokens += 50 * running
        seconds += 50 * running * (0.0042 + 0.00025 * running)
        budget.update(ServerLoad(running, 0, 0.1, itl_seconds=seconds, itl_tokens=tokens), ours=running)
    fit = budget.steps.fit()
    assert fit is not None and fit[1] == pytest.approx(0.00025, rel=0.05)
    assert budget.limit == 1  # the cap found from the fit


def test_metrics_pages_carry_the_inter_token_latency_counters() -> None:
    page = METRICS + (
        'vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 12.5\n'
        'vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 2500\n'
    )
    parsed = parse_load(page)
    assert (parsed.itl_seconds, parsed.itl_tokens) == (12.5, 2500)
    assert parse_load(METRICS).itl_seconds is None


def test_a_latency_slack_on_a_server_without_latency_counters_is_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = DispatchBudget(knobs(latency_slack=0.1), slots=SLOTS)
    for _ in range(3):
        decision = budget.update(parse_load(METRICS), ours=0)
    assert decision.slack_cap is None
    warnings = [r for r in caplog.records if "is set but /metrics has no" in r.getMessage()]
    assert len(warnings) == 1
