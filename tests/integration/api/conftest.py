from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.conftest import Backend, LiveServer, start_server

# Steps take 1 ms and contexts are huge, so a request with max_tokens=10**8 runs until it is cancelled.
FAKE_MODELS = json.dumps(
    {
        "fake-model": {"path": "fake:", "max_num_seqs": 8, "max_model_len": 10**9, "extra": {"step_seconds": 0.001}},
        "other-model": {"path": "fake:"},
    }
)


@pytest.fixture
def api(backend: Backend) -> Iterator[LiveServer]:
    """The real API over HTTP with the in-process worker on the fake engine."""
    server, stop = start_server(with_worker=True)
    yield server
    stop()
