"""JSON values as the database and the result files store them (orjson: integers of at most 64 bits).

A model's answer may hold any integer (a tool call's arguments, a structured answer parsed by the wire format); an
integer past that range is stored as the float any JSON reader takes it for (orjson, JavaScript), or null past the
float's range, never an error that stops the writer: one line's answer must not stall every tenant's results.
"""

from __future__ import annotations

from typing import Any

import orjson

INT_MIN, INT_MAX = -(2**63), 2**64 - 1  # what orjson writes as an integer


class UnstorableValue(ValueError):
    """A value no JSON column or result file can hold (not JSON data at all, or nested past Python's limit)."""


def storable(value: Any) -> Any:
    """`value` itself when orjson writes it; else a copy with its out-of-range integers widened (`UnstorableValue`
    when that is not enough)."""
    try:
        orjson.dumps(value)
        return value
    except TypeError:
        pass
    try:
        widened = _widened(value)
        orjson.dumps(widened)
    except (TypeError, RecursionError) as error:
        raise UnstorableValue(str(error) or type(error).__name__) from None
    return widened


def _widened(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | dict | list | tuple):
        return value
    if isinstance(value, int):
        if INT_MIN <= value <= INT_MAX:
            return value
        try:
            return float(value)
        except OverflowError:
            return None
    if isinstance(value, dict):
        return {key: _widened(item) for key, item in value.items()}
    return [_widened(item) for item in value]
