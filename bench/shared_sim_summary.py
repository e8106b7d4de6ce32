"""The figures of bench/shared_sim.py: per rate, each Backfill side's online p99/p50 ratios against the side without
batch work (pooled over rounds, per round, and a bootstrap interval of the pooled p99 ratios), harvest ratios; and
the headline (worst over rates) per side."""

from __future__ import annotations

import argparse
import random
from typing import Any

from bench.online_load import figures, percentile

BOOTSTRAP = 400  # resamples for the p99 ratios' interval
SPREAD = (5, 95)  # the interval's percentiles


def summarise_rate(rate: float, sides: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Pooled figures per side, p99/p50 ratios against `without` (pooled and per round), harvest ratios."""
    without = sides["without"]
    row: dict[str, Any] = {"online_rate_per_s": rate}
    base = figures([r for run in without for r in run["online"]])
    row["without"] = {
        **base,
        "server": [run["server"] for run in without],
        "server_clock": figures([r for run in without for r in run["server_online"]]),
    }
    for side, runs in sides.items():
        if side == "without":
            continue
        got = figures([r for run in runs for r in run["online"]])
        per_round = [figures(run["online"]) for run in runs]
        base_rounds = [figures(run["online"]) for run in without]
        entry: dict[str, Any] = {**got, "server": [run["server"] for run in runs]}
        for key in ("ttft_p99_ms", "tpot_p99_ms", "ttft_p50_ms", "tpot_p50_ms"):
            entry[f"{key[:-3]}_ratio"] = _ratio(got[key], base[key])
            entry[f"{key[:-3]}_ratio_rounds"] = [
                _ratio(g[key], b[key])
                for g, b in zip(per_round, base_rounds, strict=False)  # reference sides: fewer
            ]
        entry["ttft_p99_ratio_interval"] = p99_ratio_interval(
            [r for run in runs for r in run["online"]], [r for run in without for r in run["online"]], "ttft"
        )
        mine = figures([r for run in runs for r in run["server_online"]])
        theirs = figures([r for run in without for r in run["server_online"]])
        entry["server_clock"] = {
            **{
                f"{k[:-3]}_ratio": _ratio(mine[k], theirs[k])
                for k in ("ttft_p99_ms", "tpot_p99_ms", "ttft_p50_ms", "tpot_p50_ms")
            },
            "with": mine,
            "without": theirs,
        }
        entry["harvest_ratio_rounds"] = [run["harvest_ratio"] for run in runs]
        entry["harvest_ratio"] = _pooled_harvest(runs, "within_goal_tokens")
        entry["harvest_ratio_vs_idle_roofline"] = _pooled_harvest(runs, "idle_tokens")
        entry["batch_tokens_per_s"] = round(
            sum(run["harvest"]["tokens"] for run in runs) / sum(run["harvest"]["seconds"] for run in runs), 1
        )
        entry["yields"] = sum(run["harvest"]["yields"] for run in runs)
        if staging := [run["harvest"].get("staging") for run in runs if run["harvest"].get("staging")]:
            entry["staging"] = {key: sum(s[key] for s in staging) for key in staging[0]}
        entry["step_model"] = runs[-1]["harvest"]["step_model"]
        row[side] = entry
    return row


def p99_ratio_interval(
    rows: list[dict[str, Any]], base: list[dict[str, Any]], clock: str, *, seed: int = 0
) -> list[float] | None:
    """How far the pooled p99 ratio could move on other draws of the same users: the 5th and 95th percentiles of
    the ratio over bootstrap resamples of both sides' requests (a p99 resting on a handful of tail samples is
    this uncertain, whatever the code does)."""
    mine = [1e3 * r[clock] for r in rows if r["ok"] and r.get(clock) is not None]  # ms, as `figures` has them
    theirs = [1e3 * r[clock] for r in base if r["ok"] and r.get(clock) is not None]
    if len(mine) < 2 or len(theirs) < 2:
        return None
    rng, ratios = random.Random(seed), []
    for _ in range(BOOTSTRAP):
        a = percentile(rng.choices(mine, k=len(mine)), 99)
        b = percentile(rng.choices(theirs, k=len(theirs)), 99)
        if a is not None and b:
            ratios.append(a / b)
    ratios.sort()
    return [round(ratios[int(q / 100 * (len(ratios) - 1))], 3) for q in SPREAD]


def _pooled_harvest(runs: list[dict[str, Any]], capacity: str) -> float | None:
    """Batch tokens over a capacity (`idle_tokens` or `within_goal_tokens`), the rounds added up."""
    idle = sum(run[capacity] for run in runs)
    return round(sum(run["harvest"]["tokens"] for run in runs) / idle, 4) if idle > 0 else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def summary(result: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The headline figures: worst p99 ratios over rates and the smallest harvest ratio, per Backfill side."""
    out: dict[str, Any] = {}
    for side in (s for s in args.sides if s != "without"):
        rows = [row[side] for row in result["rates"]]
        out[side] = {
            "online_ttft_p99_ratio_worst": max(r["ttft_p99_ratio"] or 0 for r in rows),
            "online_tpot_p99_ratio_worst": max(r["tpot_p99_ratio"] or 0 for r in rows),
            "online_ttft_p50_ratio_worst": max(r["ttft_p50_ratio"] or 0 for r in rows),
            "online_tpot_p50_ratio_worst": max(r["tpot_p50_ratio"] or 0 for r in rows),
            "harvest_ratio": min(r["harvest_ratio"] or 0 for r in rows),
            "harvest_ratio_vs_idle_roofline": min(r["harvest_ratio_vs_idle_roofline"] or 0 for r in rows),
            "server_clock_ttft_p99_ratio_worst": max(r["server_clock"]["ttft_p99_ratio"] or 0 for r in rows),
            "server_clock_tpot_p99_ratio_worst": max(r["server_clock"]["tpot_p99_ratio"] or 0 for r in rows),
            "ttft_p99_ratio_rounds": {
                row["online_rate_per_s"]: row[side]["ttft_p99_ratio_rounds"] for row in result["rates"]
            },
            "ttft_p99_ratio_by_rate": {
                row["online_rate_per_s"]: row[side]["ttft_p99_ratio"] for row in result["rates"]
            },
            "ttft_p99_ratio_interval": {
                row["online_rate_per_s"]: row[side].get("ttft_p99_ratio_interval") for row in result["rates"]
            },
            "tpot_p99_ratio_rounds": {
                row["online_rate_per_s"]: row[side]["tpot_p99_ratio_rounds"] for row in result["rates"]
            },
            "harvest_ratio_rounds": {
                row["online_rate_per_s"]: row[side]["harvest_ratio_rounds"] for row in result["rates"]
            },
        }
    return out
