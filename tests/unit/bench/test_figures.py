"""The benchmark plots' series (bench/engine_figures.py, bench/prefix_race_figures.py) and that each writes a PNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.engine_figures import plot_rounds, rounds_series
from bench.prefix_race_figures import plot_race, race_bars

PNG = b"\x89PNG\r\n\x1a\n"


def _engine_result() -> dict[str, Any]:
    return {
        "requests": 1000,
        "output_tokens_each": 64,
        "rounds_tokens_per_s": [[900, 1000], [1100, 1000], [950, 1000]],
        "rounds_first_side": ["backfill", "vllm", "backfill"],
        "throughput_ratio_rounds": [0.9, 1.1, 0.95],
        "rounds_outside_step_ms": [[0.25, 0.15], [0.3, 0.1], [0.2, 0.15]],
        "throughput_ratio_median": 0.95,
        "throughput_ratio_median_low": 0.9,
        "throughput_ratio_median_high": 1.1,
        "outside_step_ms_extra_median": 0.1,
    }


def test_the_rounds_series_splits_each_side_and_takes_the_extra_per_round() -> None:
    s = rounds_series(_engine_result())
    assert s["round"] == [1, 2, 3]
    assert s["backfill_tokens_per_s"] == [900, 1100, 950] and s["bare_tokens_per_s"] == [1000, 1000, 1000]
    assert s["extra_outside_ms"] == [0.1, 0.2, 0.05]
    assert s["ratio_interval"] == (0.9, 1.1) and s["first"] == ["backfill", "vllm", "backfill"]


def _side(seconds: float, hit_rate: float) -> dict[str, Any]:
    return {"seconds": seconds, "hit_rate": hit_rate}


def _race_result() -> dict[str, Any]:
    small = {
        "kv_cache_tokens": 5120,
        "run_batch": _side(30.0, 0.02),
        "backfill": _side(10.0, 0.83),
        "backfill_ordering_off": _side(20.0, 0.4),
        "ideal": {"sorted": _side(8.0, 0.9), "rounds": []},
    }
    large = {"kv_cache_tokens": 81920, "run_batch": _side(14.0, 0.81), "backfill": _side(10.0, 0.87)}
    return {"tenants": 4, "lines_per_job": 96, "prompts": 8, "max_num_seqs": 16, "small": small, "large": large}


def test_race_bars_give_each_side_that_ran_its_speed_against_run_batch_in_a_fixed_order() -> None:
    bars = race_bars(_race_result())
    assert [b["side"] for b in bars["small"]] == ["run_batch", "backfill_ordering_off", "backfill", "ideal"]
    assert [b["x_run_batch"] for b in bars["small"]] == [1.0, 1.5, 3.0, 3.75]
    assert bars["small"][3]["hit_rate"] == 0.9  # the ceiling's figures come from its prefix-sorted variant
    assert [b["side"] for b in bars["large"]] == ["run_batch", "backfill"]  # no control, no ceiling in this run
    assert race_bars({"small": None}) == {}


def test_each_plot_writes_a_png(tmp_path: Path) -> None:
    plot_rounds(_engine_result(), tmp_path / "rounds.png")
    plot_race(_race_result(), tmp_path / "race.png")
    assert (tmp_path / "rounds.png").read_bytes().startswith(PNG)
    assert (tmp_path / "race.png").read_bytes().startswith(PNG)
