"""The prefix-heavy race (issue 22 section 5): Backfill end to end against vLLM's run-batch once per job.

Workload: `--tenants` jobs (one per tenant, submitted together) of `--per-job` lines each, an evaluation
suite run item-major: line n asks item n // P under system prompt n % P, so neighbouring lines differ in
prompt. The P (`--prompts`) system prompts are 800-1,000 tokens each (measured with the model's tokenizer);
by default every tenant's job uses the same P prompts (tenants running the same evaluation suite:
`shared_prompts` in the output), with `--distinct-prompts` each tenant has its own P. Outputs are 16-32
tokens (`ignore_eos`).

Sides, each in its own fresh process (nothing cached by one side helps another), all with the same engine
settings: the demo model, float32, eager, `max_num_seqs`, `max_num_batched_tokens`, prefix caching on and the
KV cache at `kv_cache_memory_bytes` (`VLLM_CPU_KVCACHE_SPACE` unset, since it would override that):
- run-batch: `python -m vllm.entrypoints.openai.run_batch` once per job, in file order, as its users run
  it. Its work is read from its log on every run, from "Reading batch from" (engine up) to "Writing outputs
  to" (every line answered): the race's ratio counts only that, a second ratio its whole walls (start-ups and
  shut-downs).
- Backfill: `backfill serve` (embedded default), already up; the clock runs from the first upload to the
  last output file downloaded, the jobs uploaded and created concurrently. With prefix ordering on (the
  default) and, as the control, off (`BACKFILL_PREFIX_ORDERING=false`).
Two KV sizes: `small` (`--small-kv-blocks` blocks of 128 tokens, fewer than the prompts need) and `large`
(holds every prompt and the running sequences). Hit rate = prompt tokens served from the prefix cache ÷
prompt tokens (Backfill: the batches' `usage.input_tokens_details.cached_tokens`; run-batch: its lines'
`usage.prompt_tokens_details.cached_tokens`, `--enable-prompt-tokens-details`). Plot: docs/prefix-race.png
(bench/prefix_race_figures.py: each side's seconds beside the goal's wall and the ceiling, per KV size).

Usage: .venv/bin/python bench/prefix_race.py [--quick] [--kv small,large] [--no-control] [--distinct-prompts]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, plot_dir
from bench.prefix import BLOCK_TOKENS, KV_BYTES_PER_TOKEN, make_prompts
from bench.prefix_race_figures import plot_race
from bench.runbatch import MODEL, Server, engine_env, run_batch, run_job, write_jsonl


def workload(tokenizer: Any, args: argparse.Namespace, rng: random.Random) -> list[list[dict[str, Any]]]:
    """One job per tenant, item-major over the system prompts (shared by the tenants unless --distinct-prompts)."""

    def prompts() -> list[str]:
        return [make_prompts(tokenizer, 1, rng.randint(800, 1000), rng)[0] for _ in range(args.prompts)]

    shared = prompts()
    jobs = []
    for tenant in range(args.tenants):
        mine = prompts() if args.distinct_prompts else shared
        lines = []
        for n in range(args.per_job):
            item, system = n // len(mine), mine[n % len(mine)]
            body = {
                "model": MODEL,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"Item {tenant}-{item}: grade it under the rubric above."},
                ],
                "max_tokens": rng.randint(16, 32),
                "ignore_eos": True,
            }
            lines.append({"custom_id": f"t{tenant}-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body})
        jobs.append(lines)
    return jobs


def race_env() -> dict[str, str]:
    """The engine environment without `VLLM_CPU_KVCACHE_SPACE`, so `kv_cache_memory_bytes` sets the cache."""
    env = engine_env()
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    return env


def run_batch_side(model_dir: Path, files: list[Path], args: argparse.Namespace, kv_bytes: int) -> dict[str, Any]:
    """run-batch once per job, one after another; per run its wall, its start-up, and the cached prompt tokens."""
    extra = [
        "--max-num-batched-tokens",
        str(args.max_num_batched_tokens),
        "--kv-cache-memory-bytes",
        str(kv_bytes),
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
    ]
    runs, prompt, cached, ok = [], 0, 0, 0
    for path in files:
        run = run_batch(model_dir, path, args.max_num_seqs, extra=extra, env=race_env())
        if run["work_seconds"] is None:
            raise RuntimeError("run-batch's log lacks 'Reading batch from' or 'Writing outputs to': no work time")
        for line in run.pop("output"):
            usage = ((line.get("response") or {}).get("body") or {}).get("usage") or {}
            prompt += usage.get("prompt_tokens") or 0
            cached += (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        ok += run["ok"]
        runs.append(run)
        print(json.dumps({"run_batch": {k: round(v, 2) for k, v in run.items() if k != "lines"}}), flush=True)
    walls = sum(r["seconds"] for r in runs)
    return {
        "seconds_with_startups": round(walls, 2),
        "startup_and_shutdown_seconds": [round(r["seconds"] - r["work_seconds"], 2) for r in runs],
        "seconds": round(sum(r["work_seconds"] for r in runs), 2),
        "hit_rate": round(cached / prompt, 3) if prompt else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "all_ok": ok == sum(len(path.read_text().splitlines()) for path in files),
    }


def backfill_side(
    model_dir: Path, files: list[Path], args: argparse.Namespace, kv_bytes: int, *, ordering: bool
) -> dict[str, Any]:
    """A fresh `backfill serve`; every job uploaded and created at once, one tenant each; first upload to last
    output file downloaded."""
    spec = {
        "kv_cache_memory_bytes": kv_bytes,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "extra": {"enable_prefix_caching": True},
    }
    env = {**race_env(), "BACKFILL_PREFIX_ORDERING": "true" if ordering else "false"}
    server = Server(model_dir, args.max_num_seqs, len(files), spec=spec, env=env)
    try:
        started, wall = time.perf_counter(), time.time()

        def one(tenant: int) -> dict[str, Any]:
            done = run_job(server.client(tenant), files[tenant], poll_seconds=args.poll_seconds)
            return {**done, "finished_seconds": time.perf_counter() - started}

        with cf.ThreadPoolExecutor(max_workers=len(files)) as pool:
            jobs = list(pool.map(one, range(len(files))))
        seconds = time.perf_counter() - started
    finally:
        server.stop()
    prompt = sum((job["usage"] or {}).get("input_tokens") or 0 for job in jobs)
    cached = sum(((job["usage"] or {}).get("input_tokens_details") or {}).get("cached_tokens") or 0 for job in jobs)
    expected = [{json.loads(line)["custom_id"] for line in path.read_text().splitlines()} for path in files]
    result = {
        "prefix_ordering": ordering,
        "seconds": round(seconds, 2),
        "ready_seconds": round(server.ready_seconds, 2),
        "seconds_with_startup": round(seconds + server.ready_seconds, 2),
        "job_finished_seconds": [round(job["finished_seconds"], 2) for job in jobs],
        **engine_time(server.data / "backfill.db", started_wall=wall),
        "hit_rate": round(cached / prompt, 3) if prompt else 0.0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "all_ok": all(
            job["status"] == "completed" and job["ok"] == len(ids) and sorted(job["custom_ids"]) == sorted(ids)
            for job, ids in zip(jobs, expected, strict=True)
        ),
    }
    print(json.dumps({"backfill": result}), flush=True)
    return result


def engine_time(database: Path, *, started_wall: float) -> dict[str, float]:
    """The server's engine runs (storage/models/ EngineRun): seconds inside `engine.step()`, steps, and the
    mean sequences a step ran, to tell the engine's time from Backfill's own; and from the rows, when the first
    line reached the engine and the last result was stored, in seconds from the first upload."""
    with sqlite3.connect(database) as conn:
        busy, steps, seqs = conn.execute(
            "SELECT SUM(busy_seconds), SUM(steps), SUM(running_seq_steps) FROM engine_runs"
        ).fetchone()
        first, last = conn.execute(
            "SELECT MIN(finished_at - engine_seconds), MAX(finished_at) FROM batch_requests"
        ).fetchone()
    return {
        "first_line_in_engine_seconds": round((first or started_wall) - started_wall, 2),
        "last_result_stored_seconds": round((last or started_wall) - started_wall, 2),
        "engine_busy_seconds": round(busy or 0.0, 2),
        "engine_steps": int(steps or 0),
        "mean_running_seqs": round((seqs or 0) / steps, 2) if steps else 0.0,
    }


def ideal_side(model_dir: Path, files: list[Path], args: argparse.Namespace, kv_bytes: int) -> dict[str, Any]:
    """The ceiling: bare `LLM.generate` on every line, prefix-sorted (bench/prefix_ideal.py, a fresh process)."""
    command = [sys.executable, str(Path(__file__).with_name("prefix_ideal.py")), "--model", str(model_dir)]
    command += ["--kv-bytes", str(kv_bytes), "--max-num-seqs", str(args.max_num_seqs)]
    command += ["--max-num-batched-tokens", str(args.max_num_batched_tokens), "--rounds", str(args.ideal_rounds)]
    done = subprocess.run([*command, *map(str, files)], env=race_env(), capture_output=True, text=True, cwd=OUT)
    lines = [line for line in done.stdout.splitlines() if line.startswith("IDEAL ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError("prefix_ideal.py failed:\n" + (done.stdout + done.stderr)[-3000:])
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("IDEAL "))
    print(json.dumps({"ideal": {k: v for k, v in result.items() if k != "rounds"}}), flush=True)
    return result


def race(model_dir: Path, files: list[Path], args: argparse.Namespace, blocks: int) -> dict[str, Any]:
    """One KV size: run-batch, Backfill with prefix ordering, and (the control) without; with `--ideal`, the
    ceiling too (bare `LLM.generate`, every line at once, prefix-sorted)."""
    kv_bytes = blocks * BLOCK_TOKENS * KV_BYTES_PER_TOKEN
    vllm = run_batch_side(model_dir, files, args, kv_bytes)
    ideal = ideal_side(model_dir, files, args, kv_bytes) if args.ideal else None
    on = backfill_side(model_dir, files, args, kv_bytes, ordering=True)
    off = backfill_side(model_dir, files, args, kv_bytes, ordering=False) if args.control else None
    result: dict[str, Any] = {
        "kv_cache_tokens": blocks * BLOCK_TOKENS,
        "kv_cache_bytes": kv_bytes,
        "run_batch": vllm,
        "backfill": on,
        "speedup": round(vllm["seconds"] / on["seconds"], 3),
        "speedup_startups_counted": round(vllm["seconds_with_startups"] / on["seconds_with_startup"], 3),
        "all_ok": vllm["all_ok"] and on["all_ok"],
    }
    if ideal is not None:
        result["ideal"] = ideal
        result["ideal_speedup"] = round(vllm["seconds"] / ideal["sorted"]["seconds"], 3)
        result["backfill_share_of_ideal"] = round(ideal["sorted"]["seconds"] / on["seconds"], 3)
    if off is not None:
        result["backfill_ordering_off"] = off
        result["speedup_ordering_off"] = round(vllm["seconds"] / off["seconds"], 3)
        result["all_ok"] = result["all_ok"] and off["all_ok"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="16 lines a job, a few minutes")
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--per-job", type=int, default=96)
    parser.add_argument("--prompts", type=int, default=8, help="system prompts (800-1,000 tokens each)")
    parser.add_argument("--distinct-prompts", action="store_true", help="each tenant has its own prompts")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--small-kv-blocks", type=int, default=40, help="blocks of 128 tokens: fewer than needed")
    parser.add_argument("--large-kv-blocks", type=int, default=640, help="blocks of 128 tokens: holds them all")
    parser.add_argument("--kv", default="small,large", help="which KV sizes to race: small,large")
    parser.add_argument("--no-control", dest="control", action="store_false", help="skip prefix ordering off")
    parser.add_argument("--ideal", action="store_true", help="also bare LLM.generate, prefix-sorted: the ceiling")
    parser.add_argument("--ideal-rounds", type=int, default=1)
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=1.0,
        help="each client's status poll (0.1 before stop 28: 40 retrieves/s beside the engine on 2 cores took"
        " ~2 s of a 12 s race; a late poll only adds to Backfill's clock)",
    )
    parser.add_argument("--seed", type=int, default=20261202)
    args = parser.parse_args()
    if args.quick:
        args.per_job = 16
    OUT.mkdir(exist_ok=True)
    from transformers import AutoTokenizer

    from worker.engine.demo_model import build_demo_model

    model_dir = build_demo_model(OUT / "models" / "backfill-demo")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    jobs = workload(tokenizer, args, random.Random(args.seed))
    work = Path(tempfile.mkdtemp(prefix="prefix-race-", dir=OUT))
    files = [write_jsonl(work / f"tenant{t}.jsonl", lines) for t, lines in enumerate(jobs)]
    blocks = {"small": args.small_kv_blocks, "large": args.large_kv_blocks}
    sizes = {name: race(model_dir, files, args, blocks[name]) for name in args.kv.split(",")}
    result = {
        "tenants": args.tenants,
        "lines_per_job": args.per_job,
        "prompts": args.prompts,
        "shared_prompts": not args.distinct_prompts,
        "prompt_tokens_range": [800, 1000],
        "output_tokens_range": [16, 32],
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        **sizes,
    }
    print(json.dumps(result, indent=2))
    (OUT / "prefix-race.json").write_text(json.dumps({"result": result}))
    plot_race(result, plot_dir() / "prefix-race.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
