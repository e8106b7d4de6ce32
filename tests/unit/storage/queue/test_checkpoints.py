"""Packing generated token ids: exact round trip, compact, and blobs of the first format still read."""

from __future__ import annotations

import random
import zlib
from array import array

from storage.queue.checkpoints import PLANES, pack_tokens, unpack_tokens


def _first_format(ids: list[int]) -> bytes:
    """What the first version stored: zlib of the interleaved little-endian int32 ids (chunks already written)."""
    return zlib.compress(array("i", ids).tobytes(), 6)


def _uniform(n: int, vocab: int = 128_256) -> list[int]:
    rng = random.Random(3)
    return [rng.randrange(vocab) for _ in range(n)]


def test_token_ids_round_trip_exactly_including_large_ids() -> None:
    ids = [0, 1, 151_935, 2**31 - 1, 42] * 100
    assert unpack_tokens(pack_tokens(ids)) == ids
    assert unpack_tokens(pack_tokens([])) == []
    assert unpack_tokens(pack_tokens([7])) == [7]


def test_both_formats_round_trip_whichever_is_kept() -> None:
    uniform, repetitive = _uniform(3000), [i % 300 for i in range(2000)]
    assert pack_tokens(uniform)[0] == PLANES  # byte planes win on random ids
    assert unpack_tokens(pack_tokens(uniform)) == uniform
    assert unpack_tokens(pack_tokens(repetitive)) == repetitive


def test_chunks_stored_by_the_first_format_still_unpack() -> None:
    for ids in (_uniform(1024), [i % 300 for i in range(2000)], [5], [2**31 - 1, 0, 70_000]):
        blob = _first_format(ids)
        assert blob[0] == 0x78 != PLANES  # a zlib stream's first byte: never the planes' format byte
        assert unpack_tokens(blob) == ids


def test_uniform_random_ids_pack_at_most_2_4_bytes_a_token_a_fifth_less_than_before() -> None:
    ids = _uniform(2048)
    assert len(pack_tokens(ids)) <= 2.4 * len(ids)  # the entropy floor: 17 bits, 2.1 bytes
    assert len(pack_tokens(ids)) <= 0.85 * len(_first_format(ids))


def test_packing_never_takes_more_than_the_first_format_and_under_2_bytes_a_token_on_repetitive_output() -> None:
    rng = random.Random(5)
    zipf = rng.choices(range(128_256), weights=[1 / (r + 1) for r in range(128_256)], k=2048)
    for ids in (_uniform(2048), zipf, [i % 300 for i in range(2000)], [1, 2, 3] * 500):
        assert len(pack_tokens(ids)) <= len(_first_format(ids))
    assert len(pack_tokens([i % 300 for i in range(2000)])) < 2 * 2000
