"""The roofline planner reproduces the worked example in shared/inference-economics.txt."""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

import pytest

from storage.planning.roofline import (
    HARDWARE_PRESETS,
    Hardware,
    ModelShape,
    PlanRow,
    knee_batch_size,
    max_batch_size,
    max_num_seqs_for,
    plan,
)

# Llama 3.1 70B in FP8 with a 320 KiB/token KV cache, 4,096-token context, on 8x H100 SXM.
LLAMA_70B_FP8 = ModelShape(weight_bytes=70.6e9, kv_bytes_per_token=327680)
H100 = HARDWARE_PRESETS["8xH100-SXM"]
CONTEXT = 4096

LLAMA_70B_CONFIG = {
    "model_type": "llama",
    "hidden_size": 8192,
    "num_hidden_layers": 80,
    "intermediate_size": 28672,
    "vocab_size": 128256,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


@pytest.fixture(scope="module")
def worked_example() -> dict[int, PlanRow]:
    result = plan(LLAMA_70B_FP8, H100, CONTEXT, [1, 8, 32, 128, 384, 512])
    return {row.batch_size: row for row in result.rows}


def test_h100_node_costs_3192_an_hour_with_640_gb_and_26_8_tbps() -> None:
    assert H100.usd_per_hour == Decimal("31.92")
    assert H100.hbm_bytes == pytest.approx(640e9)
    assert H100.bandwidth_bytes_per_s == pytest.approx(26.8e12)


def test_one_user_at_a_time_costs_2380_per_million_tokens(worked_example: dict[int, PlanRow]) -> None:
    one = worked_example[1]
    assert one.tpot_ms == pytest.approx(2.7, abs=0.05)
    assert round(one.node_tokens_per_s) == 373
    assert one.user_tokens_per_s == one.node_tokens_per_s
    assert isinstance(one.usd_per_mtok, Decimal)
    assert one.usd_per_mtok.quantize(Decimal("0.01")) == Decimal("23.80")


def test_batch_of_eight_costs_336_per_million_tokens(worked_example: dict[int, PlanRow]) -> None:
    assert worked_example[8].usd_per_mtok.quantize(Decimal("0.01")) == Decimal("3.36")


def test_batch_of_384_costs_about_half_a_dollar_and_nearly_fills_memory(worked_example: dict[int, PlanRow]) -> None:
    big = worked_example[384]
    assert big.tpot_ms == pytest.approx(21.9, abs=0.05)
    assert round(big.user_tokens_per_s) == 46
    assert Decimal("0.50") <= big.usd_per_mtok <= Decimal("0.51")
    assert big.memory_gb == pytest.approx(586, abs=0.5)
    assert big.fits


def test_batching_cuts_cost_47x_and_slows_each_user_8x(worked_example: dict[int, PlanRow]) -> None:
    assert worked_example[1].usd_per_mtok / worked_example[384].usd_per_mtok == pytest.approx(47, abs=0.5)
    assert worked_example[384].tpot_ms / worked_example[1].tpot_ms == pytest.approx(8.1, abs=0.1)


def test_throughput_rises_only_24_percent_from_128_to_384(worked_example: dict[int, PlanRow]) -> None:
    gain = worked_example[384].node_tokens_per_s / worked_example[128].node_tokens_per_s
    assert gain == pytest.approx(1.24, abs=0.01)


def test_batch_of_512_does_not_fit_in_640_gb(worked_example: dict[int, PlanRow]) -> None:
    assert not worked_example[512].fits


def test_knee_is_where_kv_reads_equal_weight_reads() -> None:
    assert knee_batch_size(LLAMA_70B_FP8, CONTEXT) == 53
    assert plan(LLAMA_70B_FP8, H100, CONTEXT, [1]).knee_batch_size == 53


def test_max_batch_is_the_largest_that_fits() -> None:
    limit = max_batch_size(LLAMA_70B_FP8, H100, CONTEXT)
    rows = plan(LLAMA_70B_FP8, H100, CONTEXT, [limit, limit + 1]).rows
    assert limit == 424
    assert [r.fits for r in rows] == [True, False]


def test_long_context_deletes_the_batch() -> None:
    assert max_batch_size(LLAMA_70B_FP8, H100, 128 * 1024) == 13


def test_max_num_seqs_respects_cap_memory_fraction_and_floor_of_one() -> None:
    assert max_num_seqs_for(LLAMA_70B_FP8, H100, CONTEXT) == 424
    assert max_num_seqs_for(LLAMA_70B_FP8, H100, CONTEXT, cap=256) == 256
    assert max_num_seqs_for(LLAMA_70B_FP8, H100, CONTEXT, memory_fraction=0.9) < 424
    too_big = ModelShape(weight_bytes=700e9, kv_bytes_per_token=327680)
    assert max_batch_size(too_big, H100, CONTEXT) == 0
    assert max_num_seqs_for(too_big, H100, CONTEXT) == 1


def test_default_batch_sizes_include_knee_and_limit() -> None:
    sizes = [r.batch_size for r in plan(LLAMA_70B_FP8, H100, CONTEXT).rows]
    assert sizes[0] == 1
    assert 53 in sizes
    assert sizes[-1] == 424


def test_h200_preset_has_141_gb_at_4_8_tbps() -> None:
    h200 = HARDWARE_PRESETS["8xH200"]
    assert h200.hbm_bytes_per_gpu == 141e9
    assert h200.hbm_bandwidth_bytes_per_s_per_gpu == 4.8e12
    assert isinstance(h200.usd_per_gpu_hour, Decimal)


def test_config_json_of_llama_70b_gives_70_6_gb_at_fp8() -> None:
    shape = ModelShape.from_hf_config(LLAMA_70B_CONFIG, weight_dtype="fp8")
    assert shape.weight_bytes == pytest.approx(70.6e9, rel=0.005)
    # The worked example's 320 KiB/token is the KV cache at 16 bits (vLLM's "auto" for a bf16 model):
    # 2 (K and V) x 80 layers x 8 KV heads x 128 dims x 2 bytes.
    assert shape.kv_bytes_per_token == 327680


def test_config_json_kv_dtype_fp8_halves_the_cache() -> None:
    shape = ModelShape.from_hf_config(LLAMA_70B_CONFIG, weight_dtype="fp8", kv_dtype="fp8")
    assert shape.kv_bytes_per_token == 163840


def test_config_json_weight_dtype_scales_weights() -> None:
    bf16 = ModelShape.from_hf_config(LLAMA_70B_CONFIG)
    int4 = ModelShape.from_hf_config(LLAMA_70B_CONFIG, weight_dtype="int4")
    assert bf16.weight_bytes == pytest.approx(2 * 70.55e9, rel=0.005)
    assert int4.weight_bytes == pytest.approx(bf16.weight_bytes / 4)


def test_config_json_tied_embeddings_count_once() -> None:
    untied = ModelShape.from_hf_config(LLAMA_70B_CONFIG, weight_dtype="fp8")
    tied = ModelShape.from_hf_config({**LLAMA_70B_CONFIG, "tie_word_embeddings": True}, weight_dtype="fp8")
    assert untied.weight_bytes - tied.weight_bytes == 128256 * 8192


def test_config_json_without_dimensions_is_rejected() -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        ModelShape.from_hf_config({"num_hidden_layers": 2})
    with pytest.raises(ValueError, match="weight dtype"):
        ModelShape.from_hf_config(LLAMA_70B_CONFIG, weight_dtype="fp6")


@pytest.mark.parametrize(
    "make",
    [
        lambda: ModelShape(weight_bytes=0, kv_bytes_per_token=1),
        lambda: ModelShape(weight_bytes=1, kv_bytes_per_token=-1),
        lambda: Hardware(0, 80e9, 3.35e12, Decimal(1)),
        lambda: Hardware(8, 80e9, 3.35e12, Decimal(0)),
        lambda: plan(LLAMA_70B_FP8, H100, 0, [1]),
        lambda: plan(LLAMA_70B_FP8, H100, CONTEXT, [0]),
    ],
)
def test_nonpositive_inputs_are_rejected(make: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        make()
