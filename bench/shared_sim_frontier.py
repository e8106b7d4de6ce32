"""The frontier of bench/shared_sim.py: the GPU-timed server's scheduler on virtual time (no HTTP, no CPU noise),
with a constant number of batch requests in flight beside the same Poisson online users. For each online rate,
the most batch tokens any in-flight count harvests with both online p99 ratios (TTFT, TPOT) <= 1.10: what a
budget that decides only how many batch requests are on the server can reach there at best."""

from __future__ import annotations

import argparse
import random
import statistics
from typing import Any

from bench import sim_server
from bench.sim_scheduler import SimRequest

GOAL_LATENCY = 1.10


def frontier(args: argparse.Namespace, seconds: float = 60.0) -> list[dict[str, Any]]:
    """Per rate: online p99 ratios and batch tokens/s for constant batch in-flight counts, and the best count
    that keeps both ratios <= 1.10 (virtual time: the formula's steps exactly, no HTTP, no CPU noise)."""
    rows = []
    for rate in args.rates:
        base = _virtual(args, rate, 0, seconds)
        points = []
        for inflight in (1, 2, 4, 8, 16, 32, 64, 128, args.max_num_seqs - args.headroom_seqs):
            got = _virtual(args, rate, inflight, seconds)
            idle = args.capacity * seconds - got["online_tokens"]
            points.append(
                {
                    "batch_inflight": inflight,
                    "ttft_p99_ratio": round(got["ttft_p99"] / base["ttft_p99"], 3),
                    "tpot_p99_ratio": round(got["tpot_p99"] / base["tpot_p99"], 3),
                    "batch_tokens_per_s": round(got["batch_tokens"] / seconds, 1),
                    "harvest_ratio": round(got["batch_tokens"] / idle, 4),
                }
            )
        ok = [p for p in points if p["ttft_p99_ratio"] <= GOAL_LATENCY and p["tpot_p99_ratio"] <= GOAL_LATENCY]
        best = max(ok, key=lambda p: p["harvest_ratio"]) if ok else None
        rows.append({"online_rate_per_s": rate, "points": points, "best_within_goal": best})
    return rows


def _virtual(args: argparse.Namespace, rate: float, inflight: int, seconds: float) -> dict[str, float]:
    server = sim_server.build(
        served_name="virtual",
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
    )
    sched, rng, now = server.scheduler, random.Random(args.seed), 0.0
    arrivals, at = [], rng.expovariate(rate)
    while at < seconds:
        arrivals.append(at)
        at += rng.expovariate(rate)
    users: list[SimRequest] = []
    batch: list[SimRequest] = []
    prompt, batch_prompt = args.online_prompt_words + 2, args.batch_prompt_words + 2
    # The first requests stand for a steady stream already running: their outputs are staggered (their remaining
    # lengths spread evenly), so the batch does not finish and prefill again in lockstep.
    for i in range(inflight):
        remaining = max(1, round(args.batch_tokens * (i + 1) / inflight))
        batch.append(SimRequest(prompt_tokens=batch_prompt, max_tokens=remaining, priority=1_000_000, arrival=-1.0))
        sched.add(batch[-1])
    while now < seconds:
        batch = [b for b in batch if not b.finished]
        for _ in range(inflight - len(batch)):
            batch.append(
                SimRequest(prompt_tokens=batch_prompt, max_tokens=args.batch_tokens, priority=1_000_000, arrival=now)
            )
            sched.add(batch[-1])
        while arrivals and arrivals[0] <= now:
            users.append(SimRequest(prompt_tokens=prompt, max_tokens=args.online_tokens, arrival=arrivals.pop(0)))
            sched.add(users[-1])
        if not sched.has_work():
            now = arrivals[0] if arrivals else seconds
            continue
        plan = sched.schedule()
        now += plan.seconds
        sched.complete(plan, now)
    done = [u for u in users if u.finished_at is not None and u.first_token_at is not None]
    ttft = [u.first_token_at - u.arrival for u in done]  # type: ignore[operator]
    tpot = [(u.finished_at - u.first_token_at) / (u.max_tokens - 1) for u in done]  # type: ignore[operator]
    counters = sched.counters.generation_tokens
    return {
        "ttft_p99": statistics.quantiles(ttft, n=100, method="inclusive")[98],
        "tpot_p99": statistics.quantiles(tpot, n=100, method="inclusive")[98],
        "online_tokens": counters["online"],
        "batch_tokens": counters["batch"],
    }
