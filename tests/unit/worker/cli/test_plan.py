"""`backfill plan`: the JSON interface scripts rely on, the table, and one-line errors with exit 2."""

from __future__ import annotations

import argparse
import json
from decimal import Decimal
from pathlib import Path

import pytest

from worker.cli import plan as plan_command

WORKED_EXAMPLE = [
    "--weights-gb",
    "70.6",
    "--kv-bytes-per-token",
    "327680",
    "--context",
    "4096",
    "--hardware",
    "8xH100-SXM",
]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="backfill")
    plan_command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["plan", *argv])
    code: int = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_has_rows_knee_and_max(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli([*WORKED_EXAMPLE, "--batch-sizes", "1,8,32,128,384", "--format", "json"], capsys)
    result = json.loads(out)
    assert code == 0
    assert [r["batch_size"] for r in result["rows"]] == [1, 8, 32, 128, 384]
    assert result["knee_batch_size"] == 53
    assert result["max_batch_size"] == 424
    one, big = result["rows"][0], result["rows"][-1]
    assert {"tpot_ms", "node_tokens_per_s", "user_tokens_per_s", "usd_per_mtok", "memory_gb", "fits"} <= one.keys()
    assert one["tpot_ms"] == pytest.approx(2.7, abs=0.05)
    assert round(one["node_tokens_per_s"]) == 373
    assert Decimal(one["usd_per_mtok"]).quantize(Decimal("0.01")) == Decimal("23.80")
    assert big["tpot_ms"] == pytest.approx(21.9, abs=0.05)
    assert big["memory_gb"] == pytest.approx(586, abs=0.5)
    assert big["fits"] is True


def test_table_output_shows_rows_and_knee(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli([*WORKED_EXAMPLE, "--batch-sizes", "1,384"], capsys)
    assert code == 0
    assert "23.80" in out
    assert "knee batch size: 53" in out
    assert "max batch size:  424" in out


def test_config_json_and_hardware_numbers_replace_presets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = {
        "hidden_size": 8192,
        "num_hidden_layers": 80,
        "intermediate_size": 28672,
        "vocab_size": 128256,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    hardware = ["--gpus", "8", "--hbm-gb", "80", "--hbm-tbps", "3.35", "--gpu-hour-usd", "3.99"]
    argv = ["--config-json", str(path), "--weight-dtype", "fp8", "--kv-dtype", "bf16", *hardware]
    code, out, _ = run_cli([*argv, "--batch-sizes", "1", "--format", "json"], capsys)
    result = json.loads(out)
    assert code == 0
    assert result["model"]["kv_bytes_per_token"] == 327680
    assert result["hardware"]["usd_per_hour"] == "31.92"
    assert Decimal(result["rows"][0]["usd_per_mtok"]) == pytest.approx(Decimal("23.8"), abs=Decimal("0.05"))


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--weights-gb", "70.6"], "--kv-bytes-per-token"),
        ([*WORKED_EXAMPLE[:4], "--hardware", "8xB200"], "unknown hardware preset"),
        ([*WORKED_EXAMPLE, "--context", "0"], "--context"),
        (["--weights-gb", "-1", "--kv-bytes-per-token", "327680"], "--weights-gb"),
        ([*WORKED_EXAMPLE, "--gpus", "0"], "--gpus"),
        ([*WORKED_EXAMPLE, "--gpu-hour-usd", "free"], "--gpu-hour-usd"),
        ([*WORKED_EXAMPLE, "--batch-sizes", "1,0"], "--batch-sizes"),
        (["--config-json", "/nonexistent/config.json"], "cannot read"),
    ],
)
def test_bad_input_is_one_line_on_stderr_with_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(argv, capsys)
    assert code == 2
    assert out == ""
    assert needle in err
    assert err.count("\n") == 1


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([*WORKED_EXAMPLE, "--gpus", "100000000000000000000000"], "--gpus"),
        ([*WORKED_EXAMPLE[2:], "--weights-gb", "1e308"], "--weights-gb"),
        ([*WORKED_EXAMPLE[2:], "--weights-gb", "inf"], "--weights-gb"),
        (["--weights-gb", "70.6", "--kv-bytes-per-token", "1e-320", "--context", "4096"], "--kv-bytes-per-token"),
        ([*WORKED_EXAMPLE, "--gpu-hour-usd", "1e999999999"], "--gpu-hour-usd"),
        ([*WORKED_EXAMPLE, "--batch-sizes", "1," + "9" * 40], "--batch-sizes"),
    ],
)
def test_out_of_range_numbers_are_refused_at_once_not_computed_forever(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == "" and needle in err and err.count("\n") == 1


@pytest.mark.timeout(20)
def test_the_largest_node_the_bounds_allow_is_planned_in_closed_form(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--weights-gb",
        "0.001",
        "--kv-bytes-per-token",
        "1",
        "--context",
        "1",
        "--gpus",
        "4096",
        "--format",
        "json",
    ]
    code, out, _ = run_cli(argv, capsys)
    assert code == 0
    plan = json.loads(out)
    assert plan["max_batch_size"] == 4096 * 80 * 10**9 - 10**6


def test_the_plan_shows_the_prefill_clock_and_a_prompt_heavy_jobs_cost(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli([*WORKED_EXAMPLE, "--batch-sizes", "384"], capsys)
    assert code == 0
    assert "x 0.5 efficiency = 56,062 prompt tokens/s" in out
    assert "job: 10,000 requests x 2,000 prompt + 10 output tokens" in out
    assert "compute-bound, limited by the token budget" in out
    assert "TTFT 292.2 ms" in out and "TPOT 292.2 ms" in out
    code, out, _ = run_cli([*WORKED_EXAMPLE, "--batch-sizes", "384", "--format", "json"], capsys)
    result = json.loads(out)
    assert result["prefill"]["prompt_tokens_per_s"] == pytest.approx(56_062, abs=1)
    job = result["job"]
    assert (job["prompt_tokens"], job["output_tokens"], job["bound"]) == (2000, 10, "compute")
    assert Decimal("3.1") < Decimal(job["usd"]) < Decimal("3.3")


def test_job_and_efficiency_flags_change_the_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*WORKED_EXAMPLE, "--batch-sizes", "384", "--format", "json", "--efficiency", "0.25"]
    argv += ["--prompt-tokens", "8", "--output-tokens", "4000", "--max-num-seqs", "384"]
    code, out, _ = run_cli(argv, capsys)
    result = json.loads(out)
    assert code == 0 and result["prefill"]["prompt_tokens_per_s"] == pytest.approx(28_031, abs=1)
    assert (result["job"]["bound"], result["job"]["limited_by"]) == ("memory", "slots")
    code, out, err = run_cli([*WORKED_EXAMPLE, "--prompt-tokens", "0"], capsys)
    assert code == 2 and "--prompt-tokens" in err
