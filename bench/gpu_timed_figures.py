"""The GPU-timed runner benchmark's figures and plots (bench/gpu_timed.py): busy share over time, TTFT/TPOT.

`busy_over_time` bins the timed engine's steps into the busy-share series of docs/gpu-timed-busy.png;
`clocks` turns its per-request timings into p50/p99 and the CDFs of docs/gpu-timed-clocks.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BUSY_GOAL = 0.98


def busy_over_time(steps: list[Any], bin_seconds: float = 0.5) -> list[tuple[float, float, float]]:
    """(seconds since the first step, busy share, mean batch) per bin: the plot's series."""
    if not steps:
        return []
    origin = steps[0].started
    bins: dict[int, list[float]] = {}
    for s in steps:
        slot = bins.setdefault(int((s.started - origin) / bin_seconds), [0.0, 0.0, 0.0])
        slot[0] += s.ended - s.started
        slot[1] += s.batch
        slot[2] += 1
    last = max(bins)  # a partial bin: the run ended inside it
    return [
        (round(k * bin_seconds, 2), round(min(1.0, v[0] / bin_seconds), 4), round(v[1] / v[2], 1))
        for k, v in sorted(bins.items())
        if k != last
    ]


def clocks(engine: Any) -> dict[str, Any]:
    """TTFT (from the engine's `add`, slot queueing included) and TPOT per request, p50 and p99, in ms."""
    timings = list(engine.requests)
    ttft = sorted(t.ttft for t in timings)
    tpot = sorted(x for t in timings if (x := t.tpot) is not None)
    return {
        "ttft_ms_p50": _quantile_ms(ttft, 0.5),
        "ttft_ms_p99": _quantile_ms(ttft, 0.99),
        "tpot_ms_p50": _quantile_ms(tpot, 0.5),
        "tpot_ms_p99": _quantile_ms(tpot, 0.99),
        "cdf": {"ttft_ms": _cdf(ttft), "tpot_ms": _cdf(tpot)},
    }


def _quantile_ms(values: list[float], q: float) -> float | None:
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1e3, 2) if values else None


def _cdf(values: list[float], points: int = 200) -> list[float]:
    """`points` evenly spaced quantiles (ms) of sorted `values`: the plot's series."""
    if not values:
        return []
    return [round(values[min(len(values) - 1, int(i * len(values) / points))] * 1e3, 3) for i in range(points + 1)]


def plot(series: dict[str, list[tuple[float, float, float]]], path: Path) -> None:
    """Engine busy share over time (long outputs): docs/gpu-timed-busy.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True, height_ratios=(2, 1))
    for label, samples in series.items():
        top.plot([t for t, _, _ in samples], [b for _, b, _ in samples], label=label, linewidth=1)
        bottom.plot([t for t, _, _ in samples], [m for _, _, m in samples], label=label, linewidth=1)
    top.axhline(BUSY_GOAL, color="grey", linestyle="--", linewidth=1, label=f"goal {BUSY_GOAL}")
    top.set_ylabel("engine busy share (0.5 s bins)")
    top.set_ylim(0.4, 1.02)
    top.set_title("GPU-timed fake (70B FP8 on 8x H100 roofline) fed by the runner from Postgres")
    top.legend(fontsize=8, loc="lower left")
    bottom.set_ylabel("mean batch")
    bottom.set_xlabel("seconds since the first step (the tail drains the last long requests)")
    bottom.axhline(384, color="grey", linestyle=":", linewidth=1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_clocks(final: dict[str, Any], path: Path) -> None:
    """TTFT and TPOT CDFs of both workloads as the timed engine measured them: docs/gpu-timed-clocks.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, clock in zip(axes, ("ttft_ms", "tpot_ms"), strict=True):
        for part, label in (("long", "long outputs, ~7-token prompts"), ("short", "1-10 tokens, 500-token prompts")):
            values = final[part]["cdf"][clock]
            if values:
                ax.plot(values, [i / (len(values) - 1) for i in range(len(values))], label=label, linewidth=1.2)
        ax.set_xscale("log")
        ax.set_xlabel(f"{clock.split('_')[0].upper()} (ms, log scale)")
        ax.set_ylabel("share of requests")
        ax.grid(True, which="both", linewidth=0.3)
    axes[0].set_title("time to first token (slot queueing included)", fontsize=9)
    axes[1].set_title("time per output token after the first", fontsize=9)
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle("GPU-timed engine (70B FP8 on 8x H100, chunked prefill, 16,384 tokens/step) fed by the runner")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
