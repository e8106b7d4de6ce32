"""Prefix-aware ordering benchmark: vLLM prefix-cache hit rate and throughput with vs without it.

The workload is what prefix caching is for: every request opens with one of several long (~1,000-token)
system prompts, e.g. an evaluation job that asks each item under P reviewer prompts, its lines
item-major, so consecutive lines cycle through the P prompts, and a second job of the same kind. Several
distinct prompts must be interleaved for the order to matter: with a single shared prefix every request
hits the cache whatever the order, because the one prefix is never evicted. Here the KV cache is kept
small (`--kv-blocks` blocks of 128 tokens, fewer than the P prompts need), so in line order each prompt
is evicted before it comes round again and almost every request prefills its whole prompt; with
prefix-aware ordering `claim` hands the runner one prompt's requests together and the cache serves all
but the first of them (and, sharing their prefix blocks, more of them fit in the cache at once).

Both sides use the real stack: the in-process vLLM engine on the demo model (prefix caching on, the
default), Backfill's Runner and its queue (embedded SQLite); they differ only in the setting
`BACKFILL_PREFIX_ORDERING`. Each side gets its own freshly generated prompts, so nothing cached by one
side helps the other; sides alternate over `--rounds`. Hit rate = prompt tokens served from the prefix
cache / prompt tokens of finished requests (from each request's `num_cached_tokens`, as vLLM's
`vllm:prefix_cache_hits_total` counts them). Prints JSON; `--quick` keeps the run under ~4 minutes.

Usage: .venv/bin/python bench/prefix.py [--quick] [--prompts 8] [--jobs 2] [--per-job 96] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, prepare_env, submit

BLOCK_TOKENS = 128  # vLLM's CPU block size
KV_BYTES_PER_TOKEN = 2 * 4 * 2 * 64 * 4  # K and V x 4 layers x 2 KV heads x head_dim 64 x fp32
WORDS = [
    "review",
    "style",
    "guide",
    "function",
    "module",
    "class",
    "argument",
    "return",
    "value",
    "error",
    "test",
    "coverage",
    "naming",
    "docstring",
    "type",
    "annotation",
    "import",
    "cycle",
    "interface",
    "boundary",
    "contract",
    "latency",
    "throughput",
    "memory",
    "cache",
    "queue",
    "lease",
    "deadline",
    "tenant",
    "batch",
    "request",
    "response",
    "schema",
    "migration",
    "index",
    "transaction",
    "commit",
    "rollback",
    "retry",
]


def make_prompts(tokenizer: Any, count: int, tokens: int, rng: random.Random) -> list[str]:
    """`count` distinct system prompts of about `tokens` tokens each (measured with the model's tokenizer)."""
    prompts = []
    for k in range(count):
        words = [f"You are reviewer {k}-{rng.randrange(10**6)}."]
        while len(tokenizer.encode(" ".join(words))) < tokens:
            words.extend(rng.choice(WORDS) for _ in range(50))
        while len(tokenizer.encode(" ".join(words))) > tokens:
            words.pop()
        prompts.append(" ".join(words))
    return prompts


def job_lines(prompts: list[str], job: int, per_job: int, max_tokens: int) -> list[dict[str, Any]]:
    """Item-major lines: item i asked under every prompt in turn, so neighbouring lines differ in prompt."""
    lines = []
    for i in range(per_job):
        system = prompts[(i + job) % len(prompts)]
        body = {
            "model": "backfill-demo",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"Item {job}-{i}."}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        lines.append({"custom_id": f"j{job}-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    return lines


def run_side(runner: Any, *, prefix_ordering: bool, lines_by_job: list[list[dict[str, Any]]]) -> dict[str, float]:
    """Queue the jobs, drain them through the runner, and measure hit rate and throughput."""
    from sqlalchemy import func, select

    from storage.db import transaction
    from storage.models import BatchRequest
    from storage.settings import get_settings

    os.environ["BACKFILL_PREFIX_ORDERING"] = "true" if prefix_ordering else "false"
    get_settings.cache_clear()
    assert get_settings().prefix_ordering is prefix_ordering
    batch_ids = []
    for index, lines in enumerate(lines_by_job):
        batch_ids.append(submit(lines, tenant="bench"))
        if index + 1 < len(lines_by_job):
            time.sleep(1.0)  # distinct jobs, distinct (but same-bucket) deadlines
    before = runner.engine.stats().extra
    started = time.perf_counter()
    while runner.run_for(30.0):
        pass
    seconds = time.perf_counter() - started
    after = runner.engine.stats().extra
    queries = after["prefix_cache_queries"] - before["prefix_cache_queries"]
    hits = after["prefix_cache_hits"] - before["prefix_cache_hits"]
    with transaction() as session:
        requests, output = session.execute(
            select(func.count(), func.sum(BatchRequest.completion_tokens)).where(
                BatchRequest.batch_id.in_(batch_ids), BatchRequest.status == "completed"
            )
        ).one()
    assert requests == sum(len(lines) for lines in lines_by_job), "some requests did not complete"
    return {
        "hit_rate": hits / queries if queries else 0.0,
        "prompt_tokens": float(queries),
        "cached_tokens": float(hits),
        "seconds": seconds,
        "requests_per_s": requests / seconds,
        "output_tokens_per_s": int(output or 0) / seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a small run (< ~4 minutes)")
    parser.add_argument("--prompts", type=int, default=8, help="distinct system prompts")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--per-job", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--kv-blocks", type=int, default=40, help="KV cache size in blocks of 128 tokens")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.quick:
        args.per_job, args.rounds = 48, 1
    model_dir = prepare_env(max_num_seqs=args.max_num_seqs)

    from transformers import AutoTokenizer

    from storage.registry import ModelSpec
    from storage.settings import get_settings
    from worker.engine.vllm_engine import VllmEngine
    from worker.feed.runner import Runner

    spec = ModelSpec(
        path=str(model_dir),
        max_num_seqs=args.max_num_seqs,
        max_model_len=2048,
        dtype="float32",
        kv_cache_memory_bytes=args.kv_blocks * BLOCK_TOKENS * KV_BYTES_PER_TOKEN,
    )
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # on CPU this legacy variable overrides kv_cache_memory_bytes
    engine = VllmEngine("backfill-demo", spec)
    runner = Runner(engine, model="backfill-demo", settings=get_settings())
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    rng = random.Random(20261201)

    def workload(per_job: int) -> list[list[dict[str, Any]]]:
        prompts = make_prompts(tokenizer, args.prompts, args.prompt_tokens, rng)
        return [job_lines(prompts, job, per_job, args.max_tokens) for job in range(args.jobs)]

    run_side(runner, prefix_ordering=True, lines_by_job=workload(8))  # warm the engine and the queue
    rounds: list[dict[str, dict[str, float]]] = []
    for index in range(args.rounds):
        sides = [False, True] if index % 2 == 0 else [True, False]
        measured = {side: run_side(runner, prefix_ordering=side, lines_by_job=workload(args.per_job)) for side in sides}
        rounds.append({"on": measured[True], "off": measured[False]})
        print(json.dumps({"round": index, **{k: _rounded(v) for k, v in rounds[-1].items()}}), flush=True)
    on = _mean([r["on"] for r in rounds])
    off = _mean([r["off"] for r in rounds])
    result = {
        "prompts": args.prompts,
        "prompt_tokens_each": args.prompt_tokens,
        "jobs": args.jobs,
        "requests_per_side": args.jobs * args.per_job,
        "max_num_seqs": args.max_num_seqs,
        "kv_cache_tokens": args.kv_blocks * BLOCK_TOKENS,
        "rounds": args.rounds,
        "prefix_ordering_on": _rounded(on),
        "prefix_ordering_off": _rounded(off),
        "hit_rate_on": round(on["hit_rate"], 3),
        "hit_rate_off": round(off["hit_rate"], 3),
        "throughput_ratio_on_vs_off": round(on["requests_per_s"] / off["requests_per_s"], 3),
        "prefill_tokens_ratio_on_vs_off": round(
            (on["prompt_tokens"] - on["cached_tokens"]) / max(1.0, off["prompt_tokens"] - off["cached_tokens"]), 3
        ),
    }
    print(json.dumps(result, indent=2))
    OUT.mkdir(exist_ok=True)
    (OUT / "prefix.json").write_text(json.dumps({"result": result, "rounds": rounds}))
    engine.close()
    return 0


def _mean(items: list[dict[str, float]]) -> dict[str, float]:
    return {key: sum(item[key] for item in items) / len(items) for key in items[0]}


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {key: round(value, 3) for key, value in values.items()}


if __name__ == "__main__":
    raise SystemExit(main())
