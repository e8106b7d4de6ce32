from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import Backend, LiveServer, start_server

FAKE_MODELS = '{"fake-model": {"path": "fake:", "max_num_seqs": 8}, "other-model": {"path": "fake:"}}'


@pytest.fixture
def api(backend: Backend) -> Iterator[LiveServer]:
    """The real API over HTTP with the in-process worker on the fake engine."""
    server, stop = start_server(with_worker=True)
    yield server
    stop()
