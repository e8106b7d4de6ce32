"""`backfill serve` refuses to expose /metrics (queue depths, tenant names) beyond loopback without a token."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from storage.settings import get_settings
from worker.cli.main import main
from worker.cli.serve import metrics_exposure_problem


@pytest.fixture(autouse=True)
def fresh_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> Iterator[None]:
    monkeypatch.delenv("BACKFILL_METRICS_TOKEN", raising=False)
    monkeypatch.setenv("BACKFILL_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_serving_on_every_interface_without_a_metrics_token_stops_at_start_naming_the_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--host", "0.0.0.0", "--port", "1"]) == 2
    assert "BACKFILL_METRICS_TOKEN" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_needs_no_token(host: str) -> None:
    assert metrics_exposure_problem(host, token=None) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "api.example.com"])
def test_any_other_address_needs_one(host: str) -> None:
    assert "BACKFILL_METRICS_TOKEN" in (metrics_exposure_problem(host, token=None) or "")
    assert metrics_exposure_problem(host, token="a-long-random-token") is None
