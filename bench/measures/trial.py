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
