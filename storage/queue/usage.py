"""Token usage of batches, summed from their completed requests: OpenAI's `BatchUsage` on every batch object."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.models import BatchRequest


@dataclass(frozen=True)
class TokenUsage:
    """Billed tokens of a batch: input (of which `cached_tokens` came from the prefix cache) and output (of which
    `reasoning_tokens` were thinking)."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    def to_json(self) -> dict[str, Any]:
        """OpenAI's `BatchUsage`."""
        return {
            "input_tokens": self.input_tokens,
            "input_tokens_details": {"cached_tokens": self.cached_tokens},
            "output_tokens": self.output_tokens,
            "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
            "total_tokens": self.input_tokens + self.output_tokens,
        }


def batch_usages(session: Session, *, batch_ids: Iterable[str]) -> dict[str, TokenUsage]:
    """Each batch's usage so far (every id gets one, zero before anything completed): one grouped query."""
    wanted = sorted(set(batch_ids))
    if not wanted:
        return {}
    rows = session.execute(
        select(
            BatchRequest.batch_id,
            func.sum(BatchRequest.prompt_tokens),
            func.sum(BatchRequest.cached_tokens),
            func.sum(BatchRequest.completion_tokens),
            func.sum(BatchRequest.reasoning_tokens),
        )
        .where(BatchRequest.batch_id.in_(wanted), BatchRequest.status == lifecycle.REQ_COMPLETED)
        .group_by(BatchRequest.batch_id)
    ).all()
    found = {str(b): TokenUsage(int(i or 0), int(c or 0), int(o or 0), int(r or 0)) for b, i, c, o, r in rows}
    return {batch_id: found.get(batch_id, TokenUsage()) for batch_id in wanted}
