"""Shared mode judged on a GPU-shaped server (issue 22, section 4): online latency and harvested batch tokens.

bench/shared.py runs shared mode against a real vLLM server on these 2 CPU cores, where a step is compute-bound
and the machine's own contention sets the tails. Here the server is bench/sim_server.py: vLLM's HTTP surface,
`/metrics` and priority scheduler with chunked prefill, every step lasting storage/planning/step_time.py's time
for Llama 3.1 70B FP8 on 8x H100 (max_num_seqs 384, max_num_batched_tokens 8192, the KV cache of 90% of HBM).
The real shared-mode client (the Runner + HttpEngine + dispatch budget, fed from the real Postgres queue,
bench/shared.py's `harvest`) harvests its idle capacity while an open-loop Poisson stream of streaming chats
(bench/online_load.py, its own process) measures TTFT and TPOT.

Per online rate, sides that alternate in `--rounds` rounds replaying the same arrivals (samples pooled):
  without  online users alone;
  with     Backfill harvesting with the default budget (headroom 2 slots, 0.2 s polls) but `grow_step` 8: the
           default 1 takes 76 s to climb to 384 slots; it starts `--warm-seconds` (10) before the users, so the
           rounds measure a budget near its steady state, as a worker that runs all day has;
  paced    the same with `batch_prefill_tokens_per_step` (default 10): batch prompts paced to that many tokens per
           server step on average (worker/engine/prefill_pace.py);
  staged   paced, and each batch prompt sent ahead as pieces of `--stage-tokens` (default 32) more tokens over the
           server's prefix cache (`batch_prefill_stage_tokens`, worker/engine/prefill_stage.py);
  slack    (with --sides) the same with `latency_slack` (default 0.10): batch work capped by the step model it fits.
`staged16` (any `staged<k>`) is staged with pieces of k tokens. With `--reference-rounds` N, the sides other than
`without` and the staged ones run in the first N rounds only (reference points, not the headline). The paced and
staged sides warm up `--paced-warm-seconds` (3: no budget to climb), the others `--warm-seconds`. Each load
generator sends one untimed request before the round starts (bench/online_load.py: a fresh process's first
request is 20-30 ms slower, and was every round's slowest). Once, batch alone: the runner with every slot (headroom 0), no online users. The server runs with vLLM's
`--long-prefill-token-threshold` 256 (above the online prompts, so their baseline is the flag-less server's).

Measures: online p99 (and p50) TTFT and TPOT with ÷ without, worst over rates (goal <= 1.10); the harvest
ratio = batch tokens Backfill recorded ÷ the capacity within the latency goal over the same wall: the most batch
tokens/s the formula allows beside these users with their TTFT step and mean step within 1.10x
(bench/shared_sim_frontier.py `capacity_within_goal`; goal >= 0.70); and, as before, ÷ the idle roofline
capacity = the formula's tokens/s at full batch for the batch job's shape (`estimate_job`, 384 slots) x the wall
- the online tokens the server produced meanwhile. Each with its spread over rounds, and the TTFT p99 ratio with a
bootstrap interval (bench/shared_sim_summary.py). The server's trace of every side and round (each step's make-up,
each online request's times) is saved with the run: bench/shared_sim_tail.py says which requests made the tail.

The frontier: the same scheduler on virtual time (no HTTP, no CPU noise), for each rate, with batch work held at a
constant number of requests in flight, or paced at a number of prompt tokens per step: each point's p99 ratios
and harvest, and the best point of each family with both ratios <= 1.10.

The server and the online users run at `--nice` (default -10): they stand for a GPU node's own host and for
users on other machines; Backfill's process gets what CPU is left. Plots: docs/shared-sim-cdf.png (online
TTFT and TPOT CDFs with and without batch work, per rate).

Usage: .venv/bin/python bench/shared_sim.py [--quick] [--rates 2,8,24] [--seconds 60] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import sim_server
from bench._setup import OUT, fresh_postgres, plot_dir
from bench.online_load import RAW, SERVED_NAME, collect, go, start_online_load
from bench.shared import MODEL, harvest, use_shared_registry
from bench.shared_sim_frontier import capacity_within_goal, frontier
from bench.shared_sim_summary import summarise_rate, summary
from storage.planning.node import HARDWARE_PRESETS, LLAMA_70B_FP8
from storage.planning.step_time import estimate_job

HARDWARE = "8xH100-SXM"


def prepare() -> None:
    """A fresh, migrated Postgres database (the production queue) and a data folder for the blobs."""
    from worker.cli.migrate import migrate_database

    database = fresh_postgres("backfill_sharedsim")
    if database is None:
        raise SystemExit("this benchmark needs Postgres on 127.0.0.1:5432 (the production queue)")
    os.environ["BACKFILL_DATABASE_URL"] = database
    OUT.mkdir(exist_ok=True)
    os.environ["BACKFILL_DATA_DIR"] = tempfile.mkdtemp(prefix="shared-sim-", dir=OUT)
    migrate_database()


def batch_lines(n: int, words: int, tokens: int) -> list[dict[str, Any]]:
    """Chat lines of `words`-word prompts (+2 per message as the server counts) and `tokens` outputs."""
    lines = []
    for i in range(n):
        content = " ".join([f"Summarise document {i}:"] + [f"w{j % 97}" for j in range(words - 3)])
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": tokens}
        lines.append({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    return lines


def capacity_tokens_per_s(args: argparse.Namespace) -> float:
    """The formula's output tokens/s at full batch for the batch job's shape (the roofline's capacity)."""
    prompt = args.batch_prompt_words + 2
    job = estimate_job(
        LLAMA_70B_FP8,
        HARDWARE_PRESETS[HARDWARE],
        prompt + args.batch_tokens,
        requests=1_000_000,
        prompt_tokens=prompt,
        output_tokens=args.batch_tokens,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    return job.output_tokens_per_s


def stats(url: str) -> dict[str, Any]:
    import httpx

    data: dict[str, Any] = httpx.get(f"{url}/sim/stats", timeout=10).json()
    return data


def delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """What the server did between two /sim/stats snapshots."""
    steps = after["steps"] - before["steps"]
    busy = after["busy_seconds"] - before["busy_seconds"]
    cpu = after["scheduler_cpu_seconds"] - before["scheduler_cpu_seconds"]
    return {
        "steps": steps,
        "busy_seconds": round(busy, 3),
        "online_tokens": after["generation_tokens"]["online"] - before["generation_tokens"]["online"],
        "batch_tokens": after["generation_tokens"]["batch"] - before["generation_tokens"]["batch"],
        "preemptions": after["preemptions"] - before["preemptions"],
        "prefix_cache_hits": after["prefix_cache_hits"] - before["prefix_cache_hits"],
        "mean_step_ms": round(1e3 * busy / steps, 3) if steps else None,
        "scheduler_cpu_us_per_step": round(1e6 * cpu / steps, 1) if steps else None,
        "process_cpu_ms_per_step": round(
            1e3 * (after["process_cpu_seconds"] - before["process_cpu_seconds"]) / steps, 3
        )
        if steps
        else None,
        "stalls": after["stalls"] - before["stalls"],
    }


def reset_prefix_cache(url: str) -> None:
    import httpx

    httpx.post(f"{url}/reset_prefix_cache", timeout=10).raise_for_status()


def server_timings(url: str) -> list[dict[str, Any]]:
    """The online requests the server finished since the last call, as rows `figures` reads (server clock)."""
    import httpx

    pairs = httpx.post(f"{url}/sim/online-timings", timeout=10).json()
    return [{"ok": True, "ttft": ttft, "tpot": tpot} for ttft, tpot in pairs]


def trace(url: str) -> dict[str, Any]:
    """The server's steps and online requests since the last call (bench/shared_sim_tail.py reads them)."""
    import httpx

    data: dict[str, Any] = httpx.post(f"{url}/sim/trace", timeout=30).json()
    return data


TRACES: dict[str, list[dict[str, Any]]] = {}  # "side@rate": per round, the server's trace


def online(url: str, rate: float, seconds: float, seed: int, args: argparse.Namespace) -> Any:
    proc = start_online_load(url, rate, seconds, args.online_tokens, seed, prompt_words=args.online_prompt_words)
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, proc.pid, args.nice)
    return proc


def run_side(
    url: str, side: str, rate: float, seed: int, lines: list[dict[str, Any]], args: argparse.Namespace
) -> dict[str, Any]:
    """One side of one round: the online users (and Backfill, unless `without`); figures and server deltas."""
    knobs: dict[str, Any] = {"headroom_seqs": args.headroom_seqs, "poll_seconds": 0.2, "grow_step": args.grow_step}
    if side == "slack":
        knobs["latency_slack"] = args.latency_slack
    if side == "paced" or side.startswith("staged"):
        knobs["batch_prefill_tokens_per_step"] = args.prefill_tokens_per_step
    if side.startswith("staged"):  # "staged16": pieces of 16 tokens, "staged": of --stage-tokens
        knobs["batch_prefill_stage_tokens"] = int(side.removeprefix("staged") or args.stage_tokens)
    use_shared_registry(url, args.max_num_seqs, **knobs)
    reset_prefix_cache(url)  # the sides replay the same prompts: none may find another side's in the cache
    part = args.seconds / args.rounds
    proc = online(url, rate, part, seed, args)
    server_timings(url)  # forget what came before
    trace(url)
    before = stats(url)
    run = None
    if side == "without":
        go(proc)
        time.sleep(part)
    else:
        paced = side == "paced" or side.startswith("staged")  # no budget to climb: steady in a second or two
        run = harvest(part, lines, online=proc, warm_seconds=args.paced_warm_seconds if paced else args.warm_seconds)
    rows = collect(proc, f"{side}@{rate}")
    server = delta(stats(url), before)
    out: dict[str, Any] = {"online": rows, "server": server, "server_online": server_timings(url)}
    TRACES.setdefault(f"{side}@{rate:g}", []).append({**trace(url), "client": rows})
    if run is not None:
        # Idle capacity over the measured wall: the roofline's full-batch tokens/s less what online took.
        idle = args.capacity * run["seconds"] - sum(r.get("tokens", 0) for r in rows if r["ok"])
        ratio = round(run["tokens"] / idle, 4) if idle > 0 else None
        # Within the goal: what the roofline allows beside these users with their steps within 1.10x.
        within = capacity_within_goal(args, rate) * run["seconds"]
        out |= {"harvest": run, "idle_tokens": idle, "harvest_ratio_vs_idle_roofline": ratio}
        out |= {"within_goal_tokens": within, "harvest_ratio": round(run["tokens"] / within, 4) if within else None}
    return out


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    lines = batch_lines(args.backlog, args.batch_prompt_words, args.batch_tokens)
    use_shared_registry(url, args.max_num_seqs, headroom_seqs=0, grow_step=args.grow_step)
    before = stats(url)
    alone = harvest(args.seconds / args.rounds, lines, warm_seconds=args.warm_seconds)
    alone_server = delta(stats(url), before)
    rows = []
    for index, rate in enumerate(args.rates):
        sides: dict[str, list[dict[str, Any]]] = {side: [] for side in args.sides}
        for round_ in range(args.rounds):
            for side in args.sides:
                if round_ >= args.reference_rounds and side != "without" and not side.startswith("staged"):
                    continue  # a reference side (default budget, paced alone): fewer rounds
                sides[side].append(run_side(url, side, rate, (args.seed + index) * 100 + round_, lines, args))
        rows.append(summarise_rate(rate, sides))
    return {
        "batch_alone": {**{k: v for k, v in alone.items() if k != "batch_id"}, "server": alone_server},
        "rates": rows,
    }


# -- the run ---------------------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's settings (with `argv` None, the command line's; [] gives the defaults)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="two rates, one round of 10 s, a 20 s frontier: ~4 minutes"
    )
    parser.add_argument("--rates", default="2,8,24", help="online requests per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured seconds per side and rate")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--reference-rounds", type=int, default=0, help="rounds of the sides other than without/staged (0: all)"
    )
    parser.add_argument(
        "--sides", default="without,with,paced,staged", help="also: slack (latency_slack), staged<k> (pieces of k)"
    )
    parser.add_argument("--online-tokens", type=int, default=64)
    parser.add_argument("--online-prompt-words", type=int, default=200)
    parser.add_argument("--batch-tokens", type=int, default=256)
    parser.add_argument("--batch-prompt-words", type=int, default=500)
    parser.add_argument("--max-num-seqs", type=int, default=384)
    parser.add_argument("--max-num-batched-tokens", type=int, default=sim_server.DEFAULT_MAX_NUM_BATCHED_TOKENS)
    # 256: above the online prompts (202 tokens), so the users' own prompts are never cut and their baseline is the
    # server's without the flag; a 502-token batch prompt goes in two chunks (docs/shared-mode.md).
    parser.add_argument("--long-prefill-token-threshold", type=int, default=256, help="the server's (vLLM's knob)")
    parser.add_argument("--prefill-tokens-per-step", type=float, default=10.0, help="the paced side's budget knob")
    parser.add_argument("--stage-tokens", type=int, default=32, help="the staged side's batch_prefill_stage_tokens")
    parser.add_argument("--headroom-seqs", type=int, default=2)
    # 8: the budget climbs to a 384-slot server's every slot in ~10 s of 0.2 s polls (the default 1 takes 76 s)
    parser.add_argument("--grow-step", type=int, default=8, help="budget knob: additive increase per poll")
    parser.add_argument("--latency-slack", type=float, default=0.10)
    parser.add_argument("--warm-seconds", type=float, default=10.0, help="Backfill runs this long before users come")
    parser.add_argument("--paced-warm-seconds", type=float, default=3.0, help="the same for paced and staged sides")
    parser.add_argument("--nice", type=int, default=-10, help="niceness of the server and the online users (0: none)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-frontier", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.rates, args.seconds, args.rounds = "2,24", 10.0, 1
    args.rates = [float(r) for r in args.rates.split(",")]
    args.sides = args.sides.split(",")
    args.reference_rounds = args.reference_rounds or args.rounds
    args.hardware = HARDWARE
    if "without" not in args.sides:
        parser.error("--sides must include without (the ratios' denominator)")
    args.capacity = capacity_tokens_per_s(args)
    # Enough queued work that the runner never runs dry: every Backfill side at the full batch's rate, twice.
    args.backlog = int(2 * args.capacity * (args.seconds / args.rounds + args.warm_seconds + 5) / args.batch_tokens)
    return args


def default_args(**overrides: Any) -> argparse.Namespace:
    """The defaults, as bench/shared_sim_tail.py's virtual runs use them."""
    return argparse.Namespace(**{**vars(parse([])), **overrides})


def main() -> int:
    args = parse()
    prepare()
    extra = ["--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    extra += ["--long-prefill-token-threshold", str(args.long_prefill_token_threshold)]
    proc, url = sim_server.start(
        served_name=SERVED_NAME,
        log=OUT / "shared-sim-server.log",
        nice=args.nice,
        extra=[*extra, "--hardware", HARDWARE],
    )
    started = time.perf_counter()
    try:
        result = measure(url, args)
        result["server_totals"] = stats(url)
    finally:
        from bench.vllm_server import stop

        stop(proc)
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["frontier"] = [] if args.no_frontier else frontier(args, seconds=20.0 if args.quick else 60.0)
    result["summary"] = summary(result, args)
    result["setup"] = {
        "hardware": HARDWARE,
        "model": "Llama 3.1 70B FP8 (storage/planning/node.py LLAMA_70B_FP8)",
        "capacity_tokens_per_s": round(args.capacity, 1),
        **{k: v for k, v in vars(args).items() if k not in ("capacity", "quick")},
    }
    print(
        json.dumps({"summary": result["summary"], "frontier": result["frontier"], "setup": result["setup"]}, indent=2)
    )
    (OUT / "shared_sim.json").write_text(json.dumps({"result": result, "online_requests": RAW, "traces": TRACES}))
    from bench.shared_sim_figures import plot_cdfs

    plot_cdfs(RAW, args.rates, plot_dir() / "shared-sim-cdf.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
