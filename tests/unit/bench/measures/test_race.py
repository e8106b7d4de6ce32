"""The prefix-heavy race's rows: the goals are met only by a speedup of 2.0 with every line answered on both sides."""

from __future__ import annotations

from typing import Any

from bench.measures import measures


def race(speedup: float, *, all_ok: bool = True, control: bool = True) -> dict[str, Any]:
    side = {"seconds": 10.0, "hit_rate": 0.9}
    result: dict[str, Any] = {
        "kv_cache_tokens": 5120,
        "run_batch": side,
        "backfill": side,
        "speedup": speedup,
        "speedup_startups_counted": speedup * 2,
        "all_ok": all_ok,
    }
    if control:
        result |= {"backfill_ordering_off": {**side, "hit_rate": 0.1}, "speedup_ordering_off": 1.0}
    return result


def result(**sizes: dict[str, Any]) -> dict[str, Any]:
    shape = {"tenants": 4, "lines_per_job": 96, "prompts": 8, "shared_prompts": True, "max_num_seqs": 16}
    return {"prefix-race": {"result": {**shape, **sizes}}}


def by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in rows}


def test_both_kv_sizes_give_their_goal_rows() -> None:
    rows = by_name(measures(result(small=race(5.0), large=race(1.6))))
    assert rows["prefix_heavy_speedup_vs_run_batch"]["met"] is True
    assert rows["prefix_heavy_speedup_vs_run_batch_large_kv"]["met"] is False
    assert rows["prefix_heavy_speedup_vs_run_batch"]["goal"] == ">= 2.0"
    assert rows["prefix_heavy_speedup_startups_counted_large_kv"]["value"] == 3.2
    assert rows["prefix_heavy_backfill_hit_rate_ordering_off"]["value"] == 0.1
    assert "prefix_heavy_run_batch_hit_rate_large_kv" in rows


def test_a_missing_line_fails_the_goal_whatever_the_speedup() -> None:
    rows = by_name(measures(result(small=race(9.0, all_ok=False))))
    assert rows["prefix_heavy_speedup_vs_run_batch"]["met"] is False


def test_a_race_without_the_control_or_the_large_cache_leaves_their_rows_out() -> None:
    rows = by_name(measures(result(small=race(3.0, control=False))))
    assert "prefix_heavy_speedup_ordering_off" not in rows
    assert not any(name.endswith("_large_kv") for name in rows)


def test_the_ceiling_rows_come_with_an_ideal_run_and_carry_no_goal() -> None:
    with_ideal = race(1.2) | {
        "ideal": {"sorted": {"seconds": 8.0}},
        "ideal_speedup": 1.5,
        "backfill_share_of_ideal": 0.8,
    }
    rows = by_name(measures(result(large=with_ideal)))
    assert rows["prefix_heavy_ideal_speedup_vs_run_batch_large_kv"]["value"] == 1.5
    assert rows["prefix_heavy_backfill_share_of_ideal_large_kv"]["value"] == 0.8
    assert rows["prefix_heavy_ideal_speedup_vs_run_batch_large_kv"]["goal"] is None
    assert "prefix_heavy_ideal_speedup_vs_run_batch" not in by_name(measures(result(small=race(3.0))))
