"""Shared-mode benchmark: online latency and harvested batch throughput on one vLLM server.

A real `python -m vllm.entrypoints.openai.api_server` on the demo model with `--scheduling-policy priority`
serves an open-loop Poisson stream of short streaming chats (the online users, default priority 0). For
each online rate it measures, in the same run:

- online TTFT and TPOT (p50, p99) without Backfill, then with Backfill harvesting in shared mode (the
  Runner + HTTP engine fed from the real queue through the storage layer, as bench/engine.py does);
- the batch tokens/s Backfill harvested meanwhile (completion tokens of results it recorded);
- once, the batch tokens/s the server reaches with batch work alone (the same runner and queue, no online
  load, the budget allowed every slot: headroom 0).

- the same with the budget's `latency_slack` (default 0.10): batch work capped by the step-time model;
- a control without Backfill: a bare client keeping `max_num_seqs - headroom_seqs` batch requests on the
  server (what the default budget sends while nobody is online). It separates what batch sequences cost
  the server's online users from what Backfill itself adds.

Each rate's sides alternate in `--rounds` short rounds that replay the same arrivals, and their samples are
pooled, so a drift of the machine hits every side alike. The server runs in the harness's session: see
bench/vllm_server.py for why that matters on a small machine.

Ratios: p99 with ÷ without (goal <= 1.10) and harvested ÷ batch-alone (goal >= 0.70 at the lowest rate).
Goodput: a job with a tight window (`--tight-window-seconds`, sized to `--tight-share` of the batch-alone
capacity over that window) submitted beside the highest online rate and the 24h backlog left by the
phases before: requests completed before its deadline ÷ requests accepted (storage/finance/goodput.py).
Plots: docs/shared-throughput.png and docs/shared-latency.png. The online load generator runs in its own
process so the runner's Python work does not delay its clocks (it still shares the two cores).

Usage: .venv/bin/python bench/shared.py [--quick] [--rates 0.5,1,2] [--seconds 60] [--rounds 3]
       [--latency-slack 0.10] [--database-url URL] [--tight-window-seconds 60] [--tight-share 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import vllm_server
from bench._setup import plot_dir
from bench.online_load import (
    RAW,
    SERVED_NAME,
    collect,
    figures,
    go,
    online_figures,
    start_bare_batch,
    start_online_load,
)

MODEL = "backfill-demo"


# -- the vLLM server ----------------------------------------------------------------------------------


def start_server(model_dir: Path, max_num_seqs: int, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    return vllm_server.start(model_dir, served_name=SERVED_NAME, max_num_seqs=max_num_seqs, max_model_len=2048, log=log)


stop_server = vllm_server.stop


def server_counter(url: str, name: str) -> float:
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


# -- Backfill in shared mode --------------------------------------------------------------------------


def use_shared_registry(url: str, max_num_seqs: int, **knobs: Any) -> None:
    from storage.settings import get_settings

    shared = {"server_url": url, "server_model": SERVED_NAME, **knobs}
    registry = {MODEL: {"path": "served-by-the-server", "max_num_seqs": max_num_seqs, "shared": shared}}
    os.environ["BACKFILL_MODELS"] = json.dumps(registry)
    get_settings.cache_clear()


def harvest(
    seconds: float,
    lines: list[dict[str, Any]],
    *,
    online: subprocess.Popen[bytes] | None = None,
    window: str = "24h",
    warm_seconds: float = 2.0,
) -> dict[str, Any]:
    """Queue `lines`, run a fresh runner + HTTP engine for `seconds` (less once they are all done);
    tokens/s of the results it recorded, and the batch id."""
    from storage.db import transaction
    from storage.queue.backlog import open_count
    from storage.settings import get_settings
    from worker.engine.factory import load_engine
    from worker.feed.runner import Runner

    batch_id = submit_batch(lines, window=window)
    engine = load_engine(get_settings(), MODEL)
    runner = Runner(engine, model=MODEL, settings=get_settings())
    counted = {"on": False, "tokens": 0}  # the runner's own totals restart whenever the engine runs dry
    engine_step = engine.step

    def counting_step() -> list[Any]:
        results = engine_step()
        if counted["on"]:
            counted["tokens"] += sum(r.completion_tokens for r in results if r.error_code is None)
        return results

    engine.step = counting_step  # type: ignore[method-assign]
    try:
        runner.run_for(warm_seconds)  # the budget climbs to its limit; measure from here
        if online is not None:
            go(online)  # the online users start now
        counted["on"] = True
        started = time.perf_counter()
        while time.perf_counter() - started < seconds and runner.run_for(min(1.0, seconds)):
            with transaction() as session:
                if not open_count(session, batch_id=batch_id):
                    break
        elapsed = time.perf_counter() - started
        tokens = counted["tokens"]
        extra = engine.stats().extra
    finally:
        engine.close()  # type: ignore[attr-defined]
    return {
        "tokens_per_s": tokens / elapsed,
        "tokens": tokens,
        "seconds": elapsed,
        "yields": extra.get("yields", 0),
        "batch_id": batch_id,
        "step_model": {k: extra.get(k) for k in ("step_fixed_ms", "step_per_seq_ms", "slack_cap")},
        # Staged prefill (batch_prefill_stage_tokens): pieces sent (their one-token outputs are not in `tokens`).
        "staging": {k: extra[k] for k in ("stage_pieces", "stage_piece_tokens", "stage_plain") if k in extra},
    }


def submit_batch(lines: list[dict[str, Any]], *, window: str) -> str:
    """Upload + create + ingest a batch with its completion window through the storage layer."""
    from bench._setup import submit

    return submit(lines, model=MODEL, window=window)


def tight_job(url: str, rate: float, window_seconds: int, requests: int, args: argparse.Namespace) -> dict[str, Any]:
    """A job whose window is tight, run beside the highest online rate and the 24h backlog: its goodput."""
    from bench._setup import chat_line
    from storage.db import transaction
    from storage.finance.goodput import batch_goodput

    online = start_online_load(url, rate, window_seconds, args.online_tokens, args.seed + 100)
    lines = [{**chat_line(i, args.batch_tokens), "custom_id": f"tight{i}"} for i in range(requests)]
    run = harvest(window_seconds + 3, lines, online=online, window=f"{window_seconds}s", warm_seconds=0.0)
    online_figures(online, f"tight@{rate}")
    with transaction() as session:
        good = batch_goodput(session, batch_id=run["batch_id"])
    assert good is not None
    return {
        "online_rate_per_s": rate,
        "window_seconds": window_seconds,
        "requests": requests,
        "completed_on_time": good.completed_on_time,
        "completed_late": good.completed_late,
        "still_open_at_deadline": good.open,
        "goodput": round(good.goodput or 0.0, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="two rates, 15 s phases: under 5 minutes")
    parser.add_argument("--rates", default="0.5,1,2", help="online requests per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each measured phase")
    parser.add_argument("--online-tokens", type=int, default=32)
    parser.add_argument("--batch-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--database-url", default=None, help="Postgres URL (default: embedded SQLite)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--headroom-seqs", type=int, default=2, help="budget knob: slots kept free for online")
    parser.add_argument("--poll-seconds", type=float, default=0.2, help="budget knob: /metrics poll interval")
    parser.add_argument("--rounds", type=int, default=3, help="each rate's phases alternate in this many rounds")
    parser.add_argument(
        "--latency-slack", type=float, default=0.10, help="also measure the budget with this latency_slack (0: skip)"
    )
    parser.add_argument("--tight-window-seconds", type=int, default=60, help="completion window of the tight job")
    parser.add_argument("--tight-share", type=float, default=0.5, help="its work as a share of batch-alone capacity")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare-client control side")
    args = parser.parse_args()
    if args.rounds < 1 or args.seconds <= 0 or (args.latency_slack and args.latency_slack < 0):
        parser.error("--rounds must be >= 1, --seconds > 0 and --latency-slack >= 0")
    rates = [0.5, 2.0] if args.quick else [float(r) for r in args.rates.split(",")]
    seconds = 15.0 if args.quick else args.seconds
    if args.quick:
        args.tight_window_seconds, args.rounds = 30, 1
    os.environ["BACKFILL_COMPLETION_WINDOWS"] = json.dumps({"24h": "0.5", f"{args.tight_window_seconds}s": "0.3"})
    from bench._setup import OUT, prepare_env

    model_dir = prepare_env(database_url=args.database_url, max_num_seqs=args.max_num_seqs)
    server, url = start_server(model_dir, args.max_num_seqs, OUT / "shared-server.log")
    try:
        result = measure(url, rates, seconds, args)
    finally:
        stop_server(server)
    print(json.dumps(result, indent=2))
    (OUT / "shared.json").write_text(json.dumps({"result": result, "online_requests": RAW}))
    plot(result)
    return 0


def measure(url: str, rates: list[float], seconds: float, args: argparse.Namespace) -> dict[str, Any]:
    from bench._setup import chat_line

    slots = args.max_num_seqs
    # Enough queued work that the runner never runs dry: the whole server at ~1 s per request, twice over.
    backlog = int((seconds + 5) * slots * 2)
    lines = [chat_line(i, args.batch_tokens) for i in range(backlog)]
    _warm(url, args)
    use_shared_registry(url, slots, headroom_seqs=0)
    alone = harvest(seconds, lines)
    if not alone["tokens"]:
        raise RuntimeError(f"the batch-alone phase finished nothing: {alone}")
    knobs = {"headroom_seqs": args.headroom_seqs, "poll_seconds": args.poll_seconds}
    use_shared_registry(url, slots, **knobs)
    sides = ["without", "with"] + (["slack"] if args.latency_slack else []) + ([] if args.no_bare else ["bare"])
    bare_inflight = slots - args.headroom_seqs  # what the default budget keeps out while nobody is online
    part = seconds / args.rounds
    rows = []
    for index, rate in enumerate(rates):
        preempted = server_counter(url, "vllm:num_preemptions_total")
        online: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
        runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides if side != "without"}
        bare: list[dict[str, Any]] = []
        # The sides alternate in short rounds, each round replaying the same arrivals on every side, so a
        # drift of the machine (another tenant of the host, a slower minute) hits all sides alike.
        for round_ in range(args.rounds):
            seed = (args.seed + index) * 100 + round_
            for side in sides:
                proc = start_online_load(url, rate, part, args.online_tokens, seed)
                if side == "without":
                    go(proc)
                elif side == "bare":
                    batch = start_bare_batch(url, bare_inflight, part + 2, args.batch_tokens)
                    time.sleep(2)  # the client's requests are on the server before the users arrive
                    go(proc)
                    out, _ = batch.communicate(timeout=900)
                    bare.append(json.loads(out))
                elif side == "with":
                    runs[side].append(harvest(part, lines, online=proc))
                else:
                    use_shared_registry(url, slots, **knobs, latency_slack=args.latency_slack)
                    # 5 s before the users arrive: the step model needs samples at a few batch sizes (a
                    # worker that runs all day has them; a fresh one climbs through them first).
                    runs[side].append(harvest(part, lines, online=proc, warm_seconds=5.0))
                    use_shared_registry(url, slots, **knobs)
                online[side] += collect(proc, f"{side}@{rate}")
        without = figures(online["without"])
        row: dict[str, Any] = {"online_rate_per_s": rate, "without_backfill": without}
        for side, key, prefix in (("with", "with_backfill", ""), ("slack", "with_backfill_latency_slack", "slack_")):
            if side not in runs:
                continue
            got = figures(online[side])
            tokens = sum(run["tokens"] for run in runs[side])
            per_s = tokens / sum(run["seconds"] for run in runs[side])
            name = "with" if side == "with" else "slack"
            row |= {
                key: got,
                f"{prefix}harvested_batch_tokens_per_s": round(per_s, 1),
                f"{prefix}harvested_batch_tokens": tokens,
                f"{prefix}harvested_over_batch_alone": round(per_s / alone["tokens_per_s"], 3),
                f"ttft_p99_{name}_over_without": _ratio(got["ttft_p99_ms"], without["ttft_p99_ms"]),
                f"tpot_p99_{name}_over_without": _ratio(got["tpot_p99_ms"], without["tpot_p99_ms"]),
                f"ttft_p50_{name}_over_without": _ratio(got["ttft_p50_ms"], without["ttft_p50_ms"]),
                f"tpot_p50_{name}_over_without": _ratio(got["tpot_p50_ms"], without["tpot_p50_ms"]),
                f"{prefix}batch_calls_yielded": sum(run["yields"] for run in runs[side]),
            }
            if side == "slack":
                row["slack_step_model"] = runs[side][-1]["step_model"]
        if bare:
            got = figures(online["bare"])
            row |= {
                "with_bare_client": got,
                "bare_client_inflight": bare_inflight,
                "bare_client_tokens_per_s": round(sum(b["tokens_per_s"] for b in bare) / len(bare), 1),
                "ttft_p99_bare_over_without": _ratio(got["ttft_p99_ms"], without["ttft_p99_ms"]),
                "tpot_p99_bare_over_without": _ratio(got["tpot_p99_ms"], without["tpot_p99_ms"]),
                "ttft_p50_bare_over_without": _ratio(got["ttft_p50_ms"], without["ttft_p50_ms"]),
                "tpot_p50_bare_over_without": _ratio(got["tpot_p50_ms"], without["tpot_p50_ms"]),
            }
        row["server_preemptions"] = int(server_counter(url, "vllm:num_preemptions_total") - preempted)
        rows.append(row)
    lowest = rows[0]
    # The tight job needs `tight_share` of the server's batch-alone capacity over its window.
    window = int(args.tight_window_seconds)
    tight_requests = max(1, int(args.tight_share * window * alone["tokens_per_s"] / args.batch_tokens))
    tight = tight_job(url, rates[-1], window, tight_requests, args)
    return {
        "seconds_per_phase": seconds,
        "rounds": args.rounds,
        "max_num_seqs": slots,
        "online_tokens_each": args.online_tokens,
        "batch_tokens_each": args.batch_tokens,
        "budget": knobs,
        "latency_slack": args.latency_slack or None,
        "batch_alone_tokens_per_s": round(alone["tokens_per_s"], 1),
        "batch_alone_tokens": alone["tokens"],
        "rates": rows,
        "goal_p99_ratio_max": 1.10,
        "goal_harvest_ratio_min_at_lowest_rate": 0.70,
        "worst_ttft_p99_ratio": max((r["ttft_p99_with_over_without"] or 0) for r in rows),
        "worst_tpot_p99_ratio": max((r["tpot_p99_with_over_without"] or 0) for r in rows),
        "harvest_ratio_at_lowest_rate": lowest["harvested_over_batch_alone"],
        **(
            {
                "worst_ttft_p99_ratio_slack": max((r["ttft_p99_slack_over_without"] or 0) for r in rows),
                "worst_tpot_p99_ratio_slack": max((r["tpot_p99_slack_over_without"] or 0) for r in rows),
                "harvest_ratio_at_lowest_rate_slack": lowest["slack_harvested_over_batch_alone"],
            }
            if args.latency_slack
            else {}
        ),
        **(
            {
                "worst_ttft_p99_ratio_bare": max((r["ttft_p99_bare_over_without"] or 0) for r in rows),
                "worst_tpot_p99_ratio_bare": max((r["tpot_p99_bare_over_without"] or 0) for r in rows),
            }
            if not args.no_bare
            else {}
        ),
        "tight_window_job": tight,
    }


def _warm(url: str, args: argparse.Namespace) -> None:
    """One short online burst first, so the first measured phase does not pay for cold caches."""
    proc = start_online_load(url, 4.0, 3.0, args.online_tokens, 0)
    go(proc)
    proc.communicate(timeout=300)


def _ratio(with_: float | None, without: float | None) -> float | None:
    return round(with_ / without, 3) if with_ is not None and without else None


def plot(result: dict[str, Any]) -> None:
    """Throughput and p99 latency against the online rate: docs/shared-throughput.png, docs/shared-latency.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rates"]
    rates = [r["online_rate_per_s"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(rates, [r["harvested_batch_tokens_per_s"] for r in rows], marker="o", label="batch tokens/s harvested")
    if result.get("latency_slack"):
        label = f"harvested, latency_slack {result['latency_slack']}"
        ax.plot(rates, [r["slack_harvested_batch_tokens_per_s"] for r in rows], marker="s", label=label)
    alone = result["batch_alone_tokens_per_s"]
    ax.axhline(alone, color="grey", linestyle="--", label=f"batch alone: {alone:.0f} tokens/s")
    ax.axhline(0.7 * alone, color="grey", linestyle=":", label="70 % of batch alone (goal)")
    ax.set_xlabel("online load (requests/s, Poisson)")
    ax.set_ylabel("batch completion tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Shared mode: batch throughput harvested beside online traffic")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plot_dir() / "shared-throughput.png", dpi=110)

    fig, (ttft, tpot) = plt.subplots(1, 2, figsize=(10, 4))
    for axis, key, title in ((ttft, "ttft", "time to first token"), (tpot, "tpot", "time per output token")):
        sides = [("without_backfill", "--"), ("with_backfill", "-")]
        if result.get("latency_slack"):
            sides.append(("with_backfill_latency_slack", "-."))
        if "with_bare_client" in rows[0]:
            sides.append(("with_bare_client", ":"))
        for side, style in sides:
            values = [r[side][f"{key}_p99_ms"] for r in rows]
            axis.plot(rates, values, style, marker="o", label=f"p99 {side.replace('_', ' ')}")
        axis.set_xlabel("online load (requests/s)")
        axis.set_ylabel("ms")
        axis.set_ylim(bottom=0)
        axis.set_title(f"Online p99 {title}")
        axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(plot_dir() / "shared-latency.png", dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
