"""A batch's result lines read from the queue rows: while it runs (with a cursor), or merged with its retries.

Each line is rendered in the batch's own format (OpenAI's output/error lines, Anthropic's `{custom_id,
result}`), each request at most once per answer. `after` is an opaque cursor (`rs_<n>`, see
storage/queue/result_pages.py): the answer's `next_after` fetches only what finished since.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
from sqlalchemy.orm import Session

from storage.batches import lifecycle
from storage.batches.batches import get_batch
from storage.batches.retries import retry_family, retry_tree
from storage.errors import InvalidRequest
from storage.lines.anthropic import result_line as message_result_line
from storage.lines.openai import result_line
from storage.protocols import ANTHROPIC
from storage.queue.result_pages import PAGE_ROWS, merged_pages, number_results, numbered_pages

_CURSOR = re.compile(r"rs_(\d{1,18})")


@dataclass(frozen=True)
class ResultLines:
    """What a results answer streams, whether more may come (the batch has not ended) and the next cursor."""

    lines: Iterator[bytes]
    incomplete: bool
    next_after: str | None


def parse_cursor(after: str | None) -> int:
    """The sequence number an `after` cursor stands for (0: from the start); InvalidRequest if malformed."""
    if after is None:
        return 0
    match = _CURSOR.fullmatch(after)
    if match is None:
        raise InvalidRequest("Invalid cursor: pass the X-Next-After value of a previous answer.", param="after")
    return int(match.group(1))


def results_so_far(
    session: Session, *, tenant_id: str, batch_id: str, after: str | None, page_rows: int = PAGE_ROWS
) -> ResultLines:
    """The batch's result lines recorded after the cursor (all of them without one), streamed in pages."""
    start = parse_cursor(after)
    batch = get_batch(session, tenant_id=tenant_id, batch_id=batch_id)  # its status before the numbering:
    upto = number_results(batch_id=batch.id)  # ended then, every line is numbered now (in short transactions)
    render = message_result_line if ANTHROPIC.owns(batch.protocol) else result_line

    pages = numbered_pages(batch_id=batch.id, after=start, upto=upto, page_rows=page_rows)
    lines = (orjson.dumps(render(*row)) + b"\n" for page in pages for row in page)
    return ResultLines(lines, batch.status not in lifecycle.TERMINAL, f"rs_{max(upto, start)}")


def merged_results(session: Session, *, tenant_id: str, batch_id: str, page_rows: int = PAGE_ROWS) -> ResultLines:
    """Every request of the batch once, over the batch and all its retries, the latest attempt winning."""
    batch = get_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    tree = retry_tree(session, batch=batch)
    below = [member.id for member in retry_family(session, batch=batch)]
    render = message_result_line if ANTHROPIC.owns(batch.protocol) else result_line
    incomplete = any(member.status not in lifecycle.TERMINAL for member in tree)
    pages = merged_pages(
        batches={member.id: member.attempt for member in tree},
        lines_of=None if below[0] == tree[0].id else below,
        page_rows=page_rows,
    )
    lines = (orjson.dumps(render(*row)) + b"\n" for page in pages for row, _, _ in page)
    return ResultLines(lines, incomplete, None)
