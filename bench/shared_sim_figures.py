"""The plot of bench/shared_sim.py: online TTFT and TPOT CDFs with and without batch work, one column per rate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

STYLES = {
    "without": ("without batch work", "--"),
    "with": ("with Backfill, default budget", "-"),
    "paced": ("Backfill, prefill paced", ":"),
    "staged": ("Backfill, prefill paced and staged", "-."),
    "slack": ("Backfill, latency_slack", "x:"),
}


def plot_cdfs(raw: dict[str, list[dict[str, Any]]], rates: list[float], path: Path) -> None:
    """Rows: TTFT, TPOT (ms, log scale); columns: online rates; one line per side (the rounds pooled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    fig, axes = plt.subplots(2, len(rates), figsize=(4.2 * len(rates), 7), squeeze=False)
    for column, rate in enumerate(rates):
        for row, (key, title) in enumerate((("ttft", "time to first token"), ("tpot", "time per output token"))):
            axis = axes[row][column]
            for side, (label, style) in STYLES.items():
                rows = [r for r in raw.get(f"{side}@{rate}", []) if r.get("ok") and r.get(key) is not None]
                values = sorted(r[key] * 1000 for r in rows)
                if not values:
                    continue
                shares = [(i + 1) / len(values) for i in range(len(values))]
                axis.step(values, shares, style, where="post", label=f"{label} ({len(values)})")
            axis.set_xscale("log")
            axis.xaxis.set_major_formatter(ScalarFormatter())
            axis.xaxis.set_minor_formatter(NullFormatter())
            axis.set_xlabel("ms")
            axis.set_ylabel("share of online requests")
            axis.set_title(f"{title}, {rate:g} req/s", fontsize=10)
            axis.axhline(0.99, color="grey", linestyle=":", linewidth=0.8)
            axis.legend(fontsize=7, loc="lower right")
    fig.suptitle("Online users of a simulated 70B FP8 8xH100 vLLM server, with and without Backfill harvesting")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
