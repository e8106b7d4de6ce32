"""Issue 39's `lora-packing` part: many small jobs on many LoRA adapters of one base model, packed into one engine.

`--adapters` adapters (tiny random rank-8 adapters of the demo model, worker/engine/demo_adapter.py) x `--per-job`
chat lines each, submitted as one job per adapter. Three sides, the same engine settings (max_num_seqs,
max_model_len 2048, float32, eager, the same KV cache size, LoRA: max_loras, max_lora_rank 8), each in its own
processes, one after the other:
- Backfill: `backfill serve` with the adapters in the model's registry entry, every job uploaded and created at once;
  the clock runs from the first upload to the last output file downloaded, the server already up (its start-up,
  reported apart, excluded).
- run-batch: vLLM's `run_batch` once per job (`--enable-lora --lora-modules name=path`), as a user without Backfill
  runs them; its work is read from its log, "Reading batch from" to "Writing outputs to" (start-ups and shut-downs
  excluded, counted apart), summed over the jobs.
- ceiling: a bare `LLM.chat` with every line at once, each with its LoRARequest (engine start-up excluded).
Ratios: run-batch's seconds / Backfill's (goal >= 1.0) and the ceiling's seconds / Backfill's (Backfill's share of the
ceiling, goal >= 0.9). Every line asks for `--tokens` output tokens (`ignore_eos`), so all sides generate the same.

Usage: .venv/bin/python bench/lora_packing.py [--adapters 8] [--per-job 48] [--tokens 32] [--max-num-seqs 64]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT
from bench.runbatch import MODEL, Server, engine_env, run_batch, run_job, write_jsonl

MAX_LORA_RANK = 8


def line(adapter: str, n: int, tokens: int) -> dict[str, Any]:
    """The n-th line of an adapter's job (a system prompt and a question; no two prompts alike)."""
    body = {
        "model": adapter,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"Question {n} for {adapter}: what is {n} + {n}?"},
        ],
        "max_tokens": tokens,
        "ignore_eos": True,
        "temperature": 0,
    }
    return {"custom_id": f"{adapter}-{n}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def ceiling(model_dir: Path, adapters: dict[str, Path], jobs: dict[str, list[dict[str, Any]]], args: Any) -> float:
    """A bare LLM.chat over every line at once, each under its adapter, in its own process: seconds of the call."""
    script = f"""
import json, sys, time
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest
adapters = {json.dumps({name: str(path) for name, path in adapters.items()})}
lines = json.loads(sys.stdin.read())
ids = {{name: index + 1 for index, name in enumerate(adapters)}}
llm = LLM(model={str(model_dir)!r}, max_num_seqs={args.max_num_seqs}, max_model_len=2048, dtype="float32",
          enforce_eager=True, enable_lora=True, max_loras={args.max_loras}, max_lora_rank={MAX_LORA_RANK},
          max_cpu_loras={len(adapters) + 1})
params = SamplingParams(max_tokens={args.tokens}, ignore_eos=True, temperature=0)
conversations = [line["body"]["messages"] for line in lines]
loras = [LoRARequest(line["body"]["model"], ids[line["body"]["model"]], adapters[line["body"]["model"]]) for line in lines]
for name in adapters:  # loaded first, as Backfill's engine loads each before its first line
    llm.llm_engine.add_lora(LoRARequest(name, ids[name], adapters[name]))
started = time.perf_counter()
outputs = llm.chat(conversations, params, lora_request=loras, use_tqdm=False)
seconds = time.perf_counter() - started
print("CEILING", json.dumps({{"seconds": seconds, "ok": sum(1 for o in outputs if o.outputs)}}), flush=True)
"""
    everything = [item for lines in jobs.values() for item in lines]
    env = {**engine_env(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    done = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(everything), env=env, capture_output=True, text=True, cwd=OUT
    )
    for row in done.stdout.splitlines():
        if row.startswith("CEILING "):
            return float(json.loads(row.removeprefix("CEILING "))["seconds"])
    raise RuntimeError("the ceiling run failed:\n" + (done.stdout + done.stderr)[-3000:])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--per-job", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-loras", type=int, default=8)
    parser.add_argument("--runbatch-jobs", type=int, default=0, help="jobs run-batch runs (0: all; else mean x jobs)")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    from worker.engine.demo_adapter import build_demo_adapter
    from worker.engine.demo_model import build_demo_model

    model_dir = build_demo_model(OUT / "models" / MODEL)
    names = [f"lora-{index}" for index in range(args.adapters)]
    adapters = {name: build_demo_adapter(OUT / "adapters" / name, seed=index + 1) for index, name in enumerate(names)}
    work = Path(tempfile.mkdtemp(prefix="lora-packing-", dir=OUT))
    jobs = {name: [line(name, n, args.tokens) for n in range(args.per_job)] for name in names}
    files = {name: write_jsonl(work / f"{name}.jsonl", lines) for name, lines in jobs.items()}
    env = engine_env()

    spec = {"adapters": {name: str(path) for name, path in adapters.items()}, "max_lora_rank": MAX_LORA_RANK}
    spec["max_loras"] = args.max_loras
    server = Server(model_dir, args.max_num_seqs, 1, spec=spec, env=env)
    try:
        started = time.perf_counter()
        with cf.ThreadPoolExecutor(max_workers=len(files)) as pool:
            done = list(pool.map(lambda path: run_job(server.client(0), path), files.values()))
        backfill_seconds = time.perf_counter() - started
        swaps = _gauge(server, "backfill_engine_adapter_swaps")
        loads = _gauge(server, "backfill_engine_adapter_loads")
    finally:
        server.stop()
    print(json.dumps({"backfill_seconds": backfill_seconds, "swaps": swaps, "loads": loads}), flush=True)

    lora_flags = ["--enable-lora", "--max-loras", str(args.max_loras), "--max-lora-rank", str(MAX_LORA_RANK)]
    runs = []
    for name in names[: args.runbatch_jobs or len(names)]:
        flags = [*lora_flags, "--lora-modules", f"{name}={adapters[name]}"]
        run = run_batch(model_dir, files[name], args.max_num_seqs, extra=flags, env=env)
        run.pop("output")
        runs.append(run)
        print(json.dumps({"run_batch": {name: run}}), flush=True)
    if any(run["work_seconds"] is None for run in runs):
        raise RuntimeError("run-batch's log lacks 'Reading batch from' or 'Writing outputs to': no work time")
    scale = len(names) / len(runs)
    run_batch_seconds = sum(run["work_seconds"] for run in runs) * scale
    run_batch_startups = sum(run["seconds"] - run["work_seconds"] for run in runs) * scale
    ceiling_seconds = ceiling(model_dir, adapters, jobs, args)
    total = args.adapters * args.per_job
    result = {
        "adapters": args.adapters,
        "lines_per_job": args.per_job,
        "lines": total,
        "output_tokens_each": args.tokens,
        "max_num_seqs": args.max_num_seqs,
        "max_loras": args.max_loras,
        "backfill_seconds": round(backfill_seconds, 2),
        "backfill_ready_seconds": round(server.ready_seconds, 2),
        "backfill_adapter_swaps": swaps,
        "backfill_adapter_loads": loads,
        "run_batch_seconds": round(run_batch_seconds, 2),
        "run_batch_jobs_run": len(runs),
        "run_batch_startup_and_shutdown_seconds": round(run_batch_startups, 2),
        "ceiling_seconds": round(ceiling_seconds, 2),
        "speedup_vs_run_batch": round(run_batch_seconds / backfill_seconds, 3),
        "share_of_ceiling": round(ceiling_seconds / backfill_seconds, 3),
        "backfill_all_ok": all(job["status"] == "completed" for job in done) and sum(j["ok"] for j in done) == total,
        "run_batch_all_ok": all(run["ok"] == args.per_job for run in runs),
    }
    print(json.dumps(result, indent=2))
    (OUT / "lora-packing.json").write_text(json.dumps(result))
    _plot(result)
    return 0


def _gauge(server: Server, name: str) -> float | None:
    """A gauge of the server's /metrics (summed over its label sets), or None if absent."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    values = [float(row.split()[-1]) for row in text.splitlines() if row.startswith(name + "{")]
    return sum(values) if values else None


def _plot(result: dict[str, Any]) -> None:
    """Seconds of the three sides, a bar each (docs/lora-packing.png)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    sides = {
        "run-batch per job\n(start-ups excluded)": result["run_batch_seconds"],
        "Backfill\n(one engine, all jobs)": result["backfill_seconds"],
        "ceiling\n(bare LLM.chat, all lines)": result["ceiling_seconds"],
    }
    figure, axis = plt.subplots(figsize=(7, 3.5))
    axis.bar(list(sides), list(sides.values()), color=["#999999", "#1f77b4", "#2ca02c"])
    axis.set_ylabel("seconds")
    axis.set_title(f"{result['adapters']} LoRA adapters x {result['lines_per_job']} lines, one job per adapter")
    folder = Path(os.environ.get("BACKFILL_BENCH_PLOT_DIR") or Path(__file__).resolve().parents[1] / "docs")
    folder.mkdir(parents=True, exist_ok=True)
    figure.tight_layout()
    figure.savefig(folder / "lora-packing.png", dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
