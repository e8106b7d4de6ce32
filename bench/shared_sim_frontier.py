"""The frontier of bench/shared_sim.py: the GPU-timed server's scheduler on virtual time (no HTTP, no CPU noise),
beside the same Poisson online users, with batch work held either at a constant number of requests in flight or
paced at a number of batch prompt tokens per step (what worker/engine/prefill_pace.py does over HTTP), or paced
and staged, each prompt sent first as pieces of k more tokens over the prefix cache (worker/engine/prefill_stage.py;
the pieces' one-token outputs are not counted as batch tokens). For each
online rate: online p99 ratios (TTFT, TPOT) and batch tokens/s per point, and the best point of each family with
both ratios <= 1.10.

And the two denominators of the harvest ratio (docs/benchmarks.md):
  idle roofline capacity   the formula's full-batch tokens/s for the batch job, less the online tokens (the
                           issue's first reading: every slot and FLOP online work leaves);
  capacity within the goal the most batch tokens/s the roofline allows with every step no more than 1.10x its
                           online-only length: the step that carries an online prompt (its TTFT) and the mean
                           step (its TPOT), the batch job's prefill spread evenly over the steps (the best any
                           scheduler could do; any extra decoding sequence lengthens a memory-bound step, any
                           prompt token a compute-bound one)."""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
from typing import Any

from bench import sim_server
from bench.sim_scheduler import BLOCK_TOKENS, SimRequest, StepTrace
from storage.planning.node import HARDWARE_PRESETS, LLAMA_70B_FP8
from storage.planning.step_time import StepLoad, step_seconds

GOAL_LATENCY = 1.10
INFLIGHT = (1, 2, 4, 8, 16, 32, 64, 128)
PACES = (0.5, 1, 2, 4, 8, 10, 12, 16, 32)  # batch prompt tokens per step
STAGING = 4  # batch prompts staged at once (worker/engine/prefill_stage.py)
STAGED = ((10, 16), (10, 32), (10, 64), (12, 32), (16, 32))  # (pace, piece tokens)


def frontier(args: argparse.Namespace, seconds: float = 60.0) -> list[dict[str, Any]]:
    """Per rate: the points of both families, their best within the goal, and the capacity within the goal."""
    rows = []
    for rate in args.rates:
        base = _virtual(args, rate, seconds)
        within = capacity_within_goal(args, rate)
        row: dict[str, Any] = {"online_rate_per_s": rate, "capacity_within_goal_tokens_per_s": round(within, 1)}
        families = {
            "inflight": [{"batch_inflight": n} for n in (*INFLIGHT, args.max_num_seqs - args.headroom_seqs)],
            "paced": [{"prefill_tokens_per_step": p} for p in PACES],
            "staged": [{"prefill_tokens_per_step": p, "stage_tokens": k} for p, k in STAGED],
        }
        for family, settings in families.items():
            points = []
            for setting in settings:
                got = _virtual(args, rate, seconds, **setting)
                idle = args.capacity * seconds - got["online_tokens"]
                points.append(
                    {
                        **setting,
                        "ttft_p99_ratio": round(got["ttft_p99"] / base["ttft_p99"], 3),
                        "tpot_p99_ratio": round(got["tpot_p99"] / base["tpot_p99"], 3),
                        "batch_tokens_per_s": round(got["batch_tokens"] / seconds, 1),
                        "harvest_ratio": round(got["batch_tokens"] / (within * seconds), 4),
                        "harvest_ratio_vs_idle_roofline": round(got["batch_tokens"] / idle, 4),
                    }
                )
            ok = [p for p in points if p["ttft_p99_ratio"] <= GOAL_LATENCY and p["tpot_p99_ratio"] <= GOAL_LATENCY]
            row[family] = points
            row[f"best_{family}_within_goal"] = max(ok, key=lambda p: p["harvest_ratio"]) if ok else None
        row["points"], row["best_within_goal"] = row["inflight"], row["best_inflight_within_goal"]  # older readers
        rows.append(row)
    return rows


def run_virtual(
    args: argparse.Namespace, rate: float, seconds: float, **batch: Any
) -> tuple[list[StepTrace], list[dict[str, Any]]]:
    """One virtual run's trace (bench/shared_sim_tail.py): every step's make-up and the online users' times."""
    keep: dict[str, Any] = {}
    _virtual(args, rate, seconds, **batch, keep=keep)
    return keep["steps"], keep["online"]


def capacity_within_goal(args: argparse.Namespace, rate: float, goal: float = GOAL_LATENCY) -> float:
    """Batch output tokens/s the roofline allows beside `rate` online users with both of their steps within `goal`:
    the step carrying one online prompt (TTFT) and the mean step (TPOT), batch prefill spread evenly."""
    shape, node = LLAMA_70B_FP8, HARDWARE_PRESETS[args.hardware]
    prompt, batch_prompt = args.online_prompt_words + 2, args.batch_prompt_words + 2

    def step(batch: int, online_prompt: float, mean: float) -> float:
        online = rate * args.online_tokens * mean  # Little: online sequences decoding in a step of `mean` seconds
        context = round(
            (online * (prompt + args.online_tokens / 2) + batch * (batch_prompt + args.batch_tokens / 2))
            / max(online + batch, 1e-9)
        )
        load = StepLoad(
            decode_seqs=online + batch,
            prefill_tokens=online_prompt + batch * batch_prompt / args.batch_tokens,
        )
        return step_seconds(shape, node, max(context, 1), load)

    def mean_step(batch: int) -> float:
        mean = 0.003
        for _ in range(50):  # the online prompt tokens per step depend on the step's own length
            mean = step(batch, rate * prompt * mean, mean)
        return mean

    alone = mean_step(0)
    ttft_alone = step(0, prompt, alone)
    best = 0.0
    for batch in range(1, args.max_num_seqs):
        mean = mean_step(batch)
        if mean > goal * alone or step(batch, prompt, mean) > goal * ttft_alone:
            break
        best = batch / mean
    return best


def _virtual(
    args: argparse.Namespace,
    rate: float,
    seconds: float,
    batch_inflight: int = 0,
    prefill_tokens_per_step: float = 0.0,
    stage_tokens: int = 0,
    keep: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Online users at `rate` beside batch work held at `batch_inflight` requests, or paced at
    `prefill_tokens_per_step` batch prompt tokens per step (a bucket refilled each step, one prompt deep); with
    `stage_tokens`, each batch prompt is first sent as its prefixes of `stage_tokens`, 2x, ... tokens (1 output
    token each, one at a time per prompt, `STAGING` prompts at once), paced per piece, over the prefix cache.
    `keep` (a dict) receives the scheduler's trace: `steps` and the online users' `online` times."""
    server = sim_server.build(
        served_name="virtual",
        hardware=args.hardware,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
    )
    sched, rng, now = server.scheduler, random.Random(args.seed), 0.0
    sched.trace = None if keep is None else []
    arrivals, at = [], rng.expovariate(rate)
    while at < seconds:
        arrivals.append(at)
        at += rng.expovariate(rate)
    users: list[SimRequest] = []
    batch: list[SimRequest] = []
    prompt, batch_prompt = args.online_prompt_words + 2, args.batch_prompt_words + 2

    prompts = itertools.count()

    def send(max_tokens: int, arrival: float, upto: int = 0, hashes: tuple[int, ...] = ()) -> None:
        tokens = upto or batch_prompt
        hashes = hashes or tuple(hash(("prompt", next(prompts), i)) for i in range(batch_prompt // BLOCK_TOKENS))
        request = SimRequest(tokens, max_tokens, priority=1_000_000, arrival=arrival)
        request.block_hashes = hashes[: tokens // BLOCK_TOKENS]
        batch.append(request)
        sched.add(request)

    staging: list[tuple[SimRequest | None, int, tuple[int, ...]]] = []  # (piece on the server, its end, hashes)
    pieces: list[SimRequest] = []

    def stage() -> float:
        """Send each staged prompt's next piece (or itself, after its last) while the bucket allows; the tokens."""
        spent = 0.0
        while len(staging) < STAGING:
            staging.append(
                (None, 0, tuple(hash(("prompt", next(prompts), i)) for i in range(batch_prompt // BLOCK_TOKENS)))
            )
        for index, (piece, end, hashes) in enumerate(staging):
            if (piece is not None and not piece.finished) or bucket - spent < 0:
                continue
            if end + stage_tokens < batch_prompt:
                send(1, now, end + stage_tokens, hashes)
                staging[index] = (batch[-1], end + stage_tokens, hashes)
                pieces.append(batch[-1])
                spent += stage_tokens
            else:
                send(args.batch_tokens, now, batch_prompt, hashes)
                staging[index] = (
                    None,
                    0,
                    tuple(hash(("prompt", next(prompts), i)) for i in range(batch_prompt // BLOCK_TOKENS)),
                )
                spent += batch_prompt - end
        return spent

    # The first requests stand for a steady stream already running: their outputs are staggered (their remaining
    # lengths spread evenly), so the batch does not finish and prefill again in lockstep.
    for i in range(batch_inflight):
        send(max(1, round(args.batch_tokens * (i + 1) / batch_inflight)), -1.0)
    bucket = 0.0
    while now < seconds:
        batch = [b for b in batch if not b.finished]
        if stage_tokens:
            bucket -= stage()
        elif prefill_tokens_per_step:
            while bucket >= 0 and len(batch) < args.max_num_seqs - args.headroom_seqs:
                send(args.batch_tokens, now)
                bucket -= batch_prompt
        else:
            for _ in range(batch_inflight - len(batch)):
                send(args.batch_tokens, now)
        while arrivals and arrivals[0] <= now:
            users.append(SimRequest(prompt_tokens=prompt, max_tokens=args.online_tokens, arrival=arrivals.pop(0)))
            sched.add(users[-1])
        if not sched.has_work():
            now = arrivals[0] if arrivals else seconds
            continue
        plan = sched.schedule()
        now += plan.seconds
        sched.complete(plan, now)
        bucket = min(bucket + prefill_tokens_per_step, prefill_tokens_per_step)
    done = [u for u in users if u.finished_at is not None and u.first_token_at is not None]
    if keep is not None:
        keep["steps"], keep["online"] = (
            sched.trace,
            [{"arrival": u.arrival, "first_token": u.first_token_at} for u in done],
        )
    ttft = [u.first_token_at - u.arrival for u in done]  # type: ignore[operator]
    tpot = [(u.finished_at - u.first_token_at) / (u.max_tokens - 1) for u in done]  # type: ignore[operator]
    counters = sched.counters.generation_tokens
    wasted = sum(1 for piece in pieces if piece.output_tokens)  # a piece's one token is not the batch's
    return {
        "ttft_p99": statistics.quantiles(ttft, n=100, method="inclusive")[98],
        "tpot_p99": statistics.quantiles(tpot, n=100, method="inclusive")[98],
        "online_tokens": counters["online"],
        "batch_tokens": counters["batch"] - wasted,
        "pieces": len(pieces),
        "prefix_cache_hits": sched.prefix_cache.hits,
    }
