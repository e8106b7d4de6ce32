"""The metrics server of workers and beat: /metrics for Prometheus, /ready for a Kubernetes readiness probe."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

from storage.metrics import serve_metrics


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status), answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_ready_answers_503_until_the_process_says_it_is_ready_while_metrics_answer_throughout() -> None:
    warm = [False]
    port = free_port()
    assert serve_metrics(port, role="worker-gpu", ready=lambda: warm[0])

    assert get(port, "/ready")[0] == 503
    status, body = get(port, "/metrics")
    assert status == 200 and b'backfill_process_info{role="worker-gpu"} 1.0' in body
    warm[0] = True
    assert get(port, "/ready") == (200, b"ready\n")
    warm[0] = False  # told to stop: no longer counted as serving
    assert get(port, "/ready")[0] == 503


def test_a_process_without_a_readiness_signal_is_ready_once_it_answers() -> None:
    port = free_port()
    assert serve_metrics(port, role="beat")
    assert get(port, "/ready")[0] == 200
