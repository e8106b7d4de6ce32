"""Keyset paging, written once: a page of rows in key order strictly beyond an anchor row, in either direction.

Every list in storage pages this way (`after`, `after_id`/`before_id`, the console's list,
webhook endpoints and deliveries): no OFFSET, so a page costs the same however deep it is, and rows created
meanwhile never shift a page. The key is `(created_at, id)`, or the id alone where ids are time-ordered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, TypeVarTuple

from sqlalchemy import ColumnElement, Select, and_, or_
from sqlalchemy.orm import InstrumentedAttribute, Session

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
Key = Sequence[InstrumentedAttribute[Any]]


def keyset(
    query: Select[*Ts],
    *,
    key: Key,
    anchor: Sequence[Any] | None,
    limit: int,
    descending: bool = True,
    before: bool = False,
) -> Select[*Ts]:
    """`query` narrowed to the `limit + 1` rows past `anchor` (its values of `key`) in the page's direction.

    The page runs newest first unless `descending` is False. `before` pages the other way: the rows on the
    anchor's near side, nearest first (the caller shows `rows[:limit]` reversed). The extra row tells the
    caller whether more exist in the direction it pages.
    """
    newest_first = descending != before
    if anchor is not None:
        query = query.where(_beyond(key, anchor, smaller=newest_first))
    order = [column.desc() if newest_first else column.asc() for column in key]
    return query.order_by(*order).limit(limit + 1)


def keyset_page(
    session: Session,
    query: Select[T],
    *,
    key: Key,
    anchor: Sequence[Any] | None,
    limit: int,
    descending: bool = True,
    before: bool = False,
) -> list[T]:
    """The rows `keyset` selects, read as scalars (the first selected entity of each row)."""
    statement = keyset(query, key=key, anchor=anchor, limit=limit, descending=descending, before=before)
    return list(session.scalars(statement))


def _beyond(key: Key, anchor: Sequence[Any], *, smaller: bool) -> ColumnElement[bool]:
    """Rows whose key sorts strictly before (`smaller`) or after the anchor's, column by column."""
    if len(key) != len(anchor) or not key:
        raise ValueError("A keyset anchor gives one value per key column.")
    column, value = key[0], anchor[0]
    past: ColumnElement[bool] = column < value if smaller else column > value
    if len(key) == 1:
        return past
    return or_(past, and_(column == value, _beyond(key[1:], anchor[1:], smaller=smaller)))
