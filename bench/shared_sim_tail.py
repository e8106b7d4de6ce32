"""Which online requests make the TTFT tail on the GPU-timed server, and why (issue 22, section 4).

bench/shared_sim.py keeps, per side and round, the simulated server's trace (`POST /sim/trace`): every step's
make-up (bench/sim_scheduler.py `StepTrace`: online prompts and decodes, staged pieces' and batch requests'
prompt tokens, batch decodes, and the time the batch part added) and each online request's arrival, first token
(server clock) and the moment its first chunk left the server. This joins them: per online request, the step
in progress when it arrived (its wait for the step boundary), the steps it waited in the queue, and the step that
prefilled its prompt; then, per rate and side, the requests at or above the side's p99 and what their steps
carried:

  collide         its prompt shared its step with another online prompt (the baseline's own tail)
  own:piece       ... with a staged piece's prompt tokens          own:batch   ... with a batch request's chunk
  cur:online      it arrived during a step that prefilled another online prompt (a long step to wait out)
  cur:piece       it arrived during a step carrying a piece        cur:batch   ... a batch request's chunk
  busy            it arrived during a batch-only step (without batch work the server would have been idle)
  queued          it waited more than the one step in progress
  late            its first chunk left the server's event loop > 1 ms after its step ended (CPU, not GPU)

and the mean milliseconds batch work added to them: in their own step, in the step they arrived during (the part
of that wait the batch work made), and the event loop's delay. On the client's clock (the users' own rows joined to
the server's records): the client's p99 and, in its tail, the mean of each part of the TTFT (`join_client`). `--virtual` runs the same on the frontier's
scheduler (virtual time, no HTTP, no CPU noise) for long stretches instead.

Usage: .venv/bin/python bench/shared_sim_tail.py [bench/out/shared_sim.json]
       .venv/bin/python bench/shared_sim_tail.py --virtual [--seconds 600] [--stage 10:32,10:16]
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.online_load import percentile
from bench.sim_scheduler import StepTrace

LATE_SECONDS = 0.001


def attribute(steps: list[StepTrace], online: list[dict[str, float]]) -> list[dict[str, Any]]:
    """Per online request: TTFT (server clock), its own step, the step in progress at arrival, queue and delay."""
    steps = sorted(steps, key=lambda s: s.end)
    ends = [s.end for s in steps]
    rows = []
    for user in online:
        own_at = bisect.bisect_left(ends, user["first_token"] - 1e-9)
        if own_at >= len(steps):
            continue
        own = steps[own_at]
        at = bisect.bisect_right(ends, user["arrival"])
        cur = steps[at] if at < own_at and steps[at].end - steps[at].seconds < user["arrival"] else None
        sent = user.get("first_sent") or user["first_token"]
        rows.append(
            {
                "ttft": user["first_token"] - user["arrival"],
                "own": own,
                "cur": cur,
                "queued": own_at - at - (cur is not None),
                "residual": cur.end - user["arrival"] if cur else 0.0,
                "delay": max(0.0, sent - user["first_token"]),
            }
        )
    return rows


def join_client(rows: list[dict[str, Any]], online: list[dict[str, float]]) -> list[dict[str, float]]:
    """The online users' own rows (bench/online_load.py: `sent`, `first` on the same monotonic clock as the server's
    stamps) matched to the server's records, each to the first unmatched arrival after it was sent; per request
    the client's TTFT in four parts: the request's way in (client, HTTP, the server's parsing), the server's TTFT,
    the server loop's delay in sending the first chunk, and the chunk's way out (HTTP, the client reading it)."""
    served = sorted(online, key=lambda user: user["arrival"])
    arrivals = [user["arrival"] for user in served]
    taken: set[int] = set()
    out = []
    for row in sorted((r for r in rows if r.get("ok") and "sent" in r), key=lambda r: r["sent"]):
        at = bisect.bisect_left(arrivals, row["sent"])
        while at in taken:
            at += 1
        if at >= len(served) or served[at]["arrival"] - row["sent"] > 1.0:
            continue
        taken.add(at)
        user = served[at]
        sent = user.get("first_sent") or user["first_token"]
        parts = (user["arrival"] - row["sent"], user["first_token"] - user["arrival"], sent - user["first_token"])
        out.append(dict(zip(("way_in", "server", "loop", "way_out"), (*parts, row["first"] - sent), strict=True)))
        out[-1]["ttft"] = row["ttft"]
    return out


def client_parts(joined: list[dict[str, float]]) -> dict[str, Any]:
    """The client's TTFT p99 and, for its tail and for all requests, the mean of each part (ms)."""
    ttft = [1e3 * row["ttft"] for row in joined]
    p99 = percentile(ttft, 99)
    if p99 is None:
        return {}
    tail = [row for row in joined if 1e3 * row["ttft"] >= p99]
    parts = ("way_in", "server", "loop", "way_out")
    return {
        "client_ttft_p99_ms": p99,
        "matched": len(joined),
        "tail_parts_ms": {k: round(1e3 * sum(r[k] for r in tail) / len(tail), 3) for k in parts},
        "all_parts_ms": {k: round(1e3 * sum(r[k] for r in joined) / len(joined), 3) for k in parts},
    }


def tags(row: dict[str, Any]) -> list[str]:
    own, cur = row["own"], row["cur"]
    out = ["collide"] if own.online_prompts > 1 else []
    out += ["own:piece"] if own.piece_prefill else []
    out += ["own:batch"] if own.batch_prefill else []
    if cur is not None:
        if cur.online_prompts:
            out.append("cur:online")
        elif not cur.online_decodes:
            out.append("busy")
        out += ["cur:piece"] if cur.piece_prefill else []
        out += ["cur:batch"] if cur.batch_prefill else []
    out += ["queued"] if row["queued"] > 0 else []
    out += ["late"] if row["delay"] > LATE_SECONDS else []
    return out


def breakdown(rows: list[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """The requests at or above `threshold` seconds: how many carry each tag and what batch work added (ms)."""
    tail = [row for row in rows if row["ttft"] >= threshold]
    if not tail:
        return {"tail": 0}

    def mean(values: list[float]) -> float:
        return round(1e3 * sum(values) / len(values), 3)

    def cur_share(row: dict[str, Any]) -> float:  # the part of the wait for the step in progress batch work made
        cur = row["cur"]
        return min(row["residual"], cur.batch_seconds) if cur is not None else 0.0

    return {
        "tail": len(tail),
        "tags": dict(Counter(tag for row in tail for tag in tags(row) or ["plain"]).most_common()),
        "ttft_ms": mean([row["ttft"] for row in tail]),
        "batch_ms_own_step": mean([row["own"].batch_seconds for row in tail]),
        "batch_ms_step_in_progress": mean([cur_share(row) for row in tail]),
        "loop_delay_ms": mean([row["delay"] for row in tail]),
        "loop_delay_ms_all": mean([row["delay"] for row in rows]),
        "own_step_with_piece_share_all": round(sum(bool(r["own"].piece_prefill) for r in rows) / len(rows), 3),
    }


def report(by_side: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per side: server-clock p99 and the breakdown of its tail (the baseline side `without` first)."""
    base = [1e3 * row["ttft"] for row in by_side.get("without", [])]
    base_p99 = percentile(base, 99) if base else None
    out: dict[str, Any] = {}
    for side, rows in by_side.items():
        ttft = [1e3 * row["ttft"] for row in rows]
        p99 = percentile(ttft, 99)
        if p99 is None:
            continue
        entry: dict[str, Any] = {"requests": len(rows), "ttft_p99_ms": p99}
        if base_p99:
            entry["ttft_p99_ratio"] = round(p99 / base_p99, 3)
        out[side] = {**entry, **breakdown(rows, p99 / 1e3)}
    return out


def from_run(path: Path) -> dict[str, Any]:
    """The breakdown of a bench/shared_sim.py run's traces, per rate and side (rounds pooled)."""
    traces = json.loads(path.read_text())["traces"]
    by_rate: dict[str, dict[str, list[dict[str, Any]]]] = {}
    clients: dict[str, dict[str, list[dict[str, float]]]] = {}
    for label, rounds in traces.items():
        side, rate = label.split("@")
        rows = by_rate.setdefault(rate, {}).setdefault(side, [])
        joined = clients.setdefault(rate, {}).setdefault(side, [])
        for trace in rounds:
            rows += attribute([StepTrace(*step) for step in trace["steps"]], trace["online"])
            joined += join_client(trace.get("client", []), trace["online"])
    out = {rate: report(sides) for rate, sides in by_rate.items()}
    for rate, sides in clients.items():
        for side, joined in sides.items():
            out[rate][side]["client"] = client_parts(joined)
    return out


def virtual(seconds: float, stages: list[tuple[float, int]], seed: int) -> dict[str, Any]:
    """The same breakdown on the frontier's virtual clock, `seconds` per point (no HTTP, no CPU noise)."""
    from bench.shared_sim import default_args
    from bench.shared_sim_frontier import run_virtual

    args = default_args(seed=seed)
    out = {}
    for rate in args.rates:
        sides = {"without": attribute(*run_virtual(args, rate, seconds))}
        for pace, stage in stages:
            got = run_virtual(args, rate, seconds, prefill_tokens_per_step=pace, stage_tokens=stage)
            sides[f"staged{stage}@{pace:g}"] = attribute(*got)
        out[f"{rate:g}"] = report(sides)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", nargs="?", default="bench/out/shared_sim.json")
    parser.add_argument("--virtual", action="store_true")
    parser.add_argument("--seconds", type=float, default=600.0, help="virtual seconds per point")
    parser.add_argument("--stage", default="10:32,10:16", help="pace:piece tokens, comma-separated")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if args.virtual:
        stages = [(float(p), int(k)) for p, k in (item.split(":") for item in args.stage.split(","))]
        result = virtual(args.seconds, stages, args.seed)
    else:
        result = from_run(Path(args.path))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
