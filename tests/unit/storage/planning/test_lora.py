"""The planner's LoRA overhead: the extra FLOPs of rank r on the target projections, as a factor on a line's work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storage.planning.lora import adapter_factor, lora_factor, lora_flops_per_token, target_shapes
from storage.planning.node import ModelShape
from worker.engine.demo_adapter import DEMO_SHAPES

LLAMA_7B = {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
            "vocab_size": 32000}  # fmt: skip
DEMO = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 4096, "tie_word_embeddings": True}  # fmt: skip


def base(tmp_path: Path, config: dict[str, object]) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_the_extra_flops_are_2_r_d_in_plus_d_out_per_target_per_layer() -> None:
    assert lora_flops_per_token(rank=16, layers=32, projections=[(4096, 4096)]) == 32 * 2 * 16 * 8192
    assert lora_flops_per_token(rank=8, layers=4, projections=[(256, 128), (768, 256)]) == 4 * 2 * 8 * (384 + 1024)
    assert lora_factor(base_parameters=1e6, rank=1, layers=1, projections=[(500, 500)]) == pytest.approx(1.001)


def test_rank_16_on_a_llama_7b_costs_under_one_percent_and_grows_with_rank_and_targets(tmp_path: Path) -> None:
    path = base(tmp_path, LLAMA_7B)
    parameters = ModelShape.from_hf_config(LLAMA_7B).parameter_count
    q_v = adapter_factor(path, rank=16, targets=["q_proj", "v_proj"])
    assert q_v == pytest.approx(1 + 32 * 2 * 16 * (8192 + 8192) / (2 * parameters))
    every = adapter_factor(path, rank=16, targets="all-linear")
    assert 1.001 < q_v < every < 1.01  # ~+0.12 % and ~+0.6 %
    assert adapter_factor(path, rank=64, targets="all-linear") - 1 == pytest.approx(4 * (every - 1))
    assert adapter_factor(path, rank=16, targets=r".*\.(q|v)_proj") == q_v  # PEFT's regular-expression form


def test_the_demo_adapter_adds_a_few_percent_and_an_unknown_base_adds_nothing(tmp_path: Path) -> None:
    factor = adapter_factor(base(tmp_path, DEMO), rank=8, targets=list(DEMO_SHAPES))
    assert factor == pytest.approx(1.037, abs=0.001)
    assert adapter_factor("fake:", rank=8, targets=["q_proj"]) == 1.0  # no config.json: nothing to model
    assert adapter_factor(str(tmp_path / "missing"), rank=8, targets=["q_proj"]) == 1.0


def test_target_names_may_be_full_module_paths_and_unknown_ones_cost_nothing() -> None:
    assert target_shapes(["model.layers.0.self_attn.q_proj"], DEMO_SHAPES) == [DEMO_SHAPES["q_proj"]]
    assert target_shapes(["c_attn"], DEMO_SHAPES) == []
    assert target_shapes("(", DEMO_SHAPES) == list(DEMO_SHAPES.values())  # invalid pattern: the upper bound
