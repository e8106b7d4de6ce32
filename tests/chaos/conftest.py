"""The chaos cluster (its own Postgres, Redis and S3 behind the fault proxy), started once per session."""

from __future__ import annotations

import glob
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.procs import kill_all, live_children
from tests.chaos.run import prepare_template
from tests.chaos.services import Cluster


@pytest.fixture(scope="session")
def chaos_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Postgres + Redis + moto on free ports, with a migrated template database; all killed at the end."""
    if not glob.glob("/usr/lib/postgresql/*/bin/initdb") or shutil.which("redis-server") is None:
        pytest.skip("the chaos suite needs Postgres' binaries (/usr/lib/postgresql/*/bin) and redis-server")
    scratch_cache = None
    try:
        cache = Path(request.config.cache.mkdir("chaos"))  # type: ignore[union-attr]
    except AttributeError:  # -p no:cacheprovider
        cache = scratch_cache = Path(tempfile.mkdtemp(prefix="backfill-chaos-cache-"))
    cluster = Cluster.start(Path(tempfile.mkdtemp(prefix="backfill-chaos-")), cache=cache)
    try:
        prepare_template(cluster)
        yield cluster
    finally:
        cluster.stop()
        kill_all()
        shutil.rmtree(cluster.root, ignore_errors=True)
        if scratch_cache is not None:
            shutil.rmtree(scratch_cache, ignore_errors=True)
    assert live_children() == []
