"""Rows of the prefix-heavy race against vLLM's run-batch (bench/prefix_race.py, issue 22 section 5)."""

from __future__ import annotations

from typing import Any

from bench.measures.entry import entry

SPEEDUP_GOAL = 2.0  # issue 22 §5: x run-batch, its start-ups excluded, at either KV size (and the race's plot)


def prefix_race_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Per KV size: the speedup (run-batch's start-ups excluded; goal >= 2.0), with them counted, both sides'
    hit rates and the control with prefix ordering off. Rows of the large cache end in `_large_kv`."""
    prompts = "shared by the tenants" if r["shared_prompts"] else "each tenant its own"
    workload = (
        f"{r['tenants']} tenants x {r['lines_per_job']} lines, {r['prompts']} system prompts of 800-1,000 tokens"
        f" ({prompts}), max_num_seqs {r['max_num_seqs']}"
    )
    rows: list[dict[str, Any]] = []
    for size, suffix, what in (("small", "", "smaller than the prompts need"), ("large", "_large_kv", "holds all")):
        if (race := r.get(size)) is None:
            continue
        cache = f"KV cache {race['kv_cache_tokens']} tokens, {what}"
        speedup = race["speedup"]
        rows += [
            entry(
                f"prefix_heavy_speedup_vs_run_batch{suffix}",
                speedup,
                f"x run-batch once per job, its start-ups excluded ({workload}; {cache})",
                f">= {SPEEDUP_GOAL}",
                speedup >= SPEEDUP_GOAL and race["all_ok"],
            ),
            entry(
                f"prefix_heavy_speedup_startups_counted{suffix}",
                race["speedup_startups_counted"],
                "x run-batch, every start-up counted (its one per job, Backfill's one)",
            ),
            entry(f"prefix_heavy_backfill_hit_rate{suffix}", race["backfill"]["hit_rate"], "share of prompt tokens"),
            entry(f"prefix_heavy_run_batch_hit_rate{suffix}", race["run_batch"]["hit_rate"], "share of prompt tokens"),
            entry(
                f"prefix_heavy_backfill_seconds{suffix}", race["backfill"]["seconds"], "s (first upload to last output)"
            ),
            entry(f"prefix_heavy_run_batch_seconds{suffix}", race["run_batch"]["seconds"], "s (start-ups excluded)"),
        ]
        if race.get("ideal") is not None:
            rows += [
                entry(
                    f"prefix_heavy_ideal_speedup_vs_run_batch{suffix}",
                    race["ideal_speedup"],
                    "x run-batch: bare LLM.generate on every line at once, prefix-sorted (the ceiling of any scheduler"
                    " on this engine and these settings)",
                ),
                entry(
                    f"prefix_heavy_backfill_share_of_ideal{suffix}",
                    race["backfill_share_of_ideal"],
                    "x the ceiling's speed (its seconds / Backfill's end-to-end seconds)",
                ),
            ]
        if (off := race.get("backfill_ordering_off")) is not None:
            rows += [
                entry(
                    f"prefix_heavy_speedup_ordering_off{suffix}",
                    race["speedup_ordering_off"],
                    "x run-batch (control: BACKFILL_PREFIX_ORDERING=false)",
                ),
                entry(
                    f"prefix_heavy_backfill_hit_rate_ordering_off{suffix}", off["hit_rate"], "share of prompt tokens"
                ),
            ]
    return rows
