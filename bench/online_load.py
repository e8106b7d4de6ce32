"""The online users and the bare batch client of the shared-mode benchmark (bench/shared.py), as child processes.

Each runs in a process of its own so the runner's Python work does not delay its clocks (it still shares the
two cores): `start_online_load` replays an open-loop Poisson stream of short streaming chats and prints one
JSON list of per-request figures (TTFT, TPOT); `start_bare_batch` keeps a fixed number of batch requests on
the server, with no budget, and prints the tokens it got.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SERVED_NAME = "demo-online"


def question(index: int, words: int = 0) -> str:
    """An online user's question; with `words`, padded to that many words (tokens, as the simulated server counts)."""
    text = f"Question {index}: how do I reverse a list in Python?"
    return " ".join(text.split() + [f"w{j % 89}" for j in range(words - len(text.split()))]) if words else text


async def _online_request(client: Any, url: str, index: int, tokens: int, words: int = 0) -> dict[str, Any]:
    body = {
        "model": SERVED_NAME,
        "messages": [{"role": "user", "content": question(index, words)}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sent = time.perf_counter()
    first = last = None
    completion_tokens = 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            return {"ok": False, "status": response.status_code}
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices"):  # vLLM sends the first chunk once the first token exists
                last = time.perf_counter()
                first = first or last
            if chunk.get("usage"):
                completion_tokens = chunk["usage"]["completion_tokens"]
    if first is None or last is None:
        return {"ok": False, "status": 200}
    tpot = (last - first) / (completion_tokens - 1) if completion_tokens > 1 else None
    # `sent` and `first` on the machine's monotonic clock, as the simulated server stamps its own (bench/shared_sim_tail.py)
    return {"ok": True, "ttft": first - sent, "tpot": tpot, "tokens": completion_tokens, "sent": sent, "first": first}


async def _online_load(
    url: str, rate: float, seconds: float, tokens: int, seed: int, words: int = 0, wait: Any = None
) -> list[dict[str, Any]]:
    """The arrivals; with `wait` (a blocking callable, e.g. reading the parent's go), one untimed request first,
    then `wait()`, then the timed arrivals: a fresh process's first request pays its cold start (lazy imports, a
    new connection: 20-30 ms against ~10 ms for the rest), which made every round's first user the slowest and,
    at 2-8 req/s, the p99 itself (bench/shared_sim_tail.py shows it as the request's way in)."""
    import httpx

    rng = random.Random(seed)
    arrivals: list[float] = []
    at = rng.expovariate(rate)
    while at < seconds:
        arrivals.append(at)
        at += rng.expovariate(rate)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        if wait is not None:
            with contextlib.suppress(httpx.HTTPError):
                await _online_request(client, url, -1, 1, words)
            await asyncio.get_running_loop().run_in_executor(None, wait)
        start = time.perf_counter()

        async def one(index: int, offset: float) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            try:
                row = await _online_request(client, url, index, tokens, words)
            except httpx.HTTPError as error:
                row = {"ok": False, "status": type(error).__name__}
            return {**row, "at": round(offset, 3)}

        return list(await asyncio.gather(*(one(i, offset) for i, offset in enumerate(arrivals))))


async def _bare_batch(url: str, inflight: int, seconds: float, tokens: int) -> dict[str, Any]:
    """A bare client: `inflight` batch requests kept on the server at batch priority for `seconds`, no budget."""
    import httpx

    from bench._setup import chat_line

    done = {"tokens": 0, "requests": 0}
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(timeout=300) as client:

        async def worker(k: int) -> None:
            i = 0
            while time.perf_counter() < stop:
                body = {**chat_line(k * 100_000 + i, tokens)["body"], "model": SERVED_NAME, "priority": 1_000_000}
                response = await client.post(f"{url}/v1/chat/completions", json=body)
                if time.perf_counter() < stop:  # count what finished inside the window
                    done["tokens"] += response.json()["usage"]["completion_tokens"]
                    done["requests"] += 1
                i += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(inflight)))
    return {**done, "tokens_per_s": done["tokens"] / (time.perf_counter() - started)}


def start_bare_batch(url: str, inflight: int, seconds: float, tokens: int) -> subprocess.Popen[bytes]:
    """The bare batch client in a child process, started at once; prints one JSON object when done."""
    args = ["--bare-batch", url, "--inflight", str(inflight), "--seconds", str(seconds), "--batch-tokens", str(tokens)]
    return subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE)


def start_online_load(
    url: str, rate: float, seconds: float, tokens: int, seed: int, *, prompt_words: int = 0
) -> subprocess.Popen[bytes]:
    """The online users, in a child process that prints one JSON list of per-request figures."""
    args = ["--online-load", url, "--rate", str(rate), "--seconds", str(seconds), "--online-tokens", str(tokens)]
    args += ["--prompt-words", str(prompt_words)]
    command = [sys.executable, __file__, *args, "--seed", str(seed)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def go(proc: subprocess.Popen[bytes]) -> None:
    """Tell a waiting load generator to start its arrivals now."""
    assert proc.stdin is not None
    proc.stdin.write(b"go\n")
    proc.stdin.flush()  # communicate() closes it later


RAW: dict[str, list[dict[str, Any]]] = {}  # every online request of every phase, saved to bench/out/shared.json


def collect(proc: subprocess.Popen[bytes], label: str) -> list[dict[str, Any]]:
    """The per-request figures a load generator printed (kept in RAW under `label`, rounds pooled)."""
    out, _ = proc.communicate(timeout=900)
    rows: list[dict[str, Any]] = json.loads(out)
    RAW.setdefault(label, []).extend(rows)
    return rows


def figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [row for row in rows if row["ok"]]
    ttft = [row["ttft"] * 1000 for row in ok]
    tpot = [row["tpot"] * 1000 for row in ok if row["tpot"] is not None]
    return {
        "requests": len(rows),
        "errors": len(rows) - len(ok),
        "ttft_p50_ms": percentile(ttft, 50),
        "ttft_p99_ms": percentile(ttft, 99),
        "tpot_p50_ms": percentile(tpot, 50),
        "tpot_p99_ms": percentile(tpot, 99),
    }


def online_figures(proc: subprocess.Popen[bytes], label: str) -> dict[str, Any]:
    return figures(collect(proc, label))


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0], 2)
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1], 2)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--online-load", default=None)
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--online-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--prompt-words", type=int, default=0, help="pad each question to this many words")
    parser.add_argument("--bare-batch", default=None)
    parser.add_argument("--inflight", type=int, default=6)
    parser.add_argument("--batch-tokens", type=int, default=64)
    args = parser.parse_args()
    if args.online_load:
        return run_online_child(args)
    if args.bare_batch:
        print(json.dumps(asyncio.run(_bare_batch(args.bare_batch, args.inflight, args.seconds, args.batch_tokens))))
        return 0
    parser.error("--online-load URL or --bare-batch URL")


def run_online_child(args: argparse.Namespace) -> int:
    """Warm up (one untimed request), wait for the parent's go on stdin, run the arrivals, print the figures as one
    JSON list."""
    load = _online_load(
        args.online_load, args.rate, args.seconds, args.online_tokens, args.seed, args.prompt_words, sys.stdin.readline
    )
    rows = asyncio.run(load)
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
