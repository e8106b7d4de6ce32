"""The step-time formula: decode stays the seed's memory-bound clock, prefill is the compute-bound one."""

from __future__ import annotations

from decimal import Decimal

import pytest

from storage.planning.node import HARDWARE_PRESETS, LLAMA_70B_FP8, PREFILL_EFFICIENCY
from storage.planning.roofline import Job, plan
from storage.planning.step_time import (
    StepLoad,
    bound,
    compute_seconds,
    estimate_job,
    memory_seconds,
    prefill_tokens_per_s,
    step_seconds,
    ttft_alone_seconds,
)

H100 = HARDWARE_PRESETS["8xH100-SXM"]
CONTEXT = 4096


@pytest.mark.parametrize(("batch", "tpot_ms", "usd"), [(1, 2.7, "23.80"), (8, None, "3.36"), (384, 21.9, "0.51")])
def test_the_seeds_decode_rows_hold_within_2_percent(batch: int, tpot_ms: float | None, usd: str) -> None:
    row = plan(LLAMA_70B_FP8, H100, CONTEXT, [batch]).rows[0]
    if tpot_ms is not None:
        assert row.tpot_ms == pytest.approx(tpot_ms, rel=0.02)
    assert row.usd_per_mtok == pytest.approx(Decimal(usd), rel=Decimal("0.02"))


def test_decode_is_memory_bound_at_every_batch_that_fits() -> None:
    for batch in (1, 32, 128, 384, 424):
        assert bound(LLAMA_70B_FP8, H100, CONTEXT, StepLoad(decode_seqs=batch)) == "memory"


def test_70b_fp8_on_8xh100_prefills_about_56000_prompt_tokens_a_second_at_half_the_datasheet() -> None:
    assert PREFILL_EFFICIENCY == 0.5 and H100.compute_efficiency == 0.5
    # 8 x 1,979 TFLOPS x 0.5 / (2 x 70.6 GFLOP per token)
    assert prefill_tokens_per_s(LLAMA_70B_FP8, H100) == pytest.approx(56_062, abs=1)
    assert plan(LLAMA_70B_FP8, H100, CONTEXT, [1]).to_dict()["prefill"]["prompt_tokens_per_s"] == pytest.approx(
        56_000, rel=0.01
    )


def test_a_full_prefill_step_is_compute_bound_and_sets_the_step_for_its_decodes_too() -> None:
    mixed = StepLoad(decode_seqs=100, prefill_tokens=16_284)
    assert bound(LLAMA_70B_FP8, H100, CONTEXT, mixed) == "compute"
    assert step_seconds(LLAMA_70B_FP8, H100, CONTEXT, mixed) == pytest.approx(16_384 / 56_062, rel=1e-3)
    assert memory_seconds(LLAMA_70B_FP8, H100, CONTEXT, mixed) < compute_seconds(LLAMA_70B_FP8, H100, mixed) / 10


def test_the_prefill_chunk_moves_its_own_kv_cache_too() -> None:
    alone = memory_seconds(LLAMA_70B_FP8, H100, CONTEXT, StepLoad(prefill_tokens=1000))
    later_chunk = memory_seconds(
        LLAMA_70B_FP8, H100, CONTEXT, StepLoad(prefill_tokens=1000, prefill_context_tokens=3000)
    )
    assert alone == pytest.approx((70.6e9 + 1000 * 327680) / 26.8e12)
    assert later_chunk - alone == pytest.approx(3000 * 327680 / 26.8e12)


def test_a_long_prompt_alone_waits_for_its_chunks() -> None:
    one = ttft_alone_seconds(LLAMA_70B_FP8, H100, CONTEXT, 2000)
    assert one == pytest.approx(2000 / 56_062, rel=0.01)
    chunked = ttft_alone_seconds(LLAMA_70B_FP8, H100, CONTEXT, 2000, max_num_batched_tokens=512)
    assert chunked == pytest.approx(one, rel=0.01)  # compute-bound: the same FLOPs in 4 steps
    tiny = ttft_alone_seconds(LLAMA_70B_FP8, H100, CONTEXT, 10)
    assert tiny == pytest.approx(70.6e9 / 26.8e12, rel=0.01)  # a short prompt costs one weight read


def test_a_job_whose_prompts_dominate_runs_at_the_prefill_rate_not_the_decode_tables() -> None:
    job = plan(LLAMA_70B_FP8, H100, CONTEXT, [384], job=Job(10_000, 2000, 10)).job
    assert job is not None and job.bound == "compute" and job.limited_by == "token budget"
    assert job.prompt_tokens_per_s == pytest.approx(56_062, rel=0.01)
    assert job.requests_per_s == pytest.approx(56_062 / 2009, rel=0.01)
    assert job.seconds == pytest.approx(10_000 / job.requests_per_s, rel=0.01)
    # ~$3.20 for 20 M prompt tokens: the decode table's batch-384 price for its 100,000 output tokens
    # would be 5 cents, 60x too low.
    assert Decimal("3.1") < job.usd < Decimal("3.3")
    assert job.ttft_seconds == pytest.approx(job.step_seconds)  # a 2,000-token prompt fits one step's budget


def test_a_job_whose_outputs_dominate_holds_every_slot_at_the_decode_tables_tpot() -> None:
    job = estimate_job(
        LLAMA_70B_FP8, H100, CONTEXT, requests=5000, prompt_tokens=8, output_tokens=500, max_num_seqs=384
    )
    assert job.limited_by == "slots" and job.bound == "memory"
    assert job.step_seconds * 1e3 == pytest.approx(21.9, rel=0.01)
    assert job.output_tokens_per_s == pytest.approx(17_562, rel=0.01)


def test_nonpositive_job_inputs_are_rejected() -> None:
    with pytest.raises(ValueError):
        estimate_job(LLAMA_70B_FP8, H100, CONTEXT, requests=1, prompt_tokens=0, output_tokens=1, max_num_seqs=1)
