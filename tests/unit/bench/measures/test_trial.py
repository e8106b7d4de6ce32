"""The trial-projection rows (bench/measures/trial.py): coverage about 95% is met, a too-wide one is not."""

from __future__ import annotations

from typing import Any

from bench.measures.trial import trial_projection_rows


def result(inside: int, runs: int = 20) -> dict[str, Any]:
    first = {"seed": 0, "lines": 5000, "trial_lines": 50, "projected_usd": "0.33", "interval_usd": ["0.32", "0.34"],
             "actual_usd": "0.331", "error_pct": -0.3}  # fmt: skip
    shape = {"runs": runs, "inside": inside, "coverage": inside / runs, "error_pct_max_abs": 1.0,
             "half_width_pct_median": 0.8, "first": first}  # fmt: skip
    return {"coverage": inside / runs, "runs": runs, "shapes": {"skewed": shape}}


def test_coverage_near_95_percent_meets_the_goal_and_every_cost_inside_does_not() -> None:
    rows = {row["name"]: row for row in trial_projection_rows(result(19))}
    assert rows["trial_projection_coverage"]["met"] is True
    assert rows["trial_projection_skewed_5000_lines_error_pct"]["value"] == -0.3
    assert trial_projection_rows(result(20))[0]["met"] is False  # 100%: wider than a 95% claim needs
    assert trial_projection_rows(result(16))[0]["met"] is False
