"""The shared-mode frontier on virtual time: the capacity within the latency goal, and prefill pacing."""

from __future__ import annotations

import argparse

import pytest

from bench.measures.timed import shared_sim_measures
from bench.shared_sim_frontier import _virtual, capacity_within_goal


def args(**overrides: object) -> argparse.Namespace:
    knobs: dict[str, object] = {
        "hardware": "8xH100-SXM",
        "online_prompt_words": 200,
        "online_tokens": 64,
        "batch_prompt_words": 500,
        "batch_tokens": 256,
        "max_num_seqs": 384,
        "max_num_batched_tokens": 8192,
        "long_prefill_token_threshold": 256,
        "headroom_seqs": 2,
        "seed": 7,
        "rates": [8.0],
    }
    return argparse.Namespace(**{**knobs, **overrides})


def test_the_capacity_within_the_goal_grows_with_the_slack_and_stays_far_under_the_idle_roofline() -> None:
    none, goal, loose = (capacity_within_goal(args(), 8.0, goal=g) for g in (1.0, 1.10, 1.5))
    assert none == 0.0  # no slack: any batch token lengthens a step
    assert 0 < goal < loose
    # The prompt-heavy batch job (502 prompt tokens per 256 output) runs ~18,000 tokens/s on an idle node; within
    # 1.10x of the online users' steps the step carrying an online prompt (compute-bound) leaves ~20 tokens a step.
    assert 1500 < goal < 3000


def test_a_paced_batch_prefills_about_its_pace_in_prompt_tokens_per_step() -> None:
    seconds = 5.0
    got = _virtual(args(), 8.0, seconds, prefill_tokens_per_step=4)
    steps_per_s = 1 / 0.0028  # a 70B FP8 decode step on 8x H100 with a few sequences
    prompts_per_s = 4 * steps_per_s / 502
    assert got["batch_tokens"] / seconds == pytest.approx(prompts_per_s * 256, rel=0.35)


def test_a_staged_batch_sends_its_prompts_as_pieces_over_the_prefix_cache_and_harvests_as_much_as_paced() -> None:
    seconds = 5.0
    paced = _virtual(args(), 8.0, seconds, prefill_tokens_per_step=10)
    staged = _virtual(args(), 8.0, seconds, prefill_tokens_per_step=10, stage_tokens=32)
    assert paced["pieces"] == 0 and paced["prefix_cache_hits"] == 0
    # 502-token prompts: 15 pieces each (32 .. 480), each finding the one before it cached, then the request itself.
    prompts = staged["pieces"] / 15
    assert staged["prefix_cache_hits"] == pytest.approx(prompts * (sum(range(0, 480, 32)) + 480), rel=0.1)
    # The pieces' one-token outputs are not harvest: the same pace takes about the same batch tokens.
    assert staged["batch_tokens"] == pytest.approx(paced["batch_tokens"], rel=0.15)


def test_the_measures_name_the_paced_budget_the_headline_and_report_both_harvest_readings() -> None:
    side = {
        "online_ttft_p99_ratio_worst": 1.08,
        "online_tpot_p99_ratio_worst": 1.02,
        "server_clock_ttft_p99_ratio_worst": 1.07,
        "server_clock_tpot_p99_ratio_worst": 1.01,
        "harvest_ratio": 0.2,
        "harvest_ratio_vs_idle_roofline": 0.02,
    }
    point = {"harvest_ratio": 0.17}
    result = {
        "rates": [{"online_rate_per_s": 8.0}],
        "summary": {
            "paced": side,
            "with": {**side, "online_ttft_p99_ratio_worst": 8.0, "harvest_ratio": 6.0},
            "slack": {**side, "harvest_ratio": 0.9},
        },
        "frontier": [
            {
                "capacity_within_goal_tokens_per_s": 2235.0,
                "paced": [point],
                "best_paced_within_goal": point,
                "best_inflight_within_goal": None,
            }
        ],
        "batch_alone": {"tokens_per_s": 18000.0, "server": {"scheduler_cpu_us_per_step": 40.0}},
    }
    rows = {row["name"]: row for row in shared_sim_measures(result)}
    assert rows["shared_sim_online_ttft_p99_ratio_worst"]["value"] == 1.08
    assert rows["shared_sim_default_online_ttft_p99_ratio_worst"]["value"] == 8.0
    assert rows["shared_sim_harvest_ratio"]["value"] == 0.2
    assert rows["shared_sim_harvest_ratio"]["met"] is False
    assert rows["shared_sim_default_harvest_ratio"]["met"] is False  # 6x the capacity, by taking the users' share
    assert rows["shared_sim_harvest_ratio_vs_idle_roofline"]["value"] == 0.02
    assert rows["shared_sim_slack_harvest_ratio"]["met"] is True  # 0.9 of it, both p99s within 1.10x
    assert rows["shared_sim_frontier_paced_harvest_ratio_within_latency_goal"]["value"] == 0.17
    assert rows["shared_sim_frontier_harvest_ratio_within_latency_goal"]["value"] == 0.0
    assert rows["shared_sim_capacity_within_latency_goal"]["value"] == 2235.0


def test_with_a_staged_side_the_headline_is_the_staged_budget_and_the_paced_one_is_named_paced() -> None:
    side = {
        "online_ttft_p99_ratio_worst": 1.3,
        "online_tpot_p99_ratio_worst": 1.06,
        "server_clock_ttft_p99_ratio_worst": 1.3,
        "server_clock_tpot_p99_ratio_worst": 1.06,
        "harvest_ratio": 0.8,
    }
    staged = {**side, "online_ttft_p99_ratio_worst": 1.09, "online_tpot_p99_ratio_worst": 1.03}
    result = {
        "rates": [{"online_rate_per_s": 8.0}],
        "summary": {"paced": side, "staged": staged},
        "batch_alone": {"tokens_per_s": 18000.0, "server": {"scheduler_cpu_us_per_step": 40.0}},
    }
    rows = {row["name"]: row for row in shared_sim_measures(result)}
    assert rows["shared_sim_online_ttft_p99_ratio_worst"]["value"] == 1.09
    assert "prefill paced and staged" in rows["shared_sim_online_ttft_p99_ratio_worst"]["unit"]
    assert rows["shared_sim_harvest_ratio"]["met"] is True  # 0.8 of the capacity, both p99s within 1.10x
    assert rows["shared_sim_paced_online_ttft_p99_ratio_worst"]["value"] == 1.3
    assert rows["shared_sim_paced_harvest_ratio"]["met"] is False
