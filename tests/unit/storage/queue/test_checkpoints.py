"""Packing generated token ids: exact round trip, compact."""

from __future__ import annotations

from storage.queue.checkpoints import pack_tokens, unpack_tokens


def test_token_ids_round_trip_exactly_including_large_ids() -> None:
    ids = [0, 1, 151_935, 2**31 - 1, 42] * 100
    assert unpack_tokens(pack_tokens(ids)) == ids
    assert unpack_tokens(pack_tokens([])) == []


def test_packed_ids_take_less_than_four_bytes_a_token_on_repetitive_output() -> None:
    ids = [i % 300 for i in range(2000)]
    assert len(pack_tokens(ids)) < 2 * len(ids)
