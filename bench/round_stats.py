"""Summaries of per-round figures: a benchmark run on a noisy machine reports its rounds' spread, not one number."""

from __future__ import annotations


def spread(name: str, values: list[float]) -> dict[str, float]:
    """Median, quartiles (inclusive method) and extremes of per-round figures."""
    import statistics

    ordered = sorted(values)
    q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else ordered * 3
    low, high = median_interval(ordered)
    return {
        f"{name}_median": round(statistics.median(ordered), 3),
        f"{name}_median_low": round(low, 3),
        f"{name}_median_high": round(high, 3),
        f"{name}_q1": round(q1, 3),
        f"{name}_q3": round(q3, 3),
        f"{name}_min": round(ordered[0], 3),
        f"{name}_max": round(ordered[-1], 3),
    }


def median_interval(values: list[float], *, resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A bootstrap 5-95% interval of the median of `values` (seeded: the same rounds give the same interval).

    On a noisy machine one round's ratio moves by more than the goal's margin (0.75-1.12 in one quiet run of
    2026-12-02), so the median of a few rounds comes with how far another run of them could land.
    """
    import random
    import statistics

    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    pick = random.Random(seed).choices
    ordered = sorted(values)  # the interval depends on the rounds, not on their order
    medians = sorted(statistics.median(pick(ordered, k=len(ordered))) for _ in range(resamples))
    return medians[int(0.05 * resamples)], medians[int(0.95 * resamples) - 1]
