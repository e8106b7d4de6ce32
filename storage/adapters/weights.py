"""An adapter's weights, checked before anything may name it: a PEFT LoRA folder the base model's engine can load.

Read without torch or the tensors themselves: `adapter_config.json` (LoRA, its rank and target modules) and the
safetensors file's header (every tensor a `lora_A`/`lora_B` of a layer the base model has, shaped for the base's
projection and the rank, its bytes inside the file). A wrong file is refused here with a message that says what
is wrong, so the engine never meets it: an adapter that fails to load in vLLM mid-step wedges the engine
(docs/adapters.md).
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage.errors import InvalidRequest

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
CONFIG_MAX_BYTES = 1024 * 1024
HEADER_MAX_BYTES = 64 * 1024 * 1024  # safetensors' own bound on its JSON header
_TENSOR = re.compile(r"^base_model\.model\.(?:.*\.)?layers\.(\d+)\.(?:[\w.]+\.)?(\w+)\.lora_([AB])(?:\.weight)?$")
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


class InvalidAdapter(InvalidRequest):
    code = "invalid_adapter"


@dataclass(frozen=True)
class AdapterFacts:
    """What registration keeps of a checked adapter."""

    rank: int
    target_modules: list[str]
    size_bytes: int


def check_adapter(folder: Path, *, base_path: str, max_rank: int, max_bytes: int) -> AdapterFacts:
    """The facts of the PEFT LoRA adapter in `folder`, or InvalidAdapter saying why the base model at `base_path`
    (its config.json) cannot run it: files missing or too large, not LoRA, rank above `max_rank`, a corrupt
    safetensors file, or tensors shaped for another architecture."""
    config_file, weights_file = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not config_file.is_file() or not weights_file.is_file():
        raise InvalidAdapter(f"An adapter needs {CONFIG_FILE} and {WEIGHTS_FILE} (PEFT's LoRA format).")
    size = config_file.stat().st_size + weights_file.stat().st_size
    if size > max_bytes or config_file.stat().st_size > CONFIG_MAX_BYTES:
        raise InvalidAdapter(f"The adapter is {size} bytes; at most {max_bytes} (BACKFILL_ADAPTER_MAX_BYTES).")
    config = _read_config(config_file)
    rank = config["r"]
    if rank > max_rank:
        raise InvalidAdapter(f"The adapter's rank {rank} is above the base model's max_lora_rank {max_rank}.")
    header = _read_header(weights_file)
    _check_tensors(header, rank=rank, expected=expected_shapes(base_path))
    targets = config["target_modules"]
    return AdapterFacts(
        rank=rank, target_modules=[targets] if isinstance(targets, str) else list(targets), size_bytes=size
    )


def lora_config(folder: Path) -> tuple[int, list[str] | str] | None:
    """(rank, target_modules) of the PEFT LoRA adapter in `folder`; None if its config is missing or invalid."""
    path = folder / CONFIG_FILE
    try:
        if path.stat().st_size > CONFIG_MAX_BYTES:
            return None
        config = _read_config(path)
    except (OSError, InvalidAdapter):
        return None
    targets = config["target_modules"]
    return config["r"], targets if isinstance(targets, str) else list(targets)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_bytes())
    except ValueError:
        raise InvalidAdapter(f"{CONFIG_FILE} is not valid JSON.") from None
    if not isinstance(config, dict) or str(config.get("peft_type", "")).upper() != "LORA":
        raise InvalidAdapter(f"{CONFIG_FILE} must describe a LoRA adapter (peft_type 'LORA').")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise InvalidAdapter(f"{CONFIG_FILE} must give the rank 'r' as a positive integer.")
    targets = config.get("target_modules")
    if not (isinstance(targets, str) or (isinstance(targets, list) and all(isinstance(t, str) for t in targets))):
        raise InvalidAdapter(f"{CONFIG_FILE} must list its 'target_modules'.")
    if config.get("use_dora"):
        raise InvalidAdapter("DoRA adapters are not supported (vLLM loads LoRA only).")
    if config.get("modules_to_save"):
        raise InvalidAdapter("Adapters with 'modules_to_save' (whole trained layers) are not supported.")
    return config


def _read_header(path: Path) -> dict[str, Any]:
    """The safetensors header, checked against the file's size (the tensors are never read)."""
    size = path.stat().st_size
    with path.open("rb") as file:
        head = file.read(8)
        if len(head) < 8:
            raise InvalidAdapter(f"{WEIGHTS_FILE} is not a safetensors file (too short).")
        (length,) = struct.unpack("<Q", head)
        if length > min(HEADER_MAX_BYTES, size - 8):
            raise InvalidAdapter(f"{WEIGHTS_FILE} is corrupt: its header is longer than the file.")
        try:
            header = json.loads(file.read(length))
        except ValueError:
            raise InvalidAdapter(f"{WEIGHTS_FILE} is corrupt: its header is not JSON.") from None
    if not isinstance(header, dict):
        raise InvalidAdapter(f"{WEIGHTS_FILE} is corrupt: its header is not a JSON object.")
    header.pop("__metadata__", None)
    data_bytes = size - 8 - length
    for name, tensor in header.items():
        try:
            start, end = (int(v) for v in tensor["data_offsets"])
            count = _DTYPE_BYTES[tensor["dtype"]]
            for dim in tensor["shape"]:
                count *= int(dim)
        except (KeyError, TypeError, ValueError):
            raise InvalidAdapter(f"{WEIGHTS_FILE} is corrupt: tensor {name[:200]!r} is malformed.") from None
        if not 0 <= start <= end <= data_bytes or end - start != count:
            raise InvalidAdapter(f"{WEIGHTS_FILE} is corrupt: tensor {name[:200]!r} lies outside its data.")
    if not header:
        raise InvalidAdapter(f"{WEIGHTS_FILE} holds no tensors.")
    return header


def expected_shapes(base_path: str) -> tuple[int, dict[str, tuple[int, int]]] | None:
    """The base model's layer count and (in, out) features of each projection LoRA targets, from its config.json
    (Llama-style names: Llama, Mistral, Qwen2, ...); None when its config does not say."""
    try:
        config = json.loads((Path(base_path) / "config.json").read_text())
        config = config.get("text_config", config)
        hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        mlp = int(config["intermediate_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    shapes = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, mlp),
        "up_proj": (hidden, mlp),
        "down_proj": (mlp, hidden),
    }
    return layers, shapes


def _check_tensors(
    header: dict[str, Any], *, rank: int, expected: tuple[int, dict[str, tuple[int, int]]] | None
) -> None:
    for name, tensor in header.items():
        match = _TENSOR.match(name)
        if match is None:
            raise InvalidAdapter(f"{WEIGHTS_FILE}: tensor {name[:200]!r} is not a LoRA weight of a layer.")
        layer, module, side = int(match[1]), match[2], match[3]
        shape = [int(dim) for dim in tensor["shape"]]
        if len(shape) != 2 or (shape[0] if side == "A" else shape[1]) != rank:
            raise InvalidAdapter(f"{WEIGHTS_FILE}: tensor {name[:200]!r} has shape {shape}, not of rank {rank}.")
        if expected is None:
            continue
        layers, shapes = expected
        if layer >= layers or module not in shapes:
            raise InvalidAdapter(
                f"The adapter targets {module} of layer {layer}, which the base model does not have "
                "(an adapter of another architecture?)."
            )
        fan_in, fan_out = shapes[module]
        if (shape[1] if side == "A" else shape[0]) != (fan_in if side == "A" else fan_out):
            raise InvalidAdapter(
                f"The adapter's {module} of layer {layer} has shape {shape}, which does not fit the base model "
                "(an adapter of another size or architecture?)."
            )
