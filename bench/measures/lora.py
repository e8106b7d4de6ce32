"""Rows of the lora-packing part (bench/lora_packing.py, issue 39)."""

from __future__ import annotations

from typing import Any

from bench.measures.entry import entry

SPEEDUP_GOAL = 1.0  # run-batch once per job (start-ups excluded) / Backfill
CEILING_GOAL = 0.9  # issue 39: Backfill's share of the ceiling (a bare LLM.chat with every line at once)


def lora_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Backfill vs run-batch per job and vs the ceiling, with every side's seconds and the swaps of the run; where
    the time went (engine steps, running sequences per step, seconds outside steps, CPU) when the part measured it."""
    workload = (
        f"{r['adapters']} adapters x {r['lines_per_job']} lines as {r['adapters']} jobs, {r['output_tokens_each']} "
        f"output tokens each, max_num_seqs {r['max_num_seqs']}, max_loras {r['max_loras']}"
    )
    ok = r["backfill_all_ok"] and r["run_batch_all_ok"]
    sampled = r.get("run_batch_jobs_run", r["adapters"])
    run_batch_unit = "s (its work, start-ups excluded)" + (
        f"; {sampled} of the {r['adapters']} jobs run, their mean x {r['adapters']}" if sampled < r["adapters"] else ""
    )
    ceiling_unit = "s (bare LLM.chat, start-up excluded)"
    if (bracket := r.get("ceiling_before_and_after_seconds")) is not None:
        ceiling_unit = (
            f"s (bare LLM.chat, start-up excluded, adapter loads ({r['ceiling_adapter_load_seconds']} s) counted in;"
            f" the mean of a run just before ({bracket[0]} s) and just after ({bracket[1]} s) Backfill's)"
        )
    rows = [
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
            "of a bare LLM.chat with every line at once (ceiling seconds / Backfill seconds)"
            + (
                f"; the median of {r['rounds']} alternating rounds: {r['round_shares_of_ceiling']}"
                if "round_shares_of_ceiling" in r
                else ""
            ),
            f">= {CEILING_GOAL}",
            r["share_of_ceiling"] >= CEILING_GOAL and ok,
        ),
        entry(
            "lora_packing_backfill_seconds",
            r["backfill_seconds"],
            "s (first upload to last output, server up"
            + (
                f"; each job {'long-polled (up to' if r.get('backfill_long_polls') else 'polled every'}"
                f" {r['backfill_poll_seconds']} s{')' if r.get('backfill_long_polls') else ''})"
                if "backfill_poll_seconds" in r
                else ")"
            ),
        ),
        entry("lora_packing_run_batch_seconds", r["run_batch_seconds"], run_batch_unit),
        entry(
            "lora_packing_run_batch_startups_seconds",
            r["run_batch_startup_and_shutdown_seconds"],
            "s (run-batch's start-ups and shut-downs, one per job, not in its seconds)",
        ),
        entry("lora_packing_ceiling_seconds", r["ceiling_seconds"], ceiling_unit),
        entry(
            "lora_packing_adapter_swaps",
            r["backfill_adapter_swaps"],
            "adapter swaps in Backfill's run"
            + (
                " (since the server started: rounds after the first count each adapter coming back)"
                if "round_shares_of_ceiling" in r
                else ""
            ),
        ),
    ]
    if "backfill_engine_steps" in r:
        rows += [
            entry(
                "lora_packing_engine_steps",
                r["backfill_engine_steps"],
                f"engine steps in Backfill's run (the ceiling's: {r['ceiling_engine_steps']})",
            ),
            entry(
                "lora_packing_mean_running",
                r["backfill_mean_running"],
                f"sequences per engine step in Backfill's run, of max_num_seqs {r['max_num_seqs']} (the ceiling's:"
                f" {r['ceiling_mean_running']})",
            ),
            entry(
                "lora_packing_outside_steps_seconds",
                round(r["backfill_seconds"] - r["backfill_engine_busy_seconds"], 2),
                "s of Backfill's clock outside engine steps (uploads, ingest, first claim, finalize, downloads)",
            ),
            entry(
                "lora_packing_seconds_per_step",
                round(r["backfill_engine_busy_seconds"] / max(1, r["backfill_engine_steps"]), 3),
                f"s per engine step in Backfill's run (the ceiling's:"
                f" {round(r['ceiling_engine_busy_seconds'] / max(1, r['ceiling_engine_steps']), 3)})",
            ),
            entry(
                "lora_packing_cpu_seconds",
                round(r["backfill_server_cpu_seconds"] + r["backfill_client_cpu_seconds"], 2),
                f"CPU s of Backfill's server ({r['backfill_server_cpu_seconds']}, its API thread"
                f" {r['backfill_api_thread_cpu_seconds']}) and the polling client ({r['backfill_client_cpu_seconds']});"
                f" the ceiling's: {r['ceiling_cpu_seconds']}",
            ),
        ]
    return rows
