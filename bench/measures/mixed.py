"""Rows of the mixed-lines race against vLLM's run-batch (bench/mixed_lines.py, issue 37)."""

from __future__ import annotations

from typing import Any

from bench.measures.entry import entry

SPEEDUP_GOAL = 1.0  # issue 37: run-batch's seconds / Backfill's, start-ups excluded


def mixed_lines_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The speedup (goal >= 1.0, every line answered on both sides), the kinds of line it mixed and what was left
    out, and both sides' seconds."""
    left_out = "; ".join(f"{kind} left out: {why}" for kind, why in r["kinds_left_out"].items()) or "none left out"
    workload = (
        f"{r['lines']} chat lines of kinds {'+'.join(r['kinds'])} ({left_out}), {r['output_tokens_each']} output "
        f"tokens each, max_num_seqs {r['max_num_seqs']}"
    )
    speedup = r["speedup"]
    return [
        entry(
            "mixed_lines_speedup_vs_run_batch",
            speedup,
            f"x run-batch once per model, start-ups excluded ({workload})",
            f">= {SPEEDUP_GOAL}",
            speedup >= SPEEDUP_GOAL and r["backfill_all_ok"] and r["run_batch_all_ok"],
        ),
        entry("mixed_lines_kinds", r["kinds"], "kinds of line in the batch"),
        entry("mixed_lines_backfill_seconds", r["backfill_seconds"], "s (first upload to last output, server up)"),
        entry("mixed_lines_run_batch_seconds", r["run_batch_seconds"], "s (its work, start-ups excluded)"),
    ]
