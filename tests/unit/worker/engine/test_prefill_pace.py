"""Prefill pacing: batch prompt tokens per server step, at the pace of the server's own steps."""

from __future__ import annotations

import pytest

from storage.registry import SharedModeSpec
from worker.engine.prefill_pace import PrefillPacer
from worker.engine.shared_budget import DispatchBudget, ServerLoad


def test_until_the_servers_step_is_known_one_batch_request_is_out_at_a_time() -> None:
    pacer = PrefillPacer(4)
    assert pacer.tokens_per_s is None
    assert pacer.allows(0.0, busy=False)
    pacer.spend(500, 0.0)
    assert not pacer.allows(0.0, busy=True) and not pacer.allows(60.0, busy=True)
    assert pacer.allows(60.0, busy=False)  # the first one finished: the next may go


def test_prompt_tokens_go_out_at_tokens_per_step_over_the_servers_step() -> None:
    pacer = PrefillPacer(5)
    pacer.observe_step(0.005)  # 5 tokens a 5 ms step: 1,000 prompt tokens a second
    assert pacer.tokens_per_s == pytest.approx(1000)
    sent, now = 0, 0.0
    while now < 10.0:
        if pacer.allows(now, busy=True):
            pacer.spend(500, now)
            sent += 500
        now += 0.01
    assert sent == pytest.approx(10 * 1000, abs=500)  # 10 s at 1,000 tokens/s, give or take one prompt


def test_a_long_prompt_puts_the_bucket_in_debt_and_the_next_waits_for_it() -> None:
    pacer = PrefillPacer(1)
    pacer.observe_step(0.001)  # 1,000 tokens/s
    assert pacer.allows(0.0, busy=True)
    pacer.spend(2000, 0.0)
    assert not pacer.allows(1.9, busy=True)
    assert pacer.allows(2.01, busy=True)


def test_a_quiet_spell_saves_no_more_than_50_ms_so_two_prompts_never_go_out_together() -> None:
    pacer = PrefillPacer(1)
    pacer.observe_step(0.001)
    pacer.allows(0.0, busy=True)
    pacer.allows(3600.0, busy=True)  # an hour without batch work
    assert pacer.bucket == pytest.approx(50)  # 50 ms at 1,000 tokens/s, not an hour's
    pacer.spend(500, 3600.0)
    assert not pacer.allows(3600.0, busy=True)  # the second prompt waits for its share of time


def test_longer_steps_slow_the_pace() -> None:
    pacer = PrefillPacer(8)
    pacer.observe_step(0.002)
    fast = pacer.tokens_per_s
    pacer.observe_step(0.004)
    assert pacer.tokens_per_s == pytest.approx(fast / 2)  # type: ignore[operator]


def test_prompt_tokens_are_estimated_from_the_body_and_learnt_from_the_servers_counts() -> None:
    pacer = PrefillPacer(4)
    assert pacer.estimate(4000) == 1000  # four characters a token until the server says otherwise
    for _ in range(60):
        pacer.learn(4000, 500)  # this server's tokenizer: eight characters a token
    assert pacer.estimate(4000) == pytest.approx(500, rel=0.01)
    pacer.learn(0, 10)
    pacer.learn(100, 0)  # nothing to learn from an empty body or an answer without usage
    assert pacer.estimate(4000) == pytest.approx(500, rel=0.01)


def test_the_budget_paces_from_the_mean_inter_token_latency_between_two_polls() -> None:
    knobs = SharedModeSpec(server_url="http://127.0.0.1:1", batch_prefill_tokens_per_step=3)
    budget = DispatchBudget(knobs, slots=8)
    assert budget.pacer is not None and budget.pacer.tokens_per_s is None
    budget.update(ServerLoad(4, 0, 0.1, itl_seconds=10.0, itl_tokens=1000), ours=0)
    budget.update(ServerLoad(4, 0, 0.1, itl_seconds=10.3, itl_tokens=1100), ours=0)  # 100 tokens in 0.3 s
    assert budget.pacer.step_seconds == pytest.approx(0.003)
    assert budget.pacer.tokens_per_s == pytest.approx(1000)
    assert DispatchBudget(SharedModeSpec(server_url="http://127.0.0.1:1"), slots=8).pacer is None  # off by default
