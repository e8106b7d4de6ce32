"""Prometheus metrics: what every process exposes and how (docs/operations.md).

`events` holds the counters incremented where things happen; `queue_state` the gauges read from the
database at scrape time (the API process exposes those). `exposition` renders one process's metrics;
`serve_metrics` starts the small HTTP server a Celery worker or beat answers scrapes (and readiness
probes, `/ready`) on. With
PROMETHEUS_MULTIPROC_DIR set (a process that forks workers), each process writes its values there and
exposition merges them (prometheus-client's multiprocess mode).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
    make_wsgi_app,
    multiprocess,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` series beside every counter: they double the series count


def multiprocess_dir() -> str | None:
    """The directory of prometheus-client's multiprocess mode, if this process runs in it."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def process_registry(*extra: Collector) -> CollectorRegistry:
    """This process's metrics (merged across forked processes in multiprocess mode), plus `extra` collectors."""
    if multiprocess_dir() is None and not extra:
        return REGISTRY
    registry = CollectorRegistry(auto_describe=False)
    if multiprocess_dir() is not None:
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry.register(_Everything())
    for collector in extra:
        registry.register(collector)
    return registry


class _Everything(Collector):
    """The default registry as one collector, so a registry can add the queue collector beside it."""

    def collect(self):  # type: ignore[no-untyped-def]
        yield from REGISTRY.collect()


def exposition(*extra: Collector) -> tuple[bytes, str]:
    """The text exposition of this process's metrics (and `extra` collectors), with its content type."""
    return generate_latest(process_registry(*extra)), CONTENT_TYPE_LATEST


def serve_metrics(port: int, *, role: str, ready: Callable[[], bool] | None = None) -> bool:
    """Answer scrapes on `port` in a background thread (0: off), and `/ready` with 200 once `ready()` is true
    (503 before; always 200 without `ready`). A port in use is logged, not fatal: inference goes on, and
    Prometheus reports the target down."""
    from storage.metrics.events import PROCESS_INFO

    PROCESS_INFO.labels(role).set(1)
    if port == 0:
        return False
    try:
        server = make_server(
            "0.0.0.0", port, _with_readiness(make_wsgi_app(process_registry()), ready), ThreadingWSGIServer, _Quiet
        )
    except OSError as error:
        log.error("metrics: cannot listen on port %d (BACKFILL_METRICS_PORT) for %s: %s", port, role, error)
        return False
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    log.info("metrics: %s serves /metrics and /ready on port %d", role, port)
    return True


Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _with_readiness(metrics: Wsgi, ready: Callable[[], bool] | None) -> Wsgi:
    """`/ready` answered from `ready` (a Kubernetes readiness probe); every other path is the metrics app."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/ready":
            return metrics(environ, start_response)
        ok = ready is None or ready()
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
        return [b"ready\n" if ok else b"not ready\n"]

    return app


class _Quiet(WSGIRequestHandler):
    """Probes and scrapes arrive every few seconds: no access log line for each."""

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing."""
