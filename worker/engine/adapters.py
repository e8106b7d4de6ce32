"""LoRA adapters in any engine (docs/adapters.md): the adapter a queue row named put on its parsed line, and what
an engine did with adapters (loads, swaps), counted the same way by every engine.

A swap is an adapter coming back into flight after all its lines had left it: its slot among vLLM's `max_loras`
was given up and is taken again. Claims grouped by adapter (storage/queue/claim_order.py) keep this near zero.
"""

from __future__ import annotations

import dataclasses

from worker.engine import EngineRequest
from worker.engine.generation import Adapter
from worker.engine.wire import Parsed


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
