"""The `pg_stop_renewal` fault's timing (tests/chaos/renewal_catch.py) on the test Postgres: it lets the stop go only
once a worker's lease renewal waits on its locks, so the stop lands inside that renewal's transaction."""

from __future__ import annotations

import threading
import time

import pytest

from storage.db import transaction
from storage.queue import lease_expiry
from tests.chaos import renewal_catch
from tests.chaos.renewal_catch import RenewalCatch
from tests.conftest import Backend


def poll_until(catch: RenewalCatch, *, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (detail := catch.poll()) is not None:
            return detail
        time.sleep(0.05)
    return None


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_the_stop_waits_for_a_renewal_and_the_renewal_waits_for_the_stop(backend: Backend) -> None:
    with transaction() as session:
        lease = lease_expiry.open_lease(session, worker_id="gpu-1", lease_seconds=5)
    catch = RenewalCatch(backend.env["BACKFILL_DATABASE_URL"])
    assert catch.poll() is None, "no renewal has started: the stop must wait"
    renewed: list[int] = []

    def renew() -> None:  # the renewal's lease write (storage/queue/leases.py `renew`)
        with transaction() as session:
            renewed.append(lease_expiry.extend(session, worker_id="gpu-1", lease_ids=[lease], lease_seconds=5))

    renewal = threading.Thread(target=renew)
    renewal.start()
    try:
        detail = poll_until(catch, timeout=10)
        assert detail is not None and detail.startswith("a renewal (backend"), detail
        assert detail.endswith("waiting at its lease update on 1 locked leases"), detail
        assert not renewed, "the renewal went through before the stop could land in it"
    finally:
        catch.close()
        renewal.join(timeout=10)
    assert renewed == [1], "once the locks go, the renewal it held completes"


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_with_no_renewal_the_stop_goes_after_the_catch_window_and_says_so(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(renewal_catch, "CATCH_SECONDS", 0.3)
    catch = RenewalCatch(backend.env["BACKFILL_DATABASE_URL"])
    try:
        assert catch.poll() is None
        assert poll_until(catch, timeout=5) == "no renewal caught in 0 s"
    finally:
        catch.close()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_renewal_dropping_a_finished_claims_lease_is_caught_too(backend: Backend) -> None:
    """A claim whose rows all ended has a lease no renewal moves; the renewal deletes it (`drop_empty`) and waits there."""
    with transaction() as session:
        lease_expiry.open_lease(session, worker_id="gpu-1", lease_seconds=5)
    catch = RenewalCatch(backend.env["BACKFILL_DATABASE_URL"])
    assert catch.poll() is None
    renewal = threading.Thread(target=lambda: _drop_empty("gpu-1"))
    renewal.start()
    try:
        detail = poll_until(catch, timeout=10)
        assert detail is not None and detail.endswith("waiting at its drop of empty leases on 1 locked leases"), detail
    finally:
        catch.close()
        renewal.join(timeout=10)


def _drop_empty(worker_id: str) -> None:
    with transaction() as session:
        lease_expiry.drop_empty(session, worker_id=worker_id, keep=())
