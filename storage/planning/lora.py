"""LoRA's extra compute as the planner models it (docs/adapters.md "Cost"): a work factor for adapter lines.

A token through the base model costs about 2 x parameters FLOPs (one multiply-add per weight). An adapter of rank
r adds, on every projection it targets (d_in inputs, d_out outputs), x·Aᵀ (r x d_in) then ·Bᵀ (d_out x r):

    lora FLOPs per token = layers x sum over target modules of 2 x r x (d_in + d_out)

so an adapter line does (1 + lora FLOPs / base FLOPs) times the work of the same tokens on the base: rank 16 on
all seven projections of a Llama 7B is +0.6 %, on q and v only +0.12 %; rank 8 on the demo model +3.7 %. That is the
arithmetic only: the engine's per-step LoRA bookkeeping (slot gathers, the punica ops' launches) is not modelled,
and on CPU with a tiny model it dominates (docs/adapters.md measured 4.8x); the measured throughput of past runs
carries it instead. A base whose config.json is unknown (a fake model, a missing file) gets factor 1.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import Path

from storage.adapters.weights import expected_shapes
from storage.planning.node import ModelShape

ALL_LINEAR = "all-linear"  # PEFT's target_modules for every linear layer but the output head
_MLP = frozenset({"gate_proj", "up_proj", "down_proj"})


def target_shapes(targets: str | Iterable[str], shapes: Mapping[str, tuple[int, int]]) -> list[tuple[int, int]]:
    """(d_in, d_out) of each projection of a layer the adapter's `target_modules` names: a list of module names, or
    PEFT's string forms ('all-linear', or a regular expression full-matching module names; an invalid one: every
    module, the upper bound)."""
    if isinstance(targets, str):
        if targets == ALL_LINEAR:
            return list(shapes.values())
        try:
            pattern = re.compile(targets)
        except re.error:
            return list(shapes.values())
        return [shape for name, shape in shapes.items() if pattern.fullmatch(name) or pattern.fullmatch(_path(name))]
    wanted = {target.rsplit(".", 1)[-1] for target in targets}
    return [shape for name, shape in shapes.items() if name in wanted]


def _path(module: str) -> str:
    """A Llama module's full name, which PEFT matches a string `target_modules` against."""
    return f"model.layers.0.{'mlp' if module in _MLP else 'self_attn'}.{module}"


def lora_flops_per_token(*, rank: int, layers: int, projections: Iterable[tuple[int, int]]) -> int:
    """The extra FLOPs an adapter of rank `rank` adds to one token: 2 x r x (d_in + d_out) per target projection
    per layer."""
    return layers * sum(2 * rank * (d_in + d_out) for d_in, d_out in projections)


def lora_factor(*, base_parameters: float, rank: int, layers: int, projections: Iterable[tuple[int, int]]) -> float:
    """An adapter line's work over the same tokens' work on the base: 1 + lora FLOPs / (2 x base parameters)."""
    extra = lora_flops_per_token(rank=rank, layers=layers, projections=projections)
    return 1.0 + extra / (2.0 * base_parameters)


def adapter_factor(base_path: str, *, rank: int, targets: str | Iterable[str]) -> float:
    """`lora_factor` of an adapter on the base model at `base_path` (its config.json); 1.0 if that is unknown."""
    key = targets if isinstance(targets, str) else tuple(sorted(targets))
    return _factor(base_path, rank, key)


@lru_cache(maxsize=1024)
def _factor(base_path: str, rank: int, targets: str | tuple[str, ...]) -> float:
    found = expected_shapes(base_path)
    if found is None:
        return 1.0
    layers, shapes = found
    try:
        config = json.loads((Path(base_path) / "config.json").read_text())
        parameters = ModelShape.from_hf_config(config.get("text_config", config)).parameter_count
    except (OSError, ValueError, KeyError, TypeError):
        return 1.0
    return lora_factor(base_parameters=parameters, rank=rank, layers=layers, projections=target_shapes(targets, shapes))
