"""LoRA adapters in any engine (docs/adapters.md): the adapter a queue row named put on its parsed line, and what
an engine did with adapters (loads, swaps), counted the same way by every engine.

A swap is an adapter coming back into flight after all its lines had left it: its slot among vLLM's `max_loras`
was given up and is taken again. Claims grouped by adapter (storage/queue/claim_order.py) keep this near zero.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from worker.engine import EngineRequest
from worker.engine.generation import Adapter
from worker.engine.wire import Parsed
from worker.engine.wire.base import BodyError


def under_adapter(parsed: Parsed, request: EngineRequest) -> Parsed:
    """The parsed line with the adapter its queue row named (none: as parsed)."""
    if request.adapter is None:
        return parsed
    adapter = Adapter(request.adapter, request.adapter_path)
    return dataclasses.replace(parsed, generation=dataclasses.replace(parsed.generation, adapter=adapter))


class AdapterTally:
    """Counts of one engine's adapters: in flight now, seen, loaded, swapped back in."""

    def __init__(self) -> None:
        self._inflight: dict[str, int] = {}
        self._seen: set[str] = set()
        self.loaded: set[str] = set()  # names loaded, for engines that keep no other record of them
        self.loads = self.swaps = 0

    def started(self, adapter: Adapter | None) -> None:
        """A generation under `adapter` went into flight."""
        if adapter is None:
            return
        count = self._inflight.get(adapter.name, 0)
        if count == 0 and adapter.name in self._seen:
            self.swaps += 1
        self._seen.add(adapter.name)
        self._inflight[adapter.name] = count + 1

    def ended(self, adapter: Adapter | None) -> None:
        """A generation under `adapter` left flight (finished, aborted or lost)."""
        if adapter is None or adapter.name not in self._inflight:
            return
        self._inflight[adapter.name] -= 1
        if self._inflight[adapter.name] <= 0:
            del self._inflight[adapter.name]

    def stats(self) -> dict[str, int]:
        """What the engine's stats report of its adapters."""
        return {
            "adapter_loads": self.loads,
            "adapter_swaps": self.swaps,
            "adapters_in_flight": len(self._inflight),
            "adapters_seen": len(self._seen),
        }


def load_without_model(parsed: Parsed, request: EngineRequest, tally: AdapterTally) -> Parsed:
    """The line under its adapter in an engine without a model (the fake), "loaded" as the vLLM adapter loads one
    (worker/engine/vllm_lora.py): a folder without adapter_config.json fails to load, a deleted adapter is not found."""
    if request.adapter is None:
        return parsed
    if request.adapter_path is None:
        message = f"The adapter '{request.adapter}' is no longer registered."
        raise BodyError(message, code="adapter_not_found", status_code=404)
    if not (Path(request.adapter_path) / "adapter_config.json").is_file():
        message = f"The adapter '{request.adapter}' could not be loaded: no adapter_config.json"
        raise BodyError(message, code="adapter_load_failed", status_code=500)
    if request.adapter not in tally.loaded:
        tally.loaded.add(request.adapter)
        tally.loads += 1
    return under_adapter(parsed, request)


def write_zero_adapter(folder: Path, *, fan_in: int, fan_out: int) -> None:
    """A rank-1 PEFT adapter on layer 0's q_proj whose B is zero: it adds exactly 0 to every output."""
    import numpy as np
    from safetensors.numpy import save_file

    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    tensors = {
        f"{prefix}.lora_A.weight": np.zeros((1, fan_in), dtype=np.float32),
        f"{prefix}.lora_B.weight": np.zeros((fan_out, 1), dtype=np.float32),
    }
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": 1, "lora_alpha": 1, "target_modules": ["q_proj"], "bias": "none"}
    (folder / "adapter_config.json").write_text(json.dumps(config))
