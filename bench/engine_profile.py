"""Where the engine overhead goes: per-step time in vLLM vs in Backfill's code, and CPU by thread and process.

The same job as bench/engine.py's overhead part (N chat requests, fixed output lengths, one warm in-process
engine each side, same settings and OMP threads, in one process): Backfill's runner vs `LLM.generate`, with
timers wrapped around vLLM's `LLMEngine.step` on both sides and around the runner's parts on Backfill's side.
Per side: wall time, steps, ms per step inside vLLM's step and outside it (Backfill: the adapter's result
building, the runner's top-up/admit/flush/renew), CPU seconds of each thread of this process and of the
Postgres backends of this run's database, and the shape of the steps each side ran (`step_shapes`: the same work
a step on both sides means a gap in the time a step takes is not the batch's composition). `--cprofile` adds the engine thread's hottest functions (a
profiled round of its own: the profiler slows what it measures).

Usage: .venv/bin/python bench/engine_profile.py [--requests 1000] [--tokens 64] [--rounds 2] [--cprofile]
       [--ahead on,off] (Backfill with and without the claimer thread rendering ahead, alternating)
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, chat_line, fresh_postgres, prepare_env


class Clocks:
    """Wall seconds and calls of wrapped callables (the engine thread's only; the I/O threads are not wrapped)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner: Any, attr: str, label: str) -> None:
        inner: Callable[..., Any] = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started
                self.calls[label] += 1

        setattr(owner, attr, timed)

    def unwrap(self, owner: Any, attrs: list[str]) -> None:
        for attr in attrs:
            owner.__dict__.pop(attr, None)


class Shapes:
    """What each engine step carried, from vLLM's scheduler: sequences, tokens, and prompt tokens among them.

    Two sides whose steps carry the same work are slower or faster for the time each step takes, not for how the
    runner composed the batch (stop 33: the in-step gap is the I/O threads' interference, not composition)."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int, int]] = []  # (sequences, tokens, prompt tokens) per step that ran

    def wrap(self, llm_engine: Any) -> Callable[[], None]:
        scheduler = llm_engine.engine_core.engine_core.scheduler  # the in-process engine core's scheduler
        inner = scheduler.schedule

        def schedule(*args: Any, **kwargs: Any) -> Any:
            out = inner(*args, **kwargs)
            tokens = out.num_scheduled_tokens  # request id -> tokens this step (1: a decode)
            if out.total_num_scheduled_tokens:
                self.steps.append(
                    (len(tokens), out.total_num_scheduled_tokens, sum(n for n in tokens.values() if n > 1))
                )
            return out

        scheduler.schedule = schedule
        return lambda: scheduler.__dict__.pop("schedule", None)

    def summary(self) -> dict[str, float]:
        return step_shapes(self.steps)


def step_shapes(steps: list[tuple[int, int, int]]) -> dict[str, float]:
    """Steps, those carrying prompt tokens, prompt tokens in all, and sequences a step (mean and at its most)."""
    if not steps:
        return {"steps": 0}
    most = max(seqs for seqs, _, _ in steps)
    return {
        "steps": len(steps),
        "steps_with_prompt_tokens": sum(1 for _, _, prompt in steps if prompt),
        "prompt_tokens": sum(prompt for _, _, prompt in steps),
        "tokens": sum(tokens for _, tokens, _ in steps),
        "sequences_per_step_mean": round(sum(seqs for seqs, _, _ in steps) / len(steps), 2),
        "steps_at_most_sequences": sum(1 for seqs, _, _ in steps if seqs == most),
    }


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, by name (unnamed native threads: 'native')."""
    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    totals: dict[str, float] = defaultdict(float)
    for t in psutil.Process().threads():
        name = names.get(t.id, "native (OMP, tokenizer)")
        totals["engine thread (main)" if name == "MainThread" else name] += t.user_time + t.system_time
    return dict(totals)


def postgres_cpu(database: str | None) -> float:
    """CPU seconds of the Postgres backends serving this run's database (0 when not readable or on SQLite)."""
    import psutil

    if not database:
        return 0.0
    name = database.rsplit("/", 1)[-1]
    total = 0.0
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(name in part for part in proc.info["cmdline"] or []):
                times = proc.cpu_times()
                total += times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


@contextmanager
def cpu_of(database: str | None, into: dict[str, Any]) -> Iterator[None]:
    threads, pg, started = thread_cpu(), postgres_cpu(database), time.perf_counter()
    pauses: dict[str, float] = defaultdict(float)  # the cyclic garbage collector's pauses, any thread's
    began: list[float] = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
            return
        pauses[f"gen{info['generation']}_seconds"] += time.perf_counter() - began[0]
        pauses[f"gen{info['generation']}_collections"] += 1

    gc.callbacks.append(on_gc)
    try:
        yield
    finally:
        gc.callbacks.remove(on_gc)
    into["gc"] = {k: round(v, 4) for k, v in sorted(pauses.items())}
    into["wall_s"] = time.perf_counter() - started
    after = thread_cpu()
    into["cpu_s"] = {k: round(after.get(k, 0.0) - threads.get(k, 0.0), 3) for k in sorted(after)}
    into["cpu_s"]["postgres backends"] = round(postgres_cpu(database) - pg, 3)


RUNNER_PARTS = ["_top_up", "_admit", "_flush", "_renew_if_due", "_collect_io", "_settle"]
ENGINE_PARTS = ["step", "add", "stats", "has_unfinished"]


def profile_backfill(
    lines: list[dict[str, Any]], database: str | None, profiler: cProfile.Profile | None, *, ahead: bool = True
) -> dict:
    from bench.engine import run_backfill
    from worker.process import service

    runner = service.get_runner("backfill-demo")
    engine, clocks = runner.engine, Clocks()
    renders = engine._ahead  # type: ignore[attr-defined]  # the claimer thread's renders (worker/engine/vllm_ahead.py)
    engine._ahead = renders if ahead else None  # type: ignore[attr-defined]  # off: add() renders on this thread
    core = engine._engine  # type: ignore[attr-defined]  # the vLLM LLMEngine inside the adapter
    clocks.wrap(core, "step", "vllm LLMEngine.step")
    clocks.wrap(core, "add_request", "vllm add_request")
    for attr in ENGINE_PARTS:
        clocks.wrap(engine, attr, f"adapter {attr}")
    for attr in RUNNER_PARTS:
        clocks.wrap(runner, attr, f"runner {attr}")
    clocks.wrap(runner, "run_for", "runner run_for")
    shapes = Shapes()
    unwrap_shapes = shapes.wrap(core)
    measured: dict[str, Any] = {}
    try:
        with cpu_of(database, measured):
            if profiler:
                profiler.enable()
            backfill = run_backfill(lines)
            if profiler:
                profiler.disable()
    finally:
        clocks.unwrap(core, ["step", "add_request"])
        clocks.unwrap(engine, ENGINE_PARTS)
        clocks.unwrap(runner, [*RUNNER_PARTS, "run_for"])
        engine._ahead = renders  # type: ignore[attr-defined]
        unwrap_shapes()
    return {**summary("backfill", backfill, clocks, measured), "step_shapes": shapes.summary()}


def profile_bare(llm: Any, lines: list[dict[str, Any]], database: str | None) -> dict:
    from bench.engine import run_vllm

    clocks = Clocks()
    clocks.wrap(llm.llm_engine, "step", "vllm LLMEngine.step")
    clocks.wrap(llm.llm_engine, "add_request", "vllm add_request")
    shapes = Shapes()
    unwrap_shapes = shapes.wrap(llm.llm_engine)
    measured: dict[str, Any] = {}
    try:
        with cpu_of(database, measured):
            bare = run_vllm(llm, lines)
    finally:
        clocks.unwrap(llm.llm_engine, ["step", "add_request"])
        unwrap_shapes()
    return {**summary("bare", bare, clocks, measured), "step_shapes": shapes.summary()}


def summary(side: str, run: dict[str, Any], clocks: Clocks, measured: dict[str, Any]) -> dict[str, Any]:
    steps = clocks.calls["vllm LLMEngine.step"] or 1
    vllm_s = clocks.seconds["vllm LLMEngine.step"]
    per_step = {k: round(1000 * v / steps, 3) for k, v in sorted(clocks.seconds.items())}
    return {
        "side": side,
        "tokens_per_s": round(run["tokens"] / run["seconds"]),
        "clock_seconds": round(run["seconds"], 3),
        "steps": steps,
        "ms_per_step_wall": round(1000 * run["seconds"] / steps, 3),
        "ms_per_step_in_vllm_step": round(1000 * vllm_s / steps, 3),
        "ms_per_step_outside_vllm_step": round(1000 * (run["seconds"] - vllm_s) / steps, 3),
        "ms_per_step_by_part": per_step,
        "calls": dict(sorted(clocks.calls.items())),
        **measured,
    }


def backfill_variants(lines: list[dict[str, Any]], database: str | None, flush_seconds: str, ahead: str) -> list[dict]:
    """Backfill's side once per flush interval and rendering-ahead setting asked for."""
    from worker.feed import runner as runner_module

    rows = []
    flushes = [{"flush_seconds": float(x)} for x in flush_seconds.split(",") if x] or [{}]
    for variant in [{**flush, "ahead": value} for flush in flushes for value in ahead.split(",")]:
        if "flush_seconds" in variant:  # the runner's result flush interval (worker/feed/runner.py)
            runner_module.FLUSH_SECONDS = variant["flush_seconds"]
        rows.append({**profile_backfill(lines, database, None, ahead=variant["ahead"] == "on"), **variant})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cprofile", action="store_true", help="one more Backfill round under cProfile")
    parser.add_argument("--flush-seconds", default="", help="e.g. 0.5,2: Backfill once per value each round")
    parser.add_argument("--ahead", default="on", help="on,off: Backfill with and without rendering ahead each round")
    args = parser.parse_args()
    database = fresh_postgres()
    model_dir = prepare_env(database_url=database, max_num_seqs=args.max_num_seqs)
    from bench.engine import make_llm, omp_settings, run_backfill, run_vllm

    llm = make_llm(model_dir, args.max_num_seqs)
    run_vllm(llm, [chat_line(i, 8) for i in range(64)])
    run_backfill([chat_line(i, 8) for i in range(64)])
    rows = []
    for index in range(args.rounds):  # fresh prompts each round (no prefix cache carried over), sides alternating
        lines = [chat_line(i, args.tokens) for i in range((index + 1) * 10**6, (index + 1) * 10**6 + args.requests)]
        gc.collect()
        first, second = ("bare", "backfill") if index % 2 else ("backfill", "bare")
        for side in (first, second):
            if side == "bare":
                rows.append(profile_bare(llm, lines, database))
            if side == "backfill":
                rows.extend(backfill_variants(lines, database, args.flush_seconds, args.ahead))
    result: dict[str, Any] = {"omp": omp_settings(), "rounds": rows}
    if args.cprofile:
        profiler = cProfile.Profile()
        lines = [chat_line(i, args.tokens) for i in range(9 * 10**6, 9 * 10**6 + args.requests)]
        result["cprofiled"] = profile_backfill(lines, database, profiler)
        profiler.dump_stats(OUT / "engine_profile.prof")
        for order, restrict in (("tottime", 30), ("cumulative", r"(worker|storage)/.*\.py")):
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats(order).print_stats(restrict, 40)
            result[f"cprofile_{order}"] = text.getvalue().splitlines()
    print(json.dumps(result, indent=2))
    OUT.mkdir(exist_ok=True)
    (OUT / "engine_profile.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
