"""Rows of the lora-packing part (bench/lora_packing.py, issue 39)."""

from __future__ import annotations

from typing import Any

from bench.measures.entry import entry

SPEEDUP_GOAL = 1.0  # run-batch once per job (start-ups excluded) / Backfill
CEILING_GOAL = 0.9  # issue 39: Backfill's share of the ceiling (a bare LLM.chat with every line at once)


def lora_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Backfill vs run-batch per job and vs the ceiling, with every side's seconds and the swaps of the run."""
    workload = (
        f"{r['adapters']} adapters x {r['lines_per_job']} lines as {r['adapters']} jobs, {r['output_tokens_each']} "
        f"output tokens each, max_num_seqs {r['max_num_seqs']}, max_loras {r['max_loras']}"
    )
    ok = r["backfill_all_ok"] and r["run_batch_all_ok"]
    return [
        entry(
            "lora_packing_speedup_vs_run_batch",
            r["speedup_vs_run_batch"],
            f"x run-batch once per job, start-ups excluded ({workload})",
            f">= {SPEEDUP_GOAL}",
            r["speedup_vs_run_batch"] >= SPEEDUP_GOAL and ok,
        ),
        entry(
            "lora_packing_share_of_ceiling",
            r["share_of_ceiling"],
            "of a bare LLM.chat with every line at once (ceiling seconds / Backfill seconds)",
            f">= {CEILING_GOAL}",
            r["share_of_ceiling"] >= CEILING_GOAL and ok,
        ),
        entry("lora_packing_backfill_seconds", r["backfill_seconds"], "s (first upload to last output, server up)"),
        entry("lora_packing_run_batch_seconds", r["run_batch_seconds"], "s (its work, start-ups excluded)"),
        entry(
            "lora_packing_run_batch_startups_seconds",
            r["run_batch_startup_and_shutdown_seconds"],
            "s (run-batch's start-ups and shut-downs, one per job, not in its seconds)",
        ),
        entry("lora_packing_ceiling_seconds", r["ceiling_seconds"], "s (bare LLM.chat, start-up excluded)"),
        entry("lora_packing_adapter_swaps", r["backfill_adapter_swaps"], "adapter swaps in Backfill's run"),
    ]
