"""The prefix-heavy race's plot (bench/prefix_race.py, issue 22 §5): docs/prefix-race.png.

`race_bars` turns one run's result into, per KV size, each side's seconds (run-batch's start-ups excluded),
prefix-cache hit rate and speed against run-batch; the plot sets them beside the goal's wall (run-batch's
seconds / 2.0) and the ceiling (bare `LLM.generate` on every line at once, prefix-sorted), so a reader sees
where the goal lies against what any schedule on these engine settings can reach.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.measures.race import SPEEDUP_GOAL

SIDES = (  # (key in a race's result, label); the ideal's figures are under its "sorted" variant
    ("run_batch", "run-batch, once per job"),
    ("backfill_ordering_off", "Backfill, prefix ordering off"),
    ("backfill", "Backfill"),
    ("ideal", "ceiling: every line at once, prefix-sorted"),
)


def race_bars(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per KV size raced ("small", "large"): the sides it ran, each with seconds, hit rate and x run-batch."""
    out: dict[str, list[dict[str, Any]]] = {}
    for size in ("small", "large"):
        if (race := result.get(size)) is None:
            continue
        base = race["run_batch"]["seconds"]
        bars = []
        for key, label in SIDES:
            if (side := race.get(key)) is None:
                continue
            figures = side["sorted"] if key == "ideal" else side
            seconds = figures["seconds"]
            bars.append(
                {
                    "side": key,
                    "label": label,
                    "seconds": seconds,
                    "hit_rate": figures["hit_rate"],
                    "x_run_batch": round(base / seconds, 2),
                }
            )
        out[size] = bars
    return out


def plot_race(result: dict[str, Any], path: Path) -> None:
    """One panel per KV size: each side's seconds as a bar, annotated; the goal's wall as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = race_bars(result)
    fig, axes = plt.subplots(len(sizes), 1, figsize=(10, 2.3 * len(sizes) + 0.6), squeeze=False)
    colors = {"run_batch": "C0", "backfill_ordering_off": "C7", "backfill": "C1", "ideal": "C2"}
    for ax, (size, bars) in zip(axes[:, 0], sizes.items(), strict=True):
        race = result[size]
        y = list(range(len(bars)))[::-1]
        ax.barh(y, [b["seconds"] for b in bars], color=[colors[b["side"]] for b in bars])
        ax.set_yticks(y, [b["label"] for b in bars], fontsize=8)
        for row, bar in zip(y, bars, strict=True):
            note = f" {bar['seconds']:.1f} s, {bar['x_run_batch']}x, hit rate {bar['hit_rate']:.2f}"
            ax.text(bar["seconds"], row, note, va="center", fontsize=7)
        goal = race["run_batch"]["seconds"] / SPEEDUP_GOAL
        ax.axvline(goal, color="grey", linestyle="--", linewidth=1, label=f"goal: {SPEEDUP_GOAL}x run-batch")
        what = "smaller than the prompts need" if size == "small" else "holds every prompt"
        ax.set_title(f"KV cache of {race['kv_cache_tokens']:,} tokens ({what})", fontsize=9)
        ax.set_xlim(0, max(b["seconds"] for b in bars) * 1.45)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("seconds (run-batch's engine start-ups excluded; Backfill from first upload to last output)")
    fig.suptitle(
        f"Prefix-heavy race: {result['tenants']} tenants x {result['lines_per_job']} lines, {result['prompts']} system"
        f" prompts of 800-1,000 tokens, max_num_seqs {result['max_num_seqs']}, the same engine settings",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
