"""Rows of the trial-projection part (bench/trial_projection.py, issue 40 §1): does the trial's 95% interval hold
the batch's actual cost about 95% of the time, and how far is the projection from it."""

from __future__ import annotations

from typing import Any

from bench.measures.entry import entry

# 95% nominal; over 60 files the share inside has a standard error of about 0.03, so 0.90-0.99 is "about 0.95"
# (an interval holding every cost is too wide to be worth its claim).
COVERAGE_GOAL = (0.90, 0.99)


def trial_projection_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Coverage over every file and per shape, the worst error, the median half-width, and each shape's first
    5,000-line batch: projected (interval) against actual."""
    low, high = COVERAGE_GOAL
    shapes = r["shapes"]
    files = ", ".join(f"{shape['runs']} {name}" for name, shape in shapes.items())
    rows = [
        entry(
            "trial_projection_coverage",
            r["coverage"],
            f"share of actual batch costs inside the trial's 95% interval ({r['runs']} files: {files}; fake engine)",
            f"{low}-{high}",
            low <= r["coverage"] <= high,
        )
    ]
    for name, shape in shapes.items():
        first = shape["first"]
        rows += [
            entry(
                f"trial_projection_coverage_{name}",
                shape["coverage"],
                f"{shape['inside']} of {shape['runs']} {name} files inside; errors up to {shape['error_pct_max_abs']}%,"
                f" median half-width {shape['half_width_pct_median']}%",
            ),
            entry(
                f"trial_projection_{name}_{first['lines']}_lines_error_pct",
                first["error_pct"],
                f"% projected vs actual, seed {first['seed']}: ${first['projected_usd']} (${first['interval_usd'][0]}-"
                f"${first['interval_usd'][1]}) vs ${first['actual_usd']}, a {first['trial_lines']}-line trial",
            ),
        ]
    return rows


def trial_projection_real_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The real engine's run (bench/trial_projection.py --engine demo): each file's projection (interval) against
    its actual cost, and how far what the lines stated was from what they used."""
    rows = []
    for run in r["all"]:
        tokens = run["tokens"]
        low, high = run["interval_usd"]
        name = f"trial_projection_real_{run['shape']}_{run['lines']}_lines"
        what = f"{run['lines']:,}-line {run['shape']} file (seed {run['seed']}), a {run['trial_lines']}-line trial"
        rows += [
            entry(
                f"{name}_projected_usd",
                run["projected_usd"],
                f"$ projected for the whole batch by the trial, 95% interval ${low}-${high}; {what}, real demo engine",
            ),
            entry(
                f"{name}_actual_usd",
                run["actual_usd"],
                f"$ billed for the whole batch ({tokens['completed']:,} lines completed in {run['seconds']} s)",
                f"inside ${low}-${high}",
                bool(run["actual_within_interval"]),
            ),
            entry(f"{name}_error_pct", run["error_pct"], "% projected vs actual"),
            entry(f"{name}_half_width_pct", run["half_width_pct"], "% of the actual cost: the interval's half-width"),
            entry(
                f"{name}_output_share",
                round(tokens["output"] / max(1, tokens["stated_output"]), 4),
                f"output tokens used / budgets stated ({tokens['output']:,} of {tokens['stated_output']:,}; "
                f"{tokens['stopped_before_budget']:,} lines stopped before their budget); prompt tokens "
                f"{tokens['input']:,} against {tokens['stated_input']:,} estimated",
            ),
        ]
    return rows
