"""bench/render_ahead.py's summary: medians over rounds per side, the extra measured against no rendering."""

from __future__ import annotations

from bench.render_ahead import SIDES, summarize


def test_each_side_is_summarized_by_its_median_round_against_the_no_rendering_floor() -> None:
    means = {"none": [1.0, 1.2, 1.1], "inline": [3.0, 3.4, 3.2], "ahead": [1.3, 1.2, 1.5], "ahead-burst": [2, 2, 9]}
    rows = [
        {"side": side, "ms_beyond_gpu_mean": mean, "ms_beyond_gpu_p99": 10 * mean}
        for side in SIDES
        for mean in means[side]
    ]
    summary = summarize(rows)
    assert summary["none"]["ms_extra_over_none"] == 0.0
    assert summary["inline"]["ms_beyond_gpu_mean_median"] == 3.2 and summary["inline"]["ms_extra_over_none"] == 2.1
    assert summary["ahead"]["ms_extra_over_none"] == 0.2 and summary["ahead"]["ms_p99_median"] == 13.0
    assert summary["ahead-burst"]["ms_beyond_gpu_mean_median"] == 2  # one slow round does not move the median
