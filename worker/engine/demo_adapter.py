"""Tiny random LoRA adapters of the demo model, built offline in milliseconds, for the demo and the tests.

Each is a PEFT adapter folder (`adapter_config.json` + `adapter_model.safetensors`) of rank `rank` on the
attention and MLP projections of worker/engine/demo_model.py's Llama. Both of its matrices are random (a trained
adapter's B starts at zero, which would leave the base model's output unchanged), so each seed steers greedy
decoding its own way: what a test needs to tell adapters apart. numpy writes the tensors (no torch import).
"""

from __future__ import annotations

import json
from pathlib import Path

from storage.registry import DEMO_ADAPTERS
from worker.engine.demo_model import build_offline

MARKER_FILE = "backfill-demo-adapter.json"
# (in features, out features) of each projection of the demo model (hidden 256, 4 heads and 2 KV heads of 64,
# MLP 768), as its LlamaConfig makes them.
DEMO_SHAPES = {
    "q_proj": (256, 256),
    "k_proj": (256, 128),
    "v_proj": (256, 128),
    "o_proj": (256, 256),
    "gate_proj": (256, 768),
    "up_proj": (256, 768),
    "down_proj": (768, 256),
}
DEMO_LAYERS = 4
SCALE = 0.5  # the entries' spread: large enough that greedy tokens change, small enough to stay finite


def build_demo_adapter(path: Path, *, seed: int, rank: int = 8, base_model: str = "backfill-demo") -> Path:
    """Build a demo adapter at `path` unless one is already there; return `path`."""

    def write(folder: Path) -> None:
        write_adapter(folder, seed=seed, rank=rank, base_model=base_model)
        (folder / MARKER_FILE).write_text(json.dumps({"seed": seed, "rank": rank}) + "\n")

    return build_offline(Path(path), marker=MARKER_FILE, write=write)


def build_demo_adapters(paths: dict[str, Path]) -> dict[str, Path]:
    """Build the demo adapters at `paths` (name -> folder), the i-th of DEMO_ADAPTERS with seed i + 1 (another name:
    a seed past them); return `paths`."""
    seeds = {name: index + 1 for index, name in enumerate(DEMO_ADAPTERS)}
    for index, (name, path) in enumerate(paths.items()):
        build_demo_adapter(Path(path), seed=seeds.get(name, len(DEMO_ADAPTERS) + 1 + index))
    return paths


def demo_adapter_paths(folder: Path, names: tuple[str, ...] = DEMO_ADAPTERS) -> dict[str, Path]:
    """name -> folder under `folder` of each demo adapter."""
    return {name: Path(folder) / name for name in names}


def write_adapter(
    folder: Path,
    *,
    seed: int,
    rank: int = 8,
    base_model: str = "backfill-demo",
    shapes: dict[str, tuple[int, int]] | None = None,
    layers: int = DEMO_LAYERS,
) -> None:
    """Write a PEFT LoRA adapter's two files into `folder` (any `shapes`: tests build wrong ones on purpose)."""
    import numpy as np
    from safetensors.numpy import save_file

    shapes = DEMO_SHAPES if shapes is None else shapes
    generator = np.random.default_rng(seed)
    tensors = {}
    for layer in range(layers):
        for module, (fan_in, fan_out) in shapes.items():
            group = "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{group}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (generator.standard_normal((rank, fan_in)) * SCALE).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (generator.standard_normal((fan_out, rank)) * SCALE).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "target_modules": sorted(shapes),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
