"""Draw storage/'s layers (docs/storage-layers.png) from the code: the order declared in STORAGE_LAYERS and the
import arrows the layering test reads (tests/unit/test_storage_layers.py), so the figure cannot drift from the guard.

    .venv/bin/python docs/draw_layers.py        # writes docs/storage-layers.png, prints the arrow counts

Each band is a layer (lowest at the bottom) with its modules; each arrow joins a layer to one it imports, labelled
with how many module-to-module imports it stands for. An upward arrow (there should be none) is drawn in red.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from test_storage_layers import STORAGE_LAYERS, import_cycles, import_graph, layer_of, storage_modules  # noqa: E402


def layer_arrows() -> tuple[dict[int, list[str]], Counter[tuple[int, int]]]:
    """The modules of each layer, and {(from layer, to layer): module imports} between different layers."""
    modules = storage_modules()
    members: dict[int, list[str]] = {index: [] for index in range(len(STORAGE_LAYERS))}
    for module in sorted(modules):
        members[layer_of(module)].append(module)
    arrows: Counter[tuple[int, int]] = Counter()
    for module, targets in import_graph(modules).items():
        for target in targets:
            if layer_of(target) != layer_of(module):
                arrows[(layer_of(module), layer_of(target))] += 1
    return members, arrows


def draw(path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    members, arrows = layer_arrows()
    count = len(STORAGE_LAYERS)
    fig, ax = plt.subplots(figsize=(16, 1.1 * count + 1))
    for index, (name, _) in enumerate(STORAGE_LAYERS):
        ax.add_patch(plt.Rectangle((0.0, index + 0.08), 10.0, 0.84, color="#e8eef7", ec="#7a8fb0"))
        ax.text(0.1, index + 0.5, name, va="center", fontsize=11, fontweight="bold")
        names = " ".join(module for module in members[index])
        ax.text(1.3, index + 0.5, _wrap(names, 120), va="center", fontsize=7, family="monospace")
    for slot, ((source, target), number) in enumerate(sorted(arrows.items())):
        x = 10.3 + 0.12 * slot
        upward = target > source
        ax.annotate(
            "",
            xy=(x, target + 0.5),
            xytext=(x, source + 0.5),
            arrowprops={"arrowstyle": "->", "color": "red" if upward else "#555555", "lw": 0.8},
        )
        ax.text(x + 0.03, (source + target) / 2 + 0.5, str(number), fontsize=6, rotation=90, va="center")
    ax.set_xlim(0, 10.6 + 0.12 * len(arrows))
    ax.set_ylim(0, count)
    ax.axis("off")
    ax.set_title("storage/: layers, lowest first (tests/unit/test_storage_layers.py STORAGE_LAYERS); arrows: imports")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _wrap(text: str, width: int) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join([*lines, line])


def main() -> None:
    members, arrows = layer_arrows()
    upward = sum(number for (source, target), number in arrows.items() if target > source)
    loops = import_cycles(import_graph(storage_modules()))
    print(f"modules: {sum(map(len, members.values()))}, layers: {len(STORAGE_LAYERS)}")
    print(f"imports between layers: {sum(arrows.values())}, upward: {upward}, loops: {len(loops)}")
    draw(ROOT / "docs" / "storage-layers.png")
    print("wrote docs/storage-layers.png")


if __name__ == "__main__":
    main()
