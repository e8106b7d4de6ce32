"""Issue 39's `lora-packing` part: many small jobs on many LoRA adapters of one base model, packed into one engine.

`--adapters` adapters (tiny random rank-8 adapters of the demo model, worker/engine/demo_adapter.py) x `--per-job`
chat lines each, submitted as one job per adapter. Three sides, the same engine settings (max_num_seqs,
max_model_len 2048, float32, eager, the same KV cache size, LoRA: max_loras, max_lora_rank 8), each in its own
processes, one after the other:
- Backfill: `backfill serve` with the adapters in the model's registry entry, every job uploaded and created at once,
  each followed as Backfill's own client follows a batch (client/progress.py: long-polls of up to `--poll-seconds`,
  1 s, answered the moment the batch ends; `--plain-polls` polls every `--poll-seconds` instead); the clock runs from
  the first upload to the last output file downloaded, the server already up (its start-up, reported apart,
  excluded). Its engine's steps, seconds inside steps and running sequences per step come from /metrics, the CPU
  seconds of the server's threads (the API's among them: it shares the engine's process and cores) from /proc.
- run-batch: vLLM's `run_batch` once per job (`--enable-lora --lora-modules name=path`), as a user without Backfill
  runs them; its work is read from its log, "Reading batch from" to "Writing outputs to" (start-ups and shut-downs
  excluded, counted apart), summed over the jobs.
- ceiling: a bare `LLM.chat` with every line at once, each with its LoRARequest (engine start-up excluded; its
  adapters' `add_lora` counted in, as Backfill's engine loads each inside Backfill's clock), run just before and just
  after Backfill, the mean of the two the figure (the machine's load drifts over minutes); its steps counted too.
Ratios: run-batch's seconds / Backfill's (goal >= 1.0) and the ceiling's seconds / Backfill's (Backfill's share of the
ceiling, goal >= 0.9). Every line asks for `--tokens` output tokens (`ignore_eos`), so all sides generate the same.

Usage: .venv/bin/python bench/lora_packing.py [--adapters 8] [--per-job 48] [--tokens 32] [--max-num-seqs 64]
       [--runbatch-jobs N] [--poll-seconds 1.0] [--plain-polls] [--no-run-batch]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import functools
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


class Ceiling:
    """A bare LLM.chat over every line at once, each under its adapter, in its own process kept up between runs (its
    start-up excluded, its adapters loaded once at start and that time added to every run: Backfill loads its inside
    its clock): each `run` is the seconds of one call and its engine's steps (count, seconds inside them, running
    sequences summed over them)."""

    def __init__(self, model_dir: Path, adapters: dict[str, Path], lines: list[dict[str, Any]], args: Any) -> None:
        source = Path(tempfile.mkdtemp(prefix="lora-ceiling-", dir=OUT)) / "lines.json"
        source.write_text(json.dumps(lines))
        script = f"""
import json, sys, time
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest
adapters = {json.dumps({name: str(path) for name, path in adapters.items()})}
lines = json.loads(open({str(source)!r}).read())
ids = {{name: index + 1 for index, name in enumerate(adapters)}}
llm = LLM(model={str(model_dir)!r}, max_num_seqs={args.max_num_seqs}, max_model_len=2048, dtype="float32",
          enforce_eager=True, enable_lora=True, max_loras={args.max_loras}, max_lora_rank={MAX_LORA_RANK},
          max_cpu_loras={max(len(adapters) + 1, args.max_loras)})
core = llm.llm_engine.engine_core.engine_core
plain_step = llm.llm_engine.step
def counted_step():
    began = time.perf_counter()
    outputs = plain_step()
    tally["step_seconds"] += time.perf_counter() - began
    tally["steps"] += 1
    finished = sum(1 for output in outputs if output.finished)
    tally["running_seq_steps"] += min({args.max_num_seqs}, core.scheduler.get_request_counts()[0] + finished)
    return outputs
llm.llm_engine.step = counted_step
params = SamplingParams(max_tokens={args.tokens}, ignore_eos=True, temperature=0)
conversations = [line["body"]["messages"] for line in lines]
loras = [LoRARequest(line["body"]["model"], ids[line["body"]["model"]], adapters[line["body"]["model"]]) for line in lines]
loading = time.perf_counter()
for name in adapters:  # loaded first, as Backfill's engine loads each before its first line
    llm.llm_engine.add_lora(LoRARequest(name, ids[name], adapters[name]))
load_seconds = time.perf_counter() - loading
tally = {{"steps": 0, "step_seconds": 0.0, "running_seq_steps": 0}}  # the warm-up's, not reported
firsts = {{line["body"]["model"]: index for index, line in reversed(list(enumerate(lines)))}}.values()
llm.chat([conversations[i] for i in firsts], params, lora_request=[loras[i] for i in firsts], use_tqdm=False)  # warm
print("READY", flush=True)
for command in sys.stdin:
    tally = {{"steps": 0, "step_seconds": 0.0, "running_seq_steps": 0, "load_seconds": load_seconds}}
    started, cpu = time.perf_counter(), time.process_time()
    outputs = llm.chat(conversations, params, lora_request=loras, use_tqdm=False)
    seconds = time.perf_counter() - started + load_seconds
    tally["cpu_seconds"] = time.process_time() - cpu
    print("CEILING", json.dumps({{"seconds": seconds, "ok": sum(1 for o in outputs if o.outputs), **tally}}), flush=True)
"""
        self.log = (source.parent / "ceiling.log").open("w")
        env = {**engine_env(), "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script],
            env=env,
            cwd=OUT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self._expect("READY")

    def _expect(self, head: str) -> str:
        assert self.proc.stdout is not None
        for row in self.proc.stdout:
            if row.startswith(head):
                return row.removeprefix(head).strip()
        raise RuntimeError(f"the ceiling process ended: see {self.log.name}")

    def run(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return dict(json.loads(self._expect("CEILING")))

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(60)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapters", type=int, default=8)
    parser.add_argument("--per-job", type=int, default=48)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-loras", type=int, default=8)
    parser.add_argument("--runbatch-jobs", type=int, default=0, help="jobs run-batch runs (0: all; else mean x jobs)")
    parser.add_argument(
        "--poll-seconds", type=float, default=1.0, help="each job's long-polls, at most (client/progress.py's)"
    )
    parser.add_argument("--plain-polls", action="store_true", help="poll every --poll-seconds (no long-poll)")
    parser.add_argument("--rounds", type=int, default=3, help="Backfill rounds, each between two ceiling runs")
    parser.add_argument("--no-run-batch", action="store_true", help="Backfill and the ceiling only (print, no result)")
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
    # Rounds that alternate, the ceiling before and after each of Backfill's (C B C B C ... C), both processes up the
    # whole time: on a machine shared with other jobs the load drifts over minutes (one ceiling run took 14 s, the
    # next 93 s), so each Backfill round is compared with the mean of the ceiling runs around it, and the figure is
    # the median round's.
    top = Ceiling(model_dir, adapters, [item for lines in jobs.values() for item in lines], args)
    server = Server(model_dir, args.max_num_seqs, 1, spec=spec, env=env)
    try:
        ceilings, rounds = [top.run()], []
        print(json.dumps({"ceiling": ceilings[-1]}), flush=True)
        for _ in range(args.rounds):
            rounds.append(_backfill(server, files, args))
            print(json.dumps({"backfill": rounds[-1]}), flush=True)
            ceilings.append(top.run())
            print(json.dumps({"ceiling": ceilings[-1]}), flush=True)
    finally:
        server.stop()
        top.stop()
    shares = [(ceilings[i]["seconds"] + ceilings[i + 1]["seconds"]) / 2 / r["seconds"] for i, r in enumerate(rounds)]
    median = sorted(range(len(rounds)), key=lambda i: shares[i])[len(rounds) // 2]
    backfill = {**rounds[median], "ready_seconds": server.ready_seconds}
    keys = ("seconds", "steps", "step_seconds", "running_seq_steps", "cpu_seconds", "load_seconds")
    top_figures = {key: (ceilings[median][key] + ceilings[median + 1][key]) / 2 for key in keys}
    if args.no_run_batch:
        return 0
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
    top = top_figures
    backfill_seconds, ceiling_seconds = backfill["seconds"], top["seconds"]
    total = args.adapters * args.per_job
    result = {
        "adapters": args.adapters,
        "lines_per_job": args.per_job,
        "lines": total,
        "output_tokens_each": args.tokens,
        "max_num_seqs": args.max_num_seqs,
        "max_loras": args.max_loras,
        "backfill_seconds": round(backfill_seconds, 2),
        "backfill_ready_seconds": round(backfill["ready_seconds"], 2),
        "backfill_adapter_swaps": backfill["swaps"],
        "backfill_adapter_loads": backfill["loads"],
        "backfill_engine_busy_seconds": round(backfill["engine_busy_seconds"], 2),
        "backfill_engine_steps": backfill["engine_steps"],
        "backfill_mean_running": backfill["mean_running"],
        "backfill_server_cpu_seconds": backfill["server_cpu_seconds"],
        "backfill_api_thread_cpu_seconds": backfill["api_thread_cpu_seconds"],
        "backfill_client_cpu_seconds": backfill["client_cpu_seconds"],
        "backfill_poll_seconds": args.poll_seconds,
        "backfill_long_polls": not args.plain_polls,
        "run_batch_seconds": round(run_batch_seconds, 2),
        "run_batch_jobs_run": len(runs),
        "run_batch_startup_and_shutdown_seconds": round(run_batch_startups, 2),
        "ceiling_seconds": round(ceiling_seconds, 2),
        "ceiling_before_and_after_seconds": [round(c["seconds"], 2) for c in ceilings[median : median + 2]],
        "rounds": args.rounds,
        "round_shares_of_ceiling": [round(share, 3) for share in shares],
        "round_backfill_seconds": [round(r["seconds"], 2) for r in rounds],
        "round_ceiling_seconds": [round(c["seconds"], 2) for c in ceilings],
        "ceiling_cpu_seconds": round(top["cpu_seconds"], 2),
        "ceiling_adapter_load_seconds": round(top["load_seconds"], 3),
        "ceiling_engine_busy_seconds": round(top["step_seconds"], 2),
        "ceiling_engine_steps": top["steps"],
        "ceiling_mean_running": round(top["running_seq_steps"] / max(1, top["steps"]), 1),
        "speedup_vs_run_batch": round(run_batch_seconds / backfill_seconds, 3),
        "share_of_ceiling": round(shares[median], 3),
        "backfill_all_ok": all(r["all_ok"] for r in rounds),
        "run_batch_all_ok": all(run["ok"] == args.per_job for run in runs),
    }
    print(json.dumps(result, indent=2))
    (OUT / "lora-packing.json").write_text(json.dumps(result))
    _plot(result)
    return 0


COUNTERS = {
    "engine_busy_seconds": "backfill_engine_busy_seconds_total",
    "engine_steps": "backfill_engine_steps_total",
    "running_seq_steps": "backfill_engine_running_seq_steps_total",
}


def _backfill(server: Server, files: dict[str, Path], args: Any) -> dict[str, Any]:
    """One round of Backfill's side on the running server: every job uploaded and created at once, first upload to
    last output file; its engine's counters in the round (seconds inside steps, steps, running sequences per step)
    from /metrics, the CPU seconds of the server's threads from /proc."""
    metric = functools.partial(_gauge, server)
    counted = {key: metric(name) or 0.0 for key, name in COUNTERS.items()}
    before, client_cpu = _thread_cpu(server.proc.pid), time.process_time()
    started = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=len(files)) as pool:
        poll = functools.partial(run_job, poll_seconds=args.poll_seconds, long_poll=not args.plain_polls)
        done = list(pool.map(lambda path: poll(server.client(0), path), files.values()))
    seconds = time.perf_counter() - started
    client_cpu = time.process_time() - client_cpu
    used = {tid: cpu - before.get(tid, 0.0) for tid, cpu in _thread_cpu(server.proc.pid).items()}
    counted = {key: (metric(name) or 0.0) - counted[key] for key, name in COUNTERS.items()}
    return {
        "seconds": seconds,
        "swaps": metric("backfill_engine_adapter_swaps"),  # since the server started
        "loads": metric("backfill_engine_adapter_loads"),
        "engine_busy_seconds": counted["engine_busy_seconds"],
        "engine_steps": counted["engine_steps"],
        "mean_running": round(counted["running_seq_steps"] / max(1, counted["engine_steps"]), 1),
        "server_cpu_seconds": round(sum(used.values()), 2),
        "api_thread_cpu_seconds": round(used.get(server.proc.pid, 0.0), 2),  # uvicorn's loop: the polls
        "thread_cpu_seconds": sorted((round(v, 2) for v in used.values() if v >= 0.05), reverse=True),
        "client_cpu_seconds": round(client_cpu, 2),  # this process: the jobs' uploads and polls
        "all_ok": all(job["status"] == "completed" for job in done)
        and sum(job["ok"] for job in done) == args.adapters * args.per_job,
    }


def _thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of process `pid` so far, by thread id (/proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended meanwhile
        seconds[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return seconds


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
