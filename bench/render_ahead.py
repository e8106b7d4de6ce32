"""Rendering ahead on a GPU-shaped engine thread: what the claimer's renders cost the engine thread through the GIL.

On a GPU node the engine thread spends most of a step waiting for the GPU with the GIL released; what it does
between those waits (vLLM's scheduler and output processing, Backfill's `add`) is time the GPU idles. Rendering a
request on the engine thread adds its render to that time; rendering it on the claimer thread
(worker/engine/vllm_ahead.py) removes it, but the claimer then holds the GIL in bursts (a claim's rows at once),
and an engine thread back from the GPU waits for the GIL while it does. This measures both on these cores, where
the two threads have a core each and only the GIL is shared, as on a GPU node's host: the engine thread loops
over `time.sleep(gpu_ms)` (the GPU wait, GIL released) and `host_ms` of Python work (vLLM's own part of a step),
and per step finishes `per_step` requests, each replaced by a new one:

* `none`: no rendering anywhere (the floor);
* `inline`: the engine thread renders each new request (`add` before this change);
* `ahead`: the claimer renders them in claims of `claim` rows (`Engine.prepare`), the engine thread takes them;
  `prepare` offers the GIL back after each render (`time.sleep(0)`);
* `ahead-burst`: the same without that yield (as first written: a claim's renders in one hold of the GIL).

Each side uses the real adapter's render (`VllmEngine._render_ahead`: parse, chat template, encode,
`SamplingParams`) on the demo model. Printed per side: the engine thread's time per step beyond the GPU wait
(mean, p50, p99, max) and the extra over `none`.

Usage: .venv/bin/python bench/render_ahead.py [--steps 2000] [--gpu-ms 10] [--host-ms 1] [--claim 192]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, plot_dir, prepare_env

SIDES = ("none", "inline", "ahead", "ahead-burst")


def request(i: int, words: int) -> Any:
    from worker.engine import EngineRequest

    text = f"Classify review {i}: " + " ".join(f"word{(i * 7 + k) % 97}" for k in range(words))
    body = {"model": "backfill-demo", "messages": [{"role": "user", "content": text}], "max_tokens": 64}
    return EngineRequest(f"r{i}", "/v1/chat/completions", body)


def busy(seconds: float) -> None:
    """Python work holding the GIL, as an engine thread's scheduler and output processing do."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def run_side(engine: Any, side: str, args: argparse.Namespace, first: int) -> dict[str, Any]:
    from types import SimpleNamespace

    from worker.engine import vllm_ahead

    if side != "ahead-burst":
        return steps(engine, side, args, first)
    vllm_ahead.time = SimpleNamespace(time=time.time, sleep=lambda _: None)  # type: ignore[assignment]
    try:  # `prepare` without its time.sleep(0)
        return steps(engine, side, args, first)
    finally:
        vllm_ahead.time = time  # type: ignore[assignment]


def steps(engine: Any, side: str, args: argparse.Namespace, first: int) -> dict[str, Any]:
    """One side: `args.steps` GPU-shaped steps of the engine thread, the claimer rendering ahead if `side` says."""
    gpu, host = args.gpu_ms / 1000, args.host_ms / 1000
    stop, wanted = threading.Event(), threading.Semaphore(0)
    taken, missed, claimed = [0], [0], [first]

    def claimer() -> None:  # one claim of `claim` rows each time the engine thread asks, as the runner's
        while True:
            wanted.acquire()
            if stop.is_set():
                return
            engine.prepare([request(i, args.words) for i in range(claimed[0], claimed[0] + args.claim)])
            claimed[0] += args.claim

    thread = threading.Thread(target=claimer, name="queue-claimer", daemon=True)
    if side.startswith("ahead"):  # the runner keeps a claim's worth in flight ahead of what the engine runs: two claims
        thread.start()
        wanted.release(2)
        time.sleep(3.0)  # rendered before the clock starts
    beyond: list[float] = []
    next_id = first
    for step in range(args.steps):
        started = time.perf_counter()
        time.sleep(gpu)  # the GPU step: the GIL is released, the claimer may hold it when the wait ends
        busy(host)
        for _ in range(args.per_step):
            if side == "inline":
                engine._render_ahead(request(next_id, args.words), engine._direct)
            elif side.startswith("ahead"):
                ahead = engine._ahead.take(f"r{next_id}")
                taken[0] += ahead is not None
                missed[0] += ahead is None
            next_id += 1
        if side.startswith("ahead") and (step + 1) * args.per_step % args.claim == 0:
            wanted.release()  # the runner refills below its mark: the next claim's rows are rendered meanwhile
        beyond.append(time.perf_counter() - started - gpu)
    stop.set()
    wanted.release()
    ms = sorted(1000 * b for b in beyond)
    return {
        "side": side,
        "ms_beyond_gpu_mean": round(statistics.fmean(ms), 4),
        "ms_beyond_gpu_p50": round(ms[len(ms) // 2], 4),
        "ms_beyond_gpu_p99": round(ms[int(len(ms) * 0.99)], 4),
        "ms_beyond_gpu_max": round(ms[-1], 4),
        **({"rendered_ahead": taken[0], "not_ready": missed[0]} if side.startswith("ahead") else {}),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per side: the median over rounds of the mean and p99 time beyond the GPU wait, and the mean's extra over
    the side with no rendering."""

    def median(side: str, key: str) -> float:
        return statistics.median(r[key] for r in rows if r["side"] == side)

    floor = median("none", "ms_beyond_gpu_mean")
    return {
        side: {
            "ms_beyond_gpu_mean_median": median(side, "ms_beyond_gpu_mean"),
            "ms_extra_over_none": round(median(side, "ms_beyond_gpu_mean") - floor, 4),
            "ms_p99_median": median(side, "ms_beyond_gpu_p99"),
        }
        for side in SIDES
    }


def plot(result: dict[str, Any]) -> Path:
    """docs/render-ahead.png: the engine thread's time a step beyond its GPU wait, mean and p99, by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"none": "no rendering", "inline": "in add (engine thread)", "ahead": "ahead (claimer, yields)"}
    labels["ahead-burst"] = "ahead, no yield"
    summary = result["summary"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for offset, (key, name) in enumerate((("ms_beyond_gpu_mean_median", "mean"), ("ms_p99_median", "p99"))):
        xs = [i + 0.38 * offset for i in range(len(SIDES))]
        ax.bar(xs, [summary[side][key] for side in SIDES], width=0.36, label=name)
    ax.set_xticks([i + 0.19 for i in range(len(SIDES))], [labels[side] for side in SIDES], fontsize=8)
    a = result["args"]
    ax.set_ylabel("ms a step beyond the GPU wait")
    ax.set_title(f"Engine thread, {a['gpu_ms']:g} ms GPU steps, {a['words']}-word chats, claims of {a['claim']}")
    ax.legend()
    fig.tight_layout()
    path = plot_dir() / "render-ahead.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--gpu-ms", type=float, default=10.0, help="the GPU's part of a step (GIL released)")
    parser.add_argument("--host-ms", type=float, default=1.0, help="the engine thread's own Python per step")
    parser.add_argument("--per-step", type=int, default=1, help="requests finished and replaced per step")
    parser.add_argument("--claim", type=int, default=192, help="rows per claim (max_num_seqs / 2 at 384)")
    parser.add_argument("--words", type=int, default=400, help="words per prompt")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model_dir = prepare_env()
    from storage.registry import ModelSpec
    from worker.engine.vllm_engine import VllmEngine

    engine = VllmEngine("backfill-demo", ModelSpec(path=str(model_dir), max_num_seqs=64, max_model_len=2048))
    assert engine._ahead is not None and engine._direct is not None
    rows, first = [], 0
    for index in range(args.rounds):
        for side in SIDES if index % 2 == 0 else SIDES[::-1]:
            rows.append({"round": index, **run_side(engine, side, args, first)})
            first += 10 * args.steps * args.per_step
    summary = summarize(rows)
    result = {"args": vars(args), "summary": summary, "rounds": rows}
    print(json.dumps(result, indent=2))
    OUT.mkdir(exist_ok=True)
    (OUT / "render-ahead.json").write_text(json.dumps(result, indent=2))
    plot(result)
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
