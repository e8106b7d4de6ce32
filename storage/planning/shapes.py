"""How much work a request or a job asks for, sized without a tokenizer.

Output = the line's max_completion_tokens, max_tokens or (Responses) max_output_tokens (default 256;
embeddings and moderations produce none); input ~
bytes / 4, but an image counts IMAGE_TOKENS_ESTIMATE tokens instead of its inline bytes (a base64 image is
megabytes of text, yet a model sees a few hundred tokens of it; a remote one is only its URL). Ingest sizes every
row once this way (`est_input_tokens`, `max_output_tokens`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from storage.endpoints import EMBEDDINGS_URL, MODERATIONS_URL
from storage.lines.reader import LineChecker, LineError, iter_lines

DEFAULT_MAX_TOKENS = 256
MAX_OUTPUT_TOKENS = 2**31 - 1  # `max_output_tokens` is a 32-bit column; no engine produces more anyway
BYTES_PER_TOKEN = 4
# An image's tokens, before a model processes it: OpenAI's price of a 1024 x 1024 `detail: high` image (765).
# Vision models differ (the demo model takes 7, Qwen2-VL ~1,000 for that image): an estimate for planning only.
IMAGE_TOKENS_ESTIMATE = 765
IMAGE_PART_TYPES = frozenset({"image_url", "input_image", "image"})  # chat, Responses, Messages
_NO_OUTPUT_URLS = frozenset({EMBEDDINGS_URL, MODERATIONS_URL})  # pooling: one pass, nothing generated


@dataclass(frozen=True)
class JobShape:
    """How much a job asks for: requests, approximate input tokens and maximum output tokens."""

    requests: int
    input_tokens: int
    output_tokens: int
    model: str | None = None
    skipped_lines: int = 0  # lines a file had that ingest would reject (so the batch would fail validation)
    problems: tuple[LineError, ...] = ()  # the first of them
    lora_work: float = 0.0  # the extra work of its adapter lines (storage/planning/lora.py), in output tokens
    # (adapter, input tokens, output tokens) of its lines naming each adapter: what `lora_work` is weighed from
    adapter_tokens: tuple[tuple[str, int, int], ...] = ()


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
    images, inline = image_bytes(body)
    text_bytes = max(0, line_bytes - inline)
    return -(-text_bytes // BYTES_PER_TOKEN) + images * IMAGE_TOKENS_ESTIMATE, output_limit(body, url)


def image_bytes(body: Any) -> tuple[int, int]:
    """(images, bytes of their inline data) in a line's messages or Responses input: the image parts of chat
    (`image_url`), Responses (`input_image`) and Messages (`image`) content."""
    if not isinstance(body, dict):
        return 0, 0
    images = inline = 0
    for key in ("messages", "input"):
        turns = body.get(key)
        for turn in turns if isinstance(turns, list) else ():
            content = turn.get("content") if isinstance(turn, dict) else None
            for part in content if isinstance(content, list) else ():
                if isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
                    images += 1
                    inline += len(_image_data(part))
    return images, inline


def _image_data(part: dict[str, Any]) -> str:
    """The image's URL or base64 data as the line spells it ("" if it has none)."""
    found = part.get("image_url")  # chat: {"url": ...}; Responses: the URL itself
    if isinstance(found, dict):
        found = found.get("url")
    source = part.get("source")
    if found is None and isinstance(source, dict):  # a Messages image: base64 data or a url
        found = source.get("data") or source.get("url")
    return found if isinstance(found, str) else ""


def work(*, output_tokens: float, input_tokens: float, prefill_weight: Decimal) -> float:
    """The one work formula, in output-token equivalents: output + prefill_weight x input tokens."""
    return output_tokens + float(prefill_weight) * input_tokens


def exact_work(*, output_tokens: int, input_tokens: int, prefill_weight: Decimal) -> Fraction:
    """`work` as an exact fraction: a run's busy time is divided by it to the last digit (finance/attribution.py)."""
    return Fraction(output_tokens) + Fraction(prefill_weight) * input_tokens


def work_of(shape: JobShape, prefill_weight: Decimal) -> float:
    """The work of a shape (`work`), its adapter lines' LoRA overhead included."""
    tokens = work(output_tokens=shape.output_tokens, input_tokens=shape.input_tokens, prefill_weight=prefill_weight)
    return tokens + shape.lora_work


MAX_PROBLEMS = 20  # line problems an estimate echoes; `skipped_lines` counts them all


def shape_of_jsonl(
    chunks: Iterable[bytes],
    *,
    max_line_bytes: int,
    max_requests: int,
    endpoint: str | None = None,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    default_models: Mapping[str, str] | None = None,
    adapters: Mapping[str, str] | None = None,
    max_adapters: int = 64,
) -> JobShape:
    """Size a batch input file streamed in chunks, judging each line exactly as ingest would (`adapters`: name ->
    base of those the tenant may name, at most `max_adapters` distinct: BACKFILL_BATCH_MAX_ADAPTERS).

    Lines the checker rejects are counted (`skipped_lines`, the first few kept in `problems`), not sized:
    ingest would fail the whole batch for them, and the estimate says so. Adapter lines' tokens are also kept per
    adapter (`adapter_tokens`): the planner weighs them by their adapter's LoRA overhead (storage/queue/backlog.py).
    """
    checker = LineChecker(
        endpoint=endpoint,
        max_requests=max_requests,
        default_models=default_models,
        adapters=adapters,
        max_adapters=max_adapters,
    )
    requests = input_tokens = output_tokens = 0
    problems: list[LineError] = []
    skipped = 0
    per_adapter: dict[str, tuple[int, int]] = {}
    for number, raw in iter_lines(chunks, max_line_bytes=max_line_bytes):
        outcome = checker.check(number, raw, max_line_bytes=max_line_bytes)
        if isinstance(outcome, LineError):
            skipped += 1
            if len(problems) < MAX_PROBLEMS:
                problems.append(outcome)
        elif outcome is not None:
            requests += 1
            line_input = request_size(outcome.url, outcome.body, line_bytes=len(raw or b""))[0]
            line_output = output_limit(outcome.body, outcome.url, default_max_tokens)
            input_tokens, output_tokens = input_tokens + line_input, output_tokens + line_output
            if outcome.adapter is not None:
                seen = per_adapter.get(outcome.adapter, (0, 0))
                per_adapter[outcome.adapter] = (seen[0] + line_input, seen[1] + line_output)
    adapter_tokens = tuple((name, i, o) for name, (i, o) in per_adapter.items())
    return JobShape(
        requests, input_tokens, output_tokens, checker.model, skipped, tuple(problems), adapter_tokens=adapter_tokens
    )
