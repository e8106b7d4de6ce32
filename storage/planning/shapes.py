"""How much work a request or a job asks for, sized without a tokenizer.

Output = the line's max_completion_tokens, max_tokens or (Responses) max_output_tokens (default 256;
embeddings produce none); input ~
bytes / 4. Ingest sizes every row once this way (`est_input_tokens`, `max_output_tokens`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from storage.lines.reader import LineError
from storage.protocols import EMBEDDINGS_URL

DEFAULT_MAX_TOKENS = 256
MAX_OUTPUT_TOKENS = 2**31 - 1  # `max_output_tokens` is a 32-bit column; no engine produces more anyway
BYTES_PER_TOKEN = 4
_NO_OUTPUT_URLS = frozenset({EMBEDDINGS_URL})


@dataclass(frozen=True)
class JobShape:
    """How much a job asks for: requests, approximate input tokens and maximum output tokens."""

    requests: int
    input_tokens: int
    output_tokens: int
    model: str | None = None
    skipped_lines: int = 0  # lines a file had that ingest would reject (so the batch would fail validation)
    problems: tuple[LineError, ...] = ()  # the first of them


def output_limit(body: Any, url: str | None, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> int:
    """The most output tokens a request may produce: its output cap, or the default."""
    if url in _NO_OUTPUT_URLS:
        return 0
    for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(name) if isinstance(body, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return min(value, MAX_OUTPUT_TOKENS)
    return default_max_tokens


def request_size(url: str, body: Any, *, line_bytes: int) -> tuple[int, int]:
    """(approximate input tokens, maximum output tokens) of one JSONL line of `line_bytes` bytes."""
    return -(-line_bytes // BYTES_PER_TOKEN), output_limit(body, url)


def work(*, output_tokens: float, input_tokens: float, prefill_weight: Decimal) -> float:
    """The one work formula, in output-token equivalents: output + prefill_weight x input tokens."""
    return output_tokens + float(prefill_weight) * input_tokens


def work_of(shape: JobShape, prefill_weight: Decimal) -> float:
    """The work of a shape (`work`)."""
    return work(output_tokens=shape.output_tokens, input_tokens=shape.input_tokens, prefill_weight=prefill_weight)
