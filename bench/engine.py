"""Engine benchmark: Backfill's continuously fed runner vs bare vLLM on the same requests and settings.

1. Overhead: N chat requests with fixed output lengths through Backfill end to end (the API, in this
   process: upload → batch → validate/enqueue → runner → engine → results written → output file
   downloaded and checked) vs the same requests in one `LLM.generate` call on prompts rendered and
   tokenized beforehand (the fastest hand-written loop). Backfill's engine clock runs from the first claim
   to the last result written; upload, ingest and the output file are reported apart, outside it.
   `--rounds` rounds, each on fresh prompts with the first side alternating; the ratio is taken per round
   and reported as its median, quartiles and extremes (bench/engine_profile.py shows where the time goes).
2. Stragglers: 7 of every 8 requests want 100 tokens, 1 wants 1,000. Backfill's slot occupancy while
   work is queued, and its wall time vs the same requests sent in fixed chunks of max_num_seqs that
   wait for their slowest member (static batching).

Usage: .venv/bin/python bench/engine.py [--requests 1000] [--max-num-seqs 64] [--tokens 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, chat_line, fresh_postgres, plot_dir, prepare_env
from bench.engine_figures import plot_occupancy, plot_rounds, plot_sweep
from bench.round_stats import spread

_API: list[object] = []


def api_client():  # type: ignore[no-untyped-def]
    """The official SDK against the real API app, served in this process (no network, same code paths)."""
    if not _API:
        import openai
        from fastapi.testclient import TestClient

        from api.app import create_app
        from storage.db import transaction
        from storage.tenants import create_api_key

        with transaction() as session:
            key = create_api_key(session, tenant_name="bench")
        http = TestClient(create_app(), base_url="http://testserver")
        _API.append(openai.OpenAI(api_key=key, base_url="http://testserver/v1", http_client=http, max_retries=0))
    return _API[0]


def submit_via_api(lines: list[dict[str, object]]) -> str:
    """Upload and create the batch through the API, then validate/enqueue it as a worker would."""
    from worker.process import service

    client = api_client()
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    uploaded = client.files.create(file=("bench.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h")
    service.ingest(batch.id)
    return batch.id


def fetch_output(batch_id: str, expected: int) -> float:
    """Finalize, download the output file through the API and check every line came back; return seconds."""
    from worker.process import service

    client = api_client()
    started = time.perf_counter()
    service.finalize(batch_id)
    batch = client.batches.retrieve(batch_id)
    text = client.files.content(batch.output_file_id).text if batch.output_file_id else ""
    lines = [json.loads(line) for line in text.splitlines() if line]
    if batch.status != "completed" or len(lines) != expected or any(x["response"]["status_code"] != 200 for x in lines):
        raise RuntimeError(f"batch {batch_id} ended {batch.status} with {len(lines)} of {expected} good lines")
    return time.perf_counter() - started


def run_backfill(lines: list[dict[str, object]]) -> dict[str, float]:
    from sqlalchemy import func, select

    from storage.db import transaction
    from storage.models import BatchRequest, EngineRun
    from worker.process import service

    runner = service.get_runner("backfill-demo")
    runner.run.samples.clear()
    submit_started = time.perf_counter()
    batch_id = submit_via_api(lines)
    submit_seconds = time.perf_counter() - submit_started
    started = time.perf_counter()
    while runner.run_for(30.0):
        pass
    elapsed = time.perf_counter() - started
    output_seconds = fetch_output(batch_id, len(lines))
    with transaction() as session:
        tokens = session.scalar(
            select(func.sum(BatchRequest.completion_tokens)).where(BatchRequest.batch_id == batch_id)
        )
        runs = list(session.scalars(select(EngineRun)))
    queued = sum(r.queued_steps for r in runs)
    # Undefined (None) when work never waited: every request fit in the running batch at once.
    occupancy = (
        sum(r.queued_running_seq_steps for r in runs) / (queued * runner.engine.max_num_seqs) if queued else None
    )
    for run in runs:  # keep this measurement's runs apart from the next one's
        with transaction() as session:
            session.delete(session.get(EngineRun, run.id))
    return {
        "seconds": elapsed,
        "submit_seconds": submit_seconds,
        "output_seconds": output_seconds,
        "tokens": float(tokens or 0),
        "occupancy": occupancy,
        "samples": list(runner.run.samples),
    }  # type: ignore[dict-item]


def make_llm(model_dir: Path, max_num_seqs: int):  # type: ignore[no-untyped-def]
    """The bare side's engine, with the adapter's settings: `LLM` would default to 4,096 batched tokens per step
    on CPU, the adapter's `LLMEngine` (as `vllm serve`) to 2,048, so the bare side is given 2,048 too."""
    from vllm import LLM

    return LLM(
        model=str(model_dir),
        enforce_eager=True,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=2048,
        max_model_len=2048,
        dtype="float32",
    )


def run_vllm(llm, lines: list[dict[str, object]], *, chunk: int | None = None) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """`LLM.generate` on token prompts rendered with the model's chat template before the clock starts."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    tokenizer = llm.get_tokenizer()
    texts = [
        tokenizer.apply_chat_template(line["body"]["messages"], add_generation_prompt=True, tokenize=False)  # type: ignore[index]
        for line in lines
    ]
    # The template writes BOS itself, so no special tokens are added (as vLLM's chat path does).
    prompts = [TokensPrompt(prompt_token_ids=tokenizer.encode(text, add_special_tokens=False)) for text in texts]
    params = [SamplingParams(max_tokens=line["body"]["max_tokens"], ignore_eos=True) for line in lines]  # type: ignore[index]
    size = chunk or len(lines)
    started = time.perf_counter()
    tokens = 0
    for i in range(0, len(lines), size):
        outputs = llm.generate(prompts[i : i + size], params[i : i + size], use_tqdm=False)
        tokens += sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"seconds": time.perf_counter() - started, "tokens": float(tokens)}


def batch_size_sweep(llm, sizes: list[int], tokens: int) -> list[dict[str, float]]:  # type: ignore[no-untyped-def]
    """Bare-engine output tokens/s with 1..max_num_seqs sequences decoding together."""
    points = []
    for size in sizes:
        measured = run_vllm(llm, [chat_line(i, tokens) for i in range(size)])
        points.append({"batch": size, "tokens_per_s": measured["tokens"] / measured["seconds"]})
    return points


def omp_settings() -> dict[str, object]:
    """The threading both sides share (one process, one torch thread pool: identical by construction)."""
    import os

    import torch

    names = ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "LD_PRELOAD")
    return {"torch_threads": torch.get_num_threads(), **{name: os.environ.get(name) for name in names}}


def foreign_cpu_seconds(database: str | None) -> float:
    """CPU seconds the machine has been busy outside this process and this run's Postgres backends, so far."""
    import psutil

    from bench.engine_profile import postgres_cpu

    machine = psutil.cpu_times()
    busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0) - getattr(machine, "guest", 0.0)
    own = psutil.Process().cpu_times()
    return busy - own.user - own.system - postgres_cpu(database)


def overhead_rounds(
    llm, rounds: int, requests: int, tokens: int, database: str | None = None
) -> list[dict[str, object]]:  # type: ignore[no-untyped-def]
    """Each round: the same fresh requests through both sides, the first side alternating.

    Fresh per round: new prompts (neither engine's prefix cache holds them from an earlier round), a new
    batch, garbage collected before each side; the ratio is taken within the round (same machine state).
    Each side also records the share of the machine's cores that other processes kept busy meanwhile: on a
    shared machine one side of a round can run beside another job (round 1 of 5d3254d's run read 0.575 against
    0.82-0.91 in the others; the same bench and warm-up on the same commit later read 0.933 in round 1, and
    in another run a Backfill side fell to 0.467 of the bare side run just before it, in round 3), and this
    tells such a round from a slow Backfill.
    """
    import os

    from bench.engine_profile import Clocks
    from worker.process import service

    engines = {"vllm": llm.llm_engine, "backfill": service.get_runner("backfill-demo").engine._engine}  # type: ignore[attr-defined]
    out = []
    for index in range(rounds):
        lines = [chat_line(i, tokens) for i in range((index + 1) * 10**6, (index + 1) * 10**6 + requests)]
        sides = ("vllm", "backfill") if index % 2 else ("backfill", "vllm")
        measured: dict[str, dict[str, float]] = {}
        foreign: dict[str, float] = {}
        outside: dict[str, float] = {}
        for side in sides:
            gc.collect()
            clocks = Clocks()  # vLLM's own LLMEngine.step, timed on both sides
            clocks.wrap(engines[side], "step", "step")
            other, started = foreign_cpu_seconds(database), time.perf_counter()
            try:
                measured[side] = run_vllm(llm, lines) if side == "vllm" else run_backfill(lines)
            finally:
                clocks.unwrap(engines[side], ["step"])
            core_seconds = (time.perf_counter() - started) * (os.cpu_count() or 1)
            foreign[side] = (foreign_cpu_seconds(database) - other) / core_seconds
            steps = clocks.calls["step"] or 1
            outside[side] = 1000 * (measured[side]["seconds"] - clocks.seconds["step"]) / steps
        backfill, bare = measured["backfill"], measured["vllm"]
        a, b = backfill["tokens"] / backfill["seconds"], bare["tokens"] / bare["seconds"]
        out.append(
            {
                "first": sides[0],
                "backfill_tokens_per_s": a,
                "vllm_tokens_per_s": b,
                "ratio": a / b,
                "submit_seconds": backfill["submit_seconds"],
                "output_seconds": backfill["output_seconds"],
                "foreign_cpu_share": [foreign["backfill"], foreign["vllm"]],
                # ms per engine step spent outside vLLM's LLMEngine.step (rendering, results, the runner's loop)
                "outside_step_ms": [outside["backfill"], outside["vllm"]],
            }
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--stragglers", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5, help="overhead rounds (sides alternate)")
    parser.add_argument("--sqlite", action="store_true", help="queue on the embedded SQLite file, not Postgres")
    parser.add_argument("--sweep", default="1,2,4,8,16,32,64", help="batch sizes for the throughput curve")
    args = parser.parse_args()
    # The production queue: Postgres (falls back to the embedded SQLite file when no server answers).
    database = None if args.sqlite else fresh_postgres()
    model_dir = prepare_env(database_url=database, max_num_seqs=args.max_num_seqs)
    llm = make_llm(model_dir, args.max_num_seqs)
    warm = [chat_line(i, args.tokens) for i in range(64)]
    run_vllm(llm, warm)  # warm both engines the same way
    from worker.process import service

    service.get_runner("backfill-demo")
    run_backfill(warm)

    rounds = overhead_rounds(llm, args.rounds, args.requests, args.tokens, database)
    ratios = [r["ratio"] for r in rounds]
    best_backfill = max(r["backfill_tokens_per_s"] for r in rounds)
    best_bare = max(r["vllm_tokens_per_s"] for r in rounds)

    mix = [chat_line(i, 1000 if i % 8 == 7 else 100) for i in range(args.stragglers)]
    continuous = run_backfill(mix)
    static = run_vllm(llm, mix, chunk=args.max_num_seqs)
    useful = sum(line["body"]["max_tokens"] for line in mix)  # type: ignore[index]
    slots = sum(1000 for _ in range(0, len(mix), args.max_num_seqs)) * args.max_num_seqs
    sweep = batch_size_sweep(llm, [int(x) for x in args.sweep.split(",") if x], args.tokens)
    result = {
        "queue_database": "postgresql" if database else "sqlite",
        "requests": args.requests,
        "output_tokens_each": args.tokens,
        "max_num_seqs": args.max_num_seqs,
        "omp": omp_settings(),
        "rounds_tokens_per_s": [[round(r["backfill_tokens_per_s"]), round(r["vllm_tokens_per_s"])] for r in rounds],
        "rounds_first_side": [r["first"] for r in rounds],
        # [Backfill, bare]: the share of the cores other processes kept busy during each side (noise, not overhead)
        "rounds_foreign_cpu_share": [[round(x, 3) for x in r["foreign_cpu_share"]] for r in rounds],  # type: ignore[attr-defined]
        "backfill_tokens_per_s": round(best_backfill),
        "vllm_generate_tokens_per_s": round(best_bare),
        "throughput_ratio_rounds": [round(x, 3) for x in ratios],
        **spread("throughput_ratio", ratios),
        "throughput_ratio_best_vs_best": round(best_backfill / best_bare, 3),
        # Per engine step, the wall time outside vLLM's own LLMEngine.step: [Backfill, bare] each round, and
        # Backfill's extra (the part of the overhead that does not depend on how fast the machine steps).
        "rounds_outside_step_ms": [[round(x, 3) for x in r["outside_step_ms"]] for r in rounds],  # type: ignore[attr-defined]
        **spread("outside_step_ms_extra", [r["outside_step_ms"][0] - r["outside_step_ms"][1] for r in rounds]),  # type: ignore[index]
        "api_upload_and_enqueue_seconds": round(min(r["submit_seconds"] for r in rounds), 2),
        "output_file_seconds": round(min(r["output_seconds"] for r in rounds), 2),
        "batch_size_sweep": [{"batch": p["batch"], "tokens_per_s": round(p["tokens_per_s"])} for p in sweep],
        "straggler_requests": len(mix),
        "straggler_slot_occupancy_while_queued": (
            round(continuous["occupancy"], 3) if continuous["occupancy"] is not None else None
        ),
        "straggler_backfill_seconds": round(continuous["seconds"], 2),
        "straggler_static_chunks_seconds": round(static["seconds"], 2),
        "straggler_wall_ratio": round(continuous["seconds"] / static["seconds"], 3),
        "static_useful_work_share": round(useful / slots, 3),
    }
    print(json.dumps(result, indent=2))
    OUT.mkdir(exist_ok=True)
    (OUT / "engine.json").write_text(json.dumps({"result": result, "straggler_samples": continuous["samples"]}))
    plot_occupancy(continuous["samples"], args.max_num_seqs, plot_dir() / "straggler-occupancy.png")  # type: ignore[arg-type]
    plot_sweep(sweep, best_backfill, best_bare, args.max_num_seqs, plot_dir() / "throughput-vs-batch.png")
    plot_rounds(result, plot_dir() / "engine-overhead-rounds.png")
    del llm
    gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
