"""Checkpoint and resume rows (issue 21): the hand-back and periodic checkpoints' write cost (bench/handback.py)
and the discard shares of a rolling restart (bench/rolling_restart.py)."""

from __future__ import annotations

from typing import Any

from bench.measures.entry import entry


def rolling_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 21 item 8: decode tokens a rolling restart of 4 GPU-timed workers throws away (bench/rolling_restart.py)."""
    rows, bound = [], r["checkpoint_bound_tokens"]
    setup = f"{r['workers']} GPU-timed workers x {r['slots']} slots, restarted one at a time mid-batch"
    for mode, run in r["runs"].items():
        share = run["share"]
        how = "SIGTERM: drain 2 s, hand back with checkpoints; a pause" if mode == "term" else "kill -9"
        counts = f"{run['discarded']} of {run['decoded']}, {run['resumed']} resumed"
        unit = f"discarded / decoded tokens ({counts}; {setup}, {how})"
        if mode == "term":
            met = share is not None and share <= 0.01
            rows.append(entry("rolling_restart_discarded_decode_share", share, unit, "<= 0.01", met))
            rows.append(entry("resume_discarded_decode_share_graceful", share, unit, "<= 0.01", met))
        else:
            most = run["most_discarded_by_one_request"]
            label = f"tokens (every {r['checkpoint_every_tokens']} tokens / {r['checkpoint_interval_seconds']:g} s)"
            rows.append(entry("resume_discarded_decode_share_kill", share, unit))
            rows.append(entry("rolling_kill_most_discarded_by_one_request", most, label, f"<= {bound}", most <= bound))
        prefix = "rolling_restart" if mode == "term" else "rolling_kill"
        for what in ("lost", "duplicated"):
            rows.append(entry(f"{prefix}_{what}", run[what], "custom_ids", "0", run[what] == 0))
    return rows


def handback_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    back = r["handback"]
    seconds = back["seconds"]
    rows = [
        entry(
            f"handback_checkpoint_seconds_{back['in_flight']}",
            seconds,
            f"s ({back['generated_tokens'] // back['in_flight']} tokens each, {back['checkpoint_bytes']} B stored)",
            "<= 2",
            seconds <= 2 and back["checkpointed_rows"] == back["in_flight"],
        ),
        *(overhead_rows(r, r, suffix="") if "on" in r else []),  # none with --no-short
    ]
    if long := r.get("long"):  # outputs of 6,000-10,000 tokens (bench/handback.py --long-low/--long-high)
        rows += overhead_rows(long, r, suffix="_long")
    return rows


def overhead_rows(pair: dict[str, Any], r: dict[str, Any], *, suffix: str) -> list[dict[str, Any]]:
    """What periodic checkpoints add to one pair of runs' database writes (bench/handback.py `overhead`)."""
    on, off, wal = pair["on"], pair["off"], pair["wal_overhead_ratio"]
    ids = r.get("token_ids", "uniform")  # bench/handback.py --ids (uniform before it had the choice)
    label = f"x without (every {on['every_tokens']} tokens / {r['checkpoint_interval_seconds']:g} s, {ids} ids)"
    if "low" in pair:
        label += f", outputs {pair['low']}-{pair['high']} tokens"
    payload = pair["payload_overhead_ratio"]
    rows = [
        entry(f"checkpoint_wal_overhead_ratio{suffix}", wal, label, "<= 0.10", wal is not None and wal <= 0.10),
        # The token ids' own bytes over the WAL without checkpoints: a floor of what they added while they were
        # WAL-logged; since migration 0030 they live in unlogged tables (docs/workers.md), so a size, no goal.
        entry(
            f"checkpoint_payload_overhead_ratio{suffix}",
            payload,
            f"periodic checkpoint bytes ({on['checkpoint_writes']} writes, unlogged: no WAL) / WAL without",
        ),
        entry(f"checkpoint_updated_rows_overhead_ratio{suffix}", pair["updated_rows_overhead_ratio"], label),
    ]
    if "inserted_rows_overhead_ratio" in pair:
        rows.append(
            entry(f"checkpoint_inserted_rows_overhead_ratio{suffix}", pair["inserted_rows_overhead_ratio"], label)
        )
    if "wal_no_fpi_overhead_ratio" in pair:  # without full-page images (they follow the server's checkpoints)
        rows.append(entry(f"checkpoint_wal_no_fpi_overhead_ratio{suffix}", pair["wal_no_fpi_overhead_ratio"], label))
    if "cluster_wal_overhead_ratio" in pair:  # the server's whole WAL: other work on it counts too
        rows.append(entry(f"checkpoint_cluster_wal_overhead_ratio{suffix}", pair["cluster_wal_overhead_ratio"], label))
    wal_key = "db_wal_bytes" if "db_wal_bytes" in off else "wal_bytes"  # the database's own WAL, when measured
    for name, run in (("without", off), ("with", on)):
        rows.append(
            entry(f"checkpoint_wal_bytes_{name}{suffix}", run[wal_key], f"B ({run['output_tokens']} output tokens)")
        )
    return rows
