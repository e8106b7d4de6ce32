"""Public ids: prefixed, unique and in creation order, one at a time or drawn in bulk."""

from __future__ import annotations

import threading

from storage.ids import IdPool, new_id, new_ids


def test_ids_made_in_bulk_are_unique_ordered_and_after_earlier_ones() -> None:
    before = new_id("batch_req_")
    bulk = new_ids("batch_req_", 5000)
    after = new_id("batch_req_")
    assert len(set(bulk)) == 5000
    assert [before, *bulk, after] == sorted([before, *bulk, after])
    assert all(i.startswith("batch_req_") and len(i) == len(before) for i in bulk)


def test_a_pool_shared_by_threads_never_hands_out_an_id_twice() -> None:
    pool = IdPool("batch_req_", batch=97)
    seen: list[str] = []

    def take() -> None:
        seen.extend(pool.next() for _ in range(2000))

    threads = [threading.Thread(target=take) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 8000 and len(set(seen)) == 8000
