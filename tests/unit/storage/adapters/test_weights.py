"""An adapter's weights are checked at registration: what the base model's engine cannot load is refused, saying why."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from storage.adapters.weights import InvalidAdapter, check_adapter
from worker.engine.demo_adapter import DEMO_SHAPES, write_adapter

DEMO_CONFIG = {
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
}


@pytest.fixture
def base(tmp_path: Path) -> str:
    folder = tmp_path / "base"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(DEMO_CONFIG))
    return str(folder)


def check(folder: Path, base: str, *, max_rank: int = 16, max_bytes: int = 10**8) -> object:
    return check_adapter(folder, base_path=base, max_rank=max_rank, max_bytes=max_bytes)


def test_a_demo_adapter_passes_with_its_rank_and_targets(tmp_path: Path, base: str) -> None:
    write_adapter(tmp_path / "a", seed=1, rank=8)
    facts = check(tmp_path / "a", base)
    assert facts.rank == 8 and "q_proj" in facts.target_modules  # type: ignore[attr-defined]


def test_a_rank_above_max_lora_rank_is_refused(tmp_path: Path, base: str) -> None:
    write_adapter(tmp_path / "a", seed=1, rank=16)
    with pytest.raises(InvalidAdapter, match="rank 16 is above the base model's max_lora_rank 8"):
        check(tmp_path / "a", base, max_rank=8)


def test_a_corrupt_safetensors_file_is_refused(tmp_path: Path, base: str) -> None:
    write_adapter(tmp_path / "a", seed=1)
    weights = tmp_path / "a" / "adapter_model.safetensors"
    weights.write_bytes(b"garbage")
    with pytest.raises(InvalidAdapter, match="not a safetensors file"):
        check(tmp_path / "a", base)
    weights.write_bytes(struct.pack("<Q", 10**6) + b"{}")  # a header longer than the file
    with pytest.raises(InvalidAdapter, match="header is longer than the file"):
        check(tmp_path / "a", base)


def test_a_truncated_weights_file_is_refused(tmp_path: Path, base: str) -> None:
    write_adapter(tmp_path / "a", seed=1)
    weights = tmp_path / "a" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(InvalidAdapter, match="lies outside its data"):
        check(tmp_path / "a", base)


def test_an_adapter_of_another_architecture_is_refused(tmp_path: Path, base: str) -> None:
    wider = {name: (fan_in * 2, fan_out * 2) for name, (fan_in, fan_out) in DEMO_SHAPES.items()}
    write_adapter(tmp_path / "wide", seed=1, shapes=wider)
    with pytest.raises(InvalidAdapter, match="does not fit the base model"):
        check(tmp_path / "wide", base)
    write_adapter(tmp_path / "deep", seed=1, layers=8)
    with pytest.raises(InvalidAdapter, match="layer 4, which the base model does not have"):
        check(tmp_path / "deep", base)
    write_adapter(tmp_path / "other", seed=1, shapes={"query_key_value": (256, 768)})
    with pytest.raises(InvalidAdapter, match="query_key_value"):
        check(tmp_path / "other", base)


def test_missing_files_a_non_lora_config_and_too_many_bytes_are_refused(tmp_path: Path, base: str) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidAdapter, match=r"needs adapter_config\.json and adapter_model\.safetensors"):
        check(tmp_path / "empty", base)
    write_adapter(tmp_path / "a", seed=1)
    with pytest.raises(InvalidAdapter, match="BACKFILL_ADAPTER_MAX_BYTES"):
        check(tmp_path / "a", base, max_bytes=1000)
    config = tmp_path / "a" / "adapter_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "peft_type": "IA3"}))
    with pytest.raises(InvalidAdapter, match="LoRA adapter"):
        check(tmp_path / "a", base)
    config.write_text(json.dumps({"peft_type": "LORA", "r": 8, "target_modules": ["q_proj"], "use_dora": True}))
    with pytest.raises(InvalidAdapter, match="DoRA"):
        check(tmp_path / "a", base)


def test_a_2_gb_adapter_is_refused_by_its_size_before_a_byte_of_it_is_read(
    tmp_path: Path, base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_adapter(tmp_path / "huge", seed=1)
    with (tmp_path / "huge" / "adapter_model.safetensors").open("r+b") as weights:
        weights.truncate(2 * 1024**3)  # sparse: 2 GiB on paper, nothing written

    def read(*args: object, **kwargs: object) -> None:
        raise AssertionError("the weights were read")

    monkeypatch.setattr("storage.adapters.weights._read_header", read)
    monkeypatch.setattr("storage.adapters.weights._read_config", read)
    with pytest.raises(InvalidAdapter, match=r"is 2147\d+ bytes; at most 268435456 \(BACKFILL_ADAPTER_MAX_BYTES\)"):
        check(tmp_path / "huge", base, max_bytes=256 * 1024 * 1024)
