"""The engine benchmark's plots (bench/engine.py): the straggler mix, the batch-size sweep, the overhead rounds.

`rounds_series` turns the overhead part's rounds into the series of docs/engine-overhead-rounds.png (issue 22 §7):
both sides' tokens/s per round (how far the machine's own speed drifts), the ratio per round against its goal with
the median's interval, and the per-step time outside vLLM's step on each side (the figure that holds still).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.measures import ENGINE_OVERHEAD_RATIO_GOAL as RATIO_GOAL


def rounds_series(result: dict[str, Any]) -> dict[str, Any]:
    """Per round (1-based): each side's tokens/s, the ratio, who ran first, ms a step outside vLLM's step."""
    speeds = result["rounds_tokens_per_s"]
    outside = result["rounds_outside_step_ms"]
    return {
        "round": list(range(1, len(speeds) + 1)),
        "backfill_tokens_per_s": [b for b, _ in speeds],
        "bare_tokens_per_s": [v for _, v in speeds],
        "ratio": result["throughput_ratio_rounds"],
        "first": result["rounds_first_side"],
        "backfill_outside_ms": [b for b, _ in outside],
        "bare_outside_ms": [v for _, v in outside],
        "extra_outside_ms": [round(b - v, 3) for b, v in outside],
        "ratio_median": result["throughput_ratio_median"],
        "ratio_interval": (result["throughput_ratio_median_low"], result["throughput_ratio_median_high"]),
        "extra_median": result["outside_step_ms_extra_median"],
    }


def plot_rounds(result: dict[str, Any], path: Path) -> None:
    """Three panels over the overhead rounds: tokens/s, the ratio with its goal, ms a step outside vLLM's step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = rounds_series(result)
    x = s["round"]
    fig, (speed, ratio, outside) = plt.subplots(3, 1, figsize=(9.5, 7.2), sharex=True)
    speed.plot(x, s["bare_tokens_per_s"], marker="s", color="C0", label="bare LLM.generate")
    speed.plot(x, s["backfill_tokens_per_s"], marker="o", color="C1", label="Backfill\n(API to output file)")
    speed.set_ylabel("output tokens/s")
    speed.set_title(
        f"Engine overhead, {result['requests']:,} requests x {result['output_tokens_each']} tokens a round, sides"
        " alternating (issue 22 §7)",
        fontsize=10,
    )
    speed.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for first, marker, color in (("backfill", "o", "C4"), ("vllm", "s", "C5")):
        picked = [(r, v) for r, v, f in zip(x, s["ratio"], s["first"], strict=True) if f == first]
        label = "Backfill ran first" if first == "backfill" else "bare ran first"
        ratio.scatter([r for r, _ in picked], [v for _, v in picked], marker=marker, color=color, zorder=3, label=label)
    low, high = s["ratio_interval"]
    ratio.axhspan(low, high, color="C2", alpha=0.15, label=f"median {s['ratio_median']}\n(5-95%: {low}-{high})")
    ratio.axhline(s["ratio_median"], color="C2", linewidth=1)
    ratio.axhline(RATIO_GOAL, color="grey", linestyle="--", linewidth=1, label=f"goal {RATIO_GOAL}")
    ratio.set_ylabel("Backfill / bare")
    ratio.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    outside.plot(x, s["backfill_outside_ms"], marker="o", color="C1", label="Backfill")
    outside.plot(x, s["bare_outside_ms"], marker="s", color="C0", label="bare")
    outside.plot(
        x, s["extra_outside_ms"], marker=".", linestyle=":", color="C2", label=f"extra\n(median {s['extra_median']} ms)"
    )
    outside.set_ylim(bottom=0)
    outside.set_ylabel("ms a step outside\nvLLM's step")
    outside.set_xlabel("round")
    outside.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for ax in (speed, ratio, outside):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_occupancy(samples: list[tuple[float, int, int]], max_num_seqs: int, path: Path) -> None:
    """Running and waiting sequences over time for the straggler mix: docs/straggler-occupancy.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not samples:
        return
    start = samples[0][0]
    times = [t - start for t, _, _ in samples]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.step(times, [r for _, r, _ in samples], where="post", label="running sequences")
    ax.step(
        times, [w for _, _, w in samples], where="post", label="waiting (in the engine, +1 while the queue has more)"
    )
    ax.axhline(max_num_seqs, color="grey", linestyle="--", linewidth=1, label=f"max_num_seqs = {max_num_seqs}")
    ax.set_xlabel("seconds")
    ax.set_ylabel("sequences")
    ax.set_title("Straggler mix (7x100 + 1x1,000 tokens per 8): the running batch stays full")
    ax.legend(loc="lower left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_sweep(
    sweep: list[dict[str, float]],
    backfill_tokens_per_s: float,
    bare_tokens_per_s: float,
    max_num_seqs: int,
    path: Path,
) -> None:
    """Output tokens/s against the number of sequences decoding together: docs/throughput-vs-batch.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(
        [p["batch"] for p in sweep], [p["tokens_per_s"] for p in sweep], marker="o", label="bare vLLM (LLM.generate)"
    )
    ax.scatter(
        [max_num_seqs], [bare_tokens_per_s], color="C0", marker="s", zorder=3, label="bare vLLM, 1,000-request job"
    )
    ax.scatter([max_num_seqs], [backfill_tokens_per_s], color="C3", zorder=3, label="Backfill, the same job")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("requests decoding together (batch size; the sweep sends exactly that many)")
    ax.set_ylabel("output tokens/s")
    ax.set_title("Demo model on 2 CPU cores: throughput grows with the batch")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
