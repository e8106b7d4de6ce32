"""The lora-packing rows: the goals are met only with every line answered, and where the time went is shown."""

from __future__ import annotations

from typing import Any

from bench.measures import measures


def part(share: float, *, all_ok: bool = True, detail: bool = True) -> dict[str, Any]:
    result: dict[str, Any] = {
        "adapters": 8,
        "lines_per_job": 48,
        "output_tokens_each": 32,
        "max_num_seqs": 64,
        "max_loras": 8,
        "backfill_seconds": 100.0,
        "backfill_adapter_swaps": 0,
        "run_batch_seconds": 160.0,
        "run_batch_jobs_run": 4,
        "run_batch_startup_and_shutdown_seconds": 300.0,
        "ceiling_seconds": 100.0 * share,
        "speedup_vs_run_batch": 1.6,
        "share_of_ceiling": share,
        "backfill_all_ok": all_ok,
        "run_batch_all_ok": True,
    }
    if detail:
        result |= {
            "backfill_poll_seconds": 1.0,
            "backfill_engine_busy_seconds": 97.0,
            "backfill_engine_steps": 194,
            "backfill_mean_running": 63.3,
            "backfill_server_cpu_seconds": 110.0,
            "backfill_api_thread_cpu_seconds": 3.0,
            "backfill_client_cpu_seconds": 3.0,
            "ceiling_before_and_after_seconds": [90.0, 100.0],
            "ceiling_adapter_load_seconds": 0.02,
            "ceiling_engine_busy_seconds": 94.0,
            "ceiling_engine_steps": 192,
            "ceiling_mean_running": 64.0,
            "ceiling_cpu_seconds": 100.0,
            "rounds": 3,
            "round_shares_of_ceiling": [0.8, 0.95, 1.1],
        }
    return {"lora-packing": result}


def by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in rows}


def test_the_share_of_the_ceiling_meets_its_goal_at_0_9_with_every_line_answered() -> None:
    assert by_name(measures(part(0.95)))["lora_packing_share_of_ceiling"]["met"] is True
    assert by_name(measures(part(0.85)))["lora_packing_share_of_ceiling"]["met"] is False
    assert by_name(measures(part(0.95, all_ok=False)))["lora_packing_share_of_ceiling"]["met"] is False
    assert by_name(measures(part(0.95)))["lora_packing_share_of_ceiling"]["goal"] == ">= 0.9"


def test_the_rows_say_where_backfills_time_went() -> None:
    rows = by_name(measures(part(0.95)))
    assert rows["lora_packing_outside_steps_seconds"]["value"] == 3.0
    assert rows["lora_packing_seconds_per_step"]["value"] == 0.5
    assert "the ceiling's: 64.0" in rows["lora_packing_mean_running"]["unit"]
    assert "4 of the 8 jobs run" in rows["lora_packing_run_batch_seconds"]["unit"]
    assert "just before (90.0 s)" in rows["lora_packing_ceiling_seconds"]["unit"]
    assert "the median of 3 alternating rounds: [0.8, 0.95, 1.1]" in rows["lora_packing_share_of_ceiling"]["unit"]


def test_an_older_output_without_the_engine_figures_still_gives_its_rows() -> None:
    rows = by_name(measures(part(0.79, detail=False)))
    assert rows["lora_packing_share_of_ceiling"]["value"] == 0.79
    assert "lora_packing_engine_steps" not in rows
