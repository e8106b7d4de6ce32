"""The list envelope's cursor fields, written once for every list route (every protocol's)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


def cursor_fields(page: Sequence[_HasId], *, has_more: bool) -> dict[str, Any]:
    """`first_id`, `last_id` and `has_more` for a page of objects."""
    return {"first_id": page[0].id if page else None, "last_id": page[-1].id if page else None, "has_more": has_more}
