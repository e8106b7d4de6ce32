"""A batch's result lines read from the queue rows: while it runs (with a cursor), or merged with its retries.

Each line is rendered in the batch's own format (its protocol's `render_line`), each request at most once per
answer. `after` is an opaque cursor (`rs_<n>`, see storage/queue/result_rows.py): the answer's `next_after`
fetches only what finished since. `limit` bounds an answer (the cursor then points past its last line); its
`version` changes whenever the answer may, so a reader polling a batch that has not moved is told so without a
line being read (HTTP: ETag, 304).
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Iterator
from dataclasses import dataclass

import orjson
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches.batches import get_batch
from storage.batches.retries import retry_tree
from storage.errors import InvalidValue
from storage.models import Batch
from storage.protocols import protocol_of
from storage.queue.result_rows import PAGE_ROWS, number_results, numbered_pages
from storage.queue.retry_rows import merged_pages
from storage.strict import cursor_number

CURSOR_PREFIX = "rs_"


@dataclass(frozen=True)
class ResultLines:
    """What a results answer streams, whether more may come (the batch has not ended) and the next cursor."""

    lines: Iterator[bytes]
    incomplete: bool
    next_after: str | None
    version: str | None = None  # the same for every answer to the same question while the batch has not moved
    not_modified: bool = False  # the caller holds this version already: nothing was read, `lines` is empty
    has_more: bool = False  # `limit` cut the answer: more lines are ready past `next_after`


def parse_cursor(after: str | None) -> int:
    """The sequence number an `after` cursor stands for (0: from the start); InvalidValue unless `rs_` and ASCII
    digits (storage/strict.py)."""
    return 0 if after is None else cursor_number(after, prefix=CURSOR_PREFIX, param="after")


def results_so_far(
    session: Session,
    *,
    tenant_id: str,
    batch_id: str,
    after: str | None,
    limit: int | None = None,
    known: Container[str] = (),
    page_rows: int = PAGE_ROWS,
) -> ResultLines:
    """The batch's result lines recorded after the cursor (all of them, or the first `limit`), streamed in
    pages; `not_modified` (nothing numbered or read) when its version is one of `known`."""
    start = parse_cursor(after)
    batch = get_batch(session, tenant_id=tenant_id, batch_id=batch_id)  # its status before the numbering:
    incomplete, version = batch.status not in lifecycle.TERMINAL, results_version(batch, start=start, limit=limit)
    if version in known:
        return ResultLines(iter(()), incomplete, None, version, not_modified=True)
    upto = number_results(batch_id=batch.id)  # ended then, every line is numbered now (in short transactions)
    if start > upto:  # no answer gave this cursor: refused, never echoed back as the next one
        raise InvalidValue(
            "Invalid cursor: it is past this batch's last result; pass the X-Next-After value of an answer.",
            param="after",
        )
    # Numbers are 1..upto without a gap (each numbering chunk counts on from the highest number, under the
    # batch's lock), so the first `limit` lines after the cursor are exactly the numbers up to start + limit.
    end = upto if limit is None else min(upto, start + limit)
    render = protocol_of(batch).render_line

    pages = numbered_pages(batch_id=batch.id, after=start, upto=end, page_rows=min(page_rows, limit or page_rows))
    lines = (orjson.dumps(render(*row)) + b"\n" for page in pages for row in page)
    return ResultLines(lines, incomplete, f"{CURSOR_PREFIX}{end}", version, has_more=end < upto)


def results_version(batch: Batch, *, start: int, limit: int | None) -> str:
    """A tag for one cursor answer that changes whenever its lines may: a request finishing (or closed by a
    cancel, the window, a budget) moves the batch's counts in the transaction that records it, and the status
    says whether more may come. An answer read after the batch row may hold more lines than its tag counts
    (a weak tag: a poll with it still gets them later, when the counts have moved)."""
    key = f"v1|{batch.id}|{batch.status}|{batch.request_completed}|{batch.request_failed}|{start}|{limit}"
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def merged_results(
    session: Session, *, tenant_id: str, batch_id: str, limit: int | None = None, page_rows: int = PAGE_ROWS
) -> ResultLines:
    """Every request of the batch once (at most `limit`), over the batch and all its retries, the latest attempt
    winning. Reads one row per line (storage/queue/retry_rows.py), however many retries the tree holds."""
    batch = get_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    tree = retry_tree(session, batch=batch)
    render = protocol_of(batch).render_line
    incomplete = any(member.status not in lifecycle.TERMINAL for member in tree)
    pages = merged_pages(
        tree={member.id: member.attempt for member in tree},
        root_id=tree[0].id,
        batch_id=batch.id,
        limit=limit,
        page_rows=page_rows,
    )
    lines = (orjson.dumps(render(*row)) + b"\n" for page in pages for row, _, _ in page)
    return ResultLines(lines, incomplete, None)
