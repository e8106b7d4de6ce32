"""Keyset paging, written once: a page of rows in (created_at, id) order strictly after an anchor row.

Every list endpoint pages this way (OpenAI's `after`, Anthropic's `after_id`/`before_id`): no OFFSET, so a page
costs the same however deep it is, and rows created meanwhile never shift a page.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Select
from sqlalchemy.orm import InstrumentedAttribute, Session

T = TypeVar("T")


def keyset_page(
    session: Session,
    query: Select[T],
    *,
    created: InstrumentedAttribute[Any],
    ident: InstrumentedAttribute[Any],
    anchor: tuple[Any, str] | None,
    limit: int,
    descending: bool = True,
) -> list[T]:
    """`limit + 1` rows of `query` after `anchor` ((created_at, id) of the row the page starts after), newest
    first unless `descending` is False; the extra row tells the caller whether more exist."""
    if anchor is not None:
        at, key = anchor
        if descending:
            query = query.where((created < at) | ((created == at) & (ident < key)))
        else:
            query = query.where((created > at) | ((created == at) & (ident > key)))
    order = (created.desc(), ident.desc()) if descending else (created.asc(), ident.asc())
    return list(session.scalars(query.order_by(*order).limit(limit + 1)))
