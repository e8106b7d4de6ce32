"""One results.json row: name, value, unit, goal and whether the figures met it (computed, never typed in)."""

from __future__ import annotations

from typing import Any


def entry(name: str, value: Any, unit: str, goal: str | None = None, met: bool | None = None) -> dict[str, Any]:
    return {"name": name, "value": value, "unit": unit, "goal": goal, "met": met}
