"""Values as the database's JSON columns and the result files hold them."""

from __future__ import annotations

import pytest

from storage.json_values import INT_MAX, INT_MIN, UnstorableValue, storable


def test_ordinary_values_are_stored_as_they_are() -> None:
    body = {"a": [1, 2.5, "x", None, True], "b": {"c": INT_MAX, "d": INT_MIN}}
    assert storable(body) is body


def test_integers_past_64_bits_widen_to_the_float_a_json_reader_takes_them_for() -> None:
    body = {"n": [INT_MAX + 1, INT_MIN - 1, 10**30], "ok": 3, "flag": True, "huge": 10**400}
    assert storable(body) == {"n": [float(INT_MAX + 1), float(INT_MIN - 1), 1e30], "ok": 3, "flag": True, "huge": None}


def test_a_value_that_is_not_json_data_is_refused_by_name() -> None:
    with pytest.raises(UnstorableValue):
        storable({"n": 10**30, "when": object()})
