"""The render-ahead benchmark's rows: each figure from its own side, the shape of the run in the unit."""

from __future__ import annotations

from bench.measures import measures


def test_each_row_reads_its_own_side() -> None:
    sides = {"none": (1.1, 1.2), "inline": (2.7, 5.5), "ahead": (0.16, 2.7), "ahead-burst": (0.61, 7.3)}
    summary = {side: {"ms_extra_over_none": extra, "ms_p99_median": p99} for side, (extra, p99) in sides.items()}
    args = {"gpu_ms": 10.0, "host_ms": 1.0, "per_step": 1, "words": 400, "claim": 192, "rounds": 3}
    rows = {row["name"]: row for row in measures({"render-ahead": {"summary": summary, "args": args}})}
    assert rows["render_ahead_engine_thread_ms_extra"]["value"] == 0.16
    assert "claims of 192" in rows["render_ahead_engine_thread_ms_extra"]["unit"]
    assert rows["render_ahead_burst_engine_thread_ms_extra"]["value"] == 0.61
    assert rows["render_ahead_inline_engine_thread_ms_extra"]["value"] == 2.7
    p99 = rows["render_ahead_engine_thread_p99_ms"]
    assert p99["value"] == 2.7 and "in add 5.5" in p99["unit"] and "without the yield 7.3" in p99["unit"]
