"""The deployment files parse, and reference only settings that exist, with values that validate."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from storage.settings import Settings

INFRA = Path(__file__).resolve().parents[3] / "infra"


def env_file() -> dict[str, str]:
    pairs = {}
    for line in (INFRA / ".env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            pairs[name] = value
    return pairs


def test_env_example_names_only_real_settings_and_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = {f"BACKFILL_{name.upper()}" for name in Settings.model_fields}
    pairs = env_file()
    assert set(pairs) <= fields, set(pairs) - fields
    for name, value in pairs.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    model = settings.served_models()[settings.current_worker_model()]
    assert model.tensor_parallel_size == 8 and settings.gpu_count == 8
    assert settings.completion_windows["24h"] == 0.5


def test_compose_runs_every_role_against_the_settings() -> None:
    compose = yaml.safe_load((INFRA / "docker-compose.yml").read_text())
    services = compose["services"]
    commands = {name: " ".join(service.get("command", [])) for name, service in services.items()}
    assert "backfill serve" in commands["api"] and "backfill beat" in commands["beat"]
    assert "--role gpu" in commands["worker-gpu"] and "--role io" in commands["worker-io"]
    gpus = services["worker-gpu"]["deploy"]["resources"]["reservations"]["devices"][0]["count"]
    assert gpus == 8
    # A stopping GPU worker drains, then hands its work back: compose must not kill it first (default 10 s).
    drain = int(env_file()["BACKFILL_SHUTDOWN_DRAIN_SECONDS"])
    assert int(services["worker-gpu"]["stop_grace_period"].removesuffix("s")) >= drain + 30
    referenced = set(re.findall(r"BACKFILL_[A-Z_]+", (INFRA / "docker-compose.yml").read_text()))
    assert referenced <= {f"BACKFILL_{name.upper()}" for name in Settings.model_fields}
