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


def real_result(actual: str) -> dict[str, Any]:
    tokens = {"completed": 5000, "input": 120000, "stated_input": 100000, "output": 48000, "stated_output": 50000,
              "stopped_before_budget": 300}  # fmt: skip
    run = {"shape": "short", "seed": 0, "lines": 5000, "trial_lines": 50, "seconds": 240.0, "tokens": tokens,
           "projected_usd": "0.0500", "interval_usd": ["0.0480", "0.0520"], "actual_usd": actual, "error_pct": 1.0,
           "half_width_pct": 4.0, "actual_within_interval": "0.0480" <= actual <= "0.0520"}  # fmt: skip
    return {"all": [run]}


def test_the_real_engine_rows_say_projected_interval_and_actual_and_whether_it_fell_inside() -> None:
    from bench.measures.trial import trial_projection_real_rows
    from bench.suite import _part_of

    rows = {row["name"]: row for row in trial_projection_real_rows(real_result("0.0495"))}
    name = "trial_projection_real_short_5000_lines"
    assert (
        rows[f"{name}_projected_usd"]["value"] == "0.0500"
        and "$0.0480-$0.0520" in rows[f"{name}_projected_usd"]["unit"]
    )
    assert rows[f"{name}_actual_usd"]["met"] is True
    assert rows[f"{name}_output_share"]["value"] == 0.96
    assert trial_projection_real_rows(real_result("0.0530"))[1]["met"] is False
    # the fake engine's part, run on its own, keeps the real engine's rows (and the other way round)
    assert not _part_of(rows[f"{name}_error_pct"], ["trial-projection"])
    assert _part_of(rows[f"{name}_error_pct"], ["trial-projection-real"])
    assert _part_of({"name": "trial_projection_coverage"}, ["trial-projection"])
