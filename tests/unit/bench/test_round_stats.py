"""Per-round summaries: the median with its bootstrap interval (bench/round_stats.py)."""

from __future__ import annotations

from bench.round_stats import median_interval, spread


def test_interval_brackets_the_median_and_widens_with_the_scatter() -> None:
    steady = [0.90, 0.91, 0.92, 0.91, 0.90, 0.92, 0.91, 0.90, 0.92]
    noisy = [0.75, 1.12, 0.84, 1.04, 0.89, 0.95, 1.30, 0.92, 0.96]
    low, high = median_interval(steady)
    assert low <= 0.91 <= high and high - low <= 0.021
    noisy_low, noisy_high = median_interval(noisy)
    assert noisy_low <= 0.95 <= noisy_high
    assert noisy_high - noisy_low > 3 * (high - low)


def test_same_rounds_same_interval_and_spread_reports_it() -> None:
    rounds = [0.839, 1.037, 0.752, 0.887, 1.116]
    assert median_interval(rounds) == median_interval(list(reversed(sorted(rounds))))
    summary = spread("ratio", rounds)
    assert summary["ratio_median"] == 0.887
    assert summary["ratio_median_low"] <= 0.887 <= summary["ratio_median_high"]
    assert median_interval([0.9]) == (0.9, 0.9)
