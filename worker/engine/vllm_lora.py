"""The vLLM adapter's LoRA adapters: each line's `LoRARequest`, loaded before the line is submitted (docs/adapters.md).

Three facts of vLLM 0.32 shape this module (measured on CPU, docs/adapters.md):
- an adapter that fails to load inside a step wedges the in-process engine, so each adapter is loaded with
  `add_lora` first, on this thread, and an adapter that fails fails only its own lines (`adapter_load_failed`);
- on CPU a sequence without a LoRARequest reads the last adapter slot (index -1) when it shares a step with
  adapters, so base-model lines run under a zero adapter (rank 1, B = 0: a delta of exactly 0);
- an adapter evicted from the worker's CPU cache would be reloaded mid-step: the cache is sized past what this
  module keeps, and this module reloads (with `add_lora`) whatever it evicted itself.
Counts what it did in an `AdapterTally` (worker/engine/adapters.py): adapters loaded, swaps.
"""

from __future__ import annotations

import logging
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

from storage.adapters.weights import expected_shapes
from storage.registry import ModelSpec
from worker.engine.adapters import AdapterTally, write_zero_adapter
from worker.engine.generation import Adapter
from worker.engine.wire.base import BodyError

logger = logging.getLogger(__name__)

ZERO_ID = 1  # the zero adapter's LoRA id; adapters get 2, 3, ...


def lora_engine_args(spec: ModelSpec) -> dict[str, Any]:
    """vLLM engine arguments for a model that takes adapters: one slot more than `max_loras` (the zero adapter's),
    a CPU cache wider than what `Loras` keeps loaded."""
    if not spec.takes_adapters:
        return {}
    slots = spec.max_loras + 1
    return {
        "enable_lora": True,
        "max_loras": slots,
        "max_lora_rank": spec.max_lora_rank,
        "max_cpu_loras": cpu_capacity(spec) + slots,
    }


def cpu_capacity(spec: ModelSpec) -> int:
    """Adapters `Loras` keeps loaded in the worker's CPU memory at once."""
    return spec.max_cpu_loras or max(16, 2 * (spec.max_loras + 1))


class Loras:
    """The LoRARequest of each generation, and the adapters loaded into one engine."""

    def __init__(self, engine: Any, spec: ModelSpec) -> None:
        self._engine = engine
        self._capacity = cpu_capacity(spec)
        self._ids: dict[tuple[str, str], int] = {}  # (name, folder) -> LoRA id: a re-registered name is a new one
        self._loaded: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self._failed: dict[tuple[str, str], str] = {}
        self.tally = AdapterTally()
        self._zero = self._zero_request(spec)

    def request_for(self, adapter: Adapter | None) -> Any:
        """The LoRARequest to submit a generation with (loading the adapter first); BodyError if it cannot run."""
        if adapter is None:
            return self._zero
        from vllm.lora.request import LoRARequest

        if adapter.path is None:
            raise BodyError(
                f"The adapter '{adapter.name}' is no longer registered.", code="adapter_not_found", status_code=404
            )
        key = (adapter.name, adapter.path)
        if key in self._failed:
            raise self._load_error(adapter.name, self._failed[key])
        lora_id = self._ids.setdefault(key, ZERO_ID + 1 + len(self._ids))
        request = LoRARequest(adapter.name, lora_id, adapter.path)
        if lora_id in self._loaded:
            self._loaded.move_to_end(lora_id)
            return request
        try:
            self._engine.add_lora(request)
        except Exception as error:  # any failure of this adapter's files: its lines fail, nothing else
            logger.warning("LoRA adapter %s (%s) failed to load: %s", adapter.name, adapter.path, error)
            self._failed[key] = f"{type(error).__name__}: {error}"[:500]
            raise self._load_error(adapter.name, self._failed[key]) from None
        self.tally.loads += 1
        self._loaded[lora_id] = None
        while len(self._loaded) > self._capacity:
            self._loaded.popitem(last=False)
        return request

    @staticmethod
    def _load_error(name: str, why: str) -> BodyError:
        return BodyError(
            f"The adapter '{name}' could not be loaded: {why}", code="adapter_load_failed", status_code=500
        )

    def _zero_request(self, spec: ModelSpec) -> Any:
        """The zero adapter base-model lines run under (see the module docstring), or None if the base model's
        config does not give its projections' shapes."""
        from vllm.lora.request import LoRARequest

        shapes = expected_shapes(spec.path)
        if shapes is None:
            logger.warning("no zero adapter for %s: base-model lines beside adapters may be wrong on CPU", spec.path)
            return None
        folder = Path(tempfile.mkdtemp(prefix="backfill-zero-lora-"))
        write_zero_adapter(folder, fan_in=shapes[1]["q_proj"][0], fan_out=shapes[1]["q_proj"][1])
        request = LoRARequest("backfill-zero-adapter", ZERO_ID, str(folder))
        self._engine.add_lora(request)
        self._engine.pin_lora(ZERO_ID)  # never evicted: every base-model line uses it
        return request
