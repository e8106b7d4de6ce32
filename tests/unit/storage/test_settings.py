"""Settings: bad values fail at start naming the variable; the model registry sizes batches from the planner."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from pydantic import ValidationError

from storage.planning.roofline import HARDWARE_PRESETS, ModelShape, max_num_seqs_for
from storage.registry import ModelSpec
from storage.settings import SHUTDOWN_MARGIN_SECONDS, Settings
from storage.windows import window_seconds

LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("BACKFILL_LEASE_SECONDS", "soon"),
        ("BACKFILL_DATABASE_URL", "mysql://x"),
        ("BACKFILL_MODELS", "{not json"),
        ("BACKFILL_COMPLETION_WINDOWS", '{"24h": "0.5", "forever": "0.9"}'),
    ],
)
def test_a_bad_setting_stops_the_cli_naming_the_variable(variable: str, value: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", "migrate"],
        env={"PATH": "/usr/bin:/bin", "BACKFILL_DATA_DIR": str(tmp_path), variable: value},
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert result.returncode == 2
    assert variable in result.stderr


def test_embedded_default_needs_no_configuration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings()
    assert settings.embedded and settings.sqlalchemy_url.startswith("sqlite:///")
    models = settings.served_models()
    assert {"backfill-demo", "backfill-demo-vl", "all-MiniLM-L6-v2", "backfill-demo-embed"} <= set(models)
    assert next(iter(models)) == "backfill-demo"  # the worker's model when none is named
    assert models["backfill-demo-vl"].serves("/v1/chat/completions")
    assert models["backfill-demo"].serves("/v1/chat/completions") and models["backfill-demo"].serves("/v1/responses")
    assert models["all-MiniLM-L6-v2"].serves("/v1/embeddings")
    assert models["backfill-demo-embed"].serves("/v1/embeddings")  # Matryoshka: `dimensions` shortens its vectors
    assert not models["all-MiniLM-L6-v2"].serves("/v1/chat/completions")
    assert (models["all-MiniLM-L6-v2"].runner, models["all-MiniLM-L6-v2"].dtype) == ("pooling", "bfloat16")
    assert settings.completion_windows == {
        "24h": 0.5,
        "background": Decimal("0.6"),
    }  # background: no deadline, deeper discount
    assert settings.batch_file_expires_seconds == 30 * 86400


@pytest.mark.parametrize("seconds", ["60", "2592001", "-1"])
def test_a_batch_file_expiry_outside_openais_range_stops_the_start(
    seconds: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BACKFILL_BATCH_FILE_EXPIRES_SECONDS", seconds)
    with pytest.raises(ValidationError):
        Settings()


def test_windows_parse_units() -> None:
    assert [window_seconds(w) for w in ("30s", "90m", "24h", "7d")] == [30, 5400, 86400, 604800]
    with pytest.raises(ValueError):
        window_seconds("1w")


def test_max_num_seqs_can_come_from_the_planner(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B))
    spec = ModelSpec(
        path=str(tmp_path),
        tensor_parallel_size=8,
        max_model_len=4096,
        max_num_seqs_from_planner=True,
        weight_dtype="fp8",
        kv_dtype="bf16",
        gpu_memory_utilization=0.9,
    )
    shape = ModelShape.from_hf_config(LLAMA_70B, weight_dtype="fp8", kv_dtype="bf16")
    expected = max_num_seqs_for(shape, HARDWARE_PRESETS["8xH100-SXM"], 4096, memory_fraction=0.9, cap=1024)
    assert spec.resolved_max_num_seqs() == expected
    assert 300 < expected < 424  # fewer than the 424 that fit in all 640 GB, far more than a default of 64
    assert ModelSpec(path=str(tmp_path), max_num_seqs=32).resolved_max_num_seqs() == 32
    with pytest.raises(ValueError):
        ModelSpec(path=str(tmp_path), max_num_seqs_from_planner=True, hardware="1xTPU")


def test_a_sigterm_drain_leaves_the_margin_of_the_grace_for_the_checkpoints_and_the_exit(tmp_path: Path) -> None:
    def budget(drain: int, grace: int, elapsed: float = 0.0) -> float:
        settings = Settings(data_dir=tmp_path, shutdown_drain_seconds=drain, shutdown_grace_seconds=grace)
        return settings.shutdown_drain_budget(elapsed=elapsed)

    assert SHUTDOWN_MARGIN_SECONDS == 10
    assert budget(10, 30) == 10  # the defaults: the drain fits as asked
    assert budget(60, 30) == 20  # a 30 s spot notice: drain 20 s, 10 s left to write and exit
    assert budget(60, 30, elapsed=4.5) == 15.5  # the grace counts from SIGTERM, not from Celery's stop
    assert budget(60, 120) == 60
    assert budget(10, 5) == 0  # a grace shorter than the margin: checkpoint at once
    assert budget(10, 30, elapsed=25) == 0
