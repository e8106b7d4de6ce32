"""The embedded waker: any wake-up ends the idle wait; a batch to ingest also ends the engine's time slice."""

from __future__ import annotations

from storage.wakeups import EventWaker


def test_a_batch_to_ingest_ends_the_engines_time_slice_and_other_wake_ups_do_not() -> None:
    waker = EventWaker()
    waker.send("batch.finalize", {"batch_id": "batch_1"})
    waker.send("batch.run", {"model": "m"})
    assert waker.event.is_set() and not waker.interrupt.is_set()
    waker.send("batch.ingest", {"batch_id": "batch_2"})
    assert waker.interrupt.is_set()
