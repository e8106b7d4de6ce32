"""The Grafana dashboard, the Prometheus config and alert rules parse, are valid PromQL, and fit the compose file.

Syntax is checked offline with promql-parser (the Rust parser of GreptimeDB's PromQL, in the dev extra);
where promtool is installed (Debian's `prometheus` package) it checks the config and runs the rules' unit
tests too. That every named metric exists on a live /metrics is checked in tests/integration/api/test_prometheus.py
(API + embedded worker) and tests/e2e/test_metrics_deployment.py (the Celery deployment).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from storage.settings import Settings
from tests.observability import INFRA, dashboard, dashboard_exprs, metric_names, named_metrics, rule_exprs, rules

COMPOSE = yaml.safe_load((INFRA / "docker-compose.yml").read_text())


def test_every_dashboard_and_rule_query_is_valid_promql_about_backfill() -> None:
    exprs = dashboard_exprs() + rule_exprs()
    assert len(exprs) > 30
    for expr in exprs:
        names = metric_names(expr)  # raises on a syntax error
        assert names and all(name.startswith("backfill_") or name == "up" for name in names), expr
    assert {
        "backfill_queue_deadline_slack_seconds",
        "backfill_lease_expiries_total",
        "backfill_s3_errors_total",
    } <= named_metrics()


def test_the_parser_refuses_broken_promql() -> None:
    with pytest.raises(ValueError):
        metric_names("sum by (model (rate(backfill_engine_steps_total[5m]))")


def test_the_dashboard_is_a_grafana_dashboard_with_the_four_sections() -> None:
    board = dashboard()
    assert board["uid"] == "backfill" and board["schemaVersion"] >= 36
    rows = [panel["title"] for panel in board["panels"] if panel["type"] == "row"]
    assert rows == ["Queue and deadlines", "Engine", "Cost and discount", "Errors"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
            assert len({target["refId"] for target in panel["targets"]}) == len(panel["targets"])
    variables = {variable["name"]: variable for variable in board["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"


def test_every_alert_has_a_severity_a_summary_and_a_pending_period() -> None:
    names = {rule["alert"] for rule in rules()}
    assert {
        "BackfillDeadlineWillBeMissed",
        "BackfillWorkerDown",
        "BackfillLeaseExpiriesRising",
        "BackfillS3Errors",
    } <= names
    for rule in rules():
        assert rule["labels"]["severity"] in {"warning", "critical"} and rule["annotations"]["summary"]
        assert rule["for"].endswith("m")


def test_prometheus_scrapes_every_backfill_service_of_the_compose_file() -> None:
    config = yaml.safe_load((INFRA / "prometheus" / "prometheus.yml").read_text())
    targets = {
        target for job in config["scrape_configs"] for group in job["static_configs"] for target in group["targets"]
    }
    port = Settings.model_fields["metrics_port"].default
    assert targets == {"api:8000", f"worker-gpu:{port}", f"worker-io:{port}", f"beat:{port}"}
    services = COMPOSE["services"]
    assert {target.split(":")[0] for target in targets} <= set(services)
    assert "8000:8000" in services["api"]["ports"]
    for rule_file in config["rule_files"]:
        assert (INFRA / "prometheus" / rule_file).is_file()


def test_compose_runs_prometheus_and_grafana_with_the_dashboard_provisioned() -> None:
    services = COMPOSE["services"]
    assert "./prometheus:/etc/prometheus:ro" in services["prometheus"]["volumes"]
    mounts = {volume.split(":")[0]: volume.split(":")[1] for volume in services["grafana"]["volumes"]}
    assert mounts["./grafana/backfill.json"].startswith("/etc/grafana/dashboards/backfill")
    provider = yaml.safe_load((INFRA / "grafana" / "provisioning" / "dashboards" / "backfill.yml").read_text())
    assert mounts["./grafana/backfill.json"].startswith(provider["providers"][0]["options"]["path"])
    source = yaml.safe_load((INFRA / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert source["datasources"][0]["url"] == "http://prometheus:9090"
    for host_path in mounts:
        if host_path.startswith("./"):
            assert (INFRA / host_path).exists(), host_path


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool is not installed (Debian: apt-get install prometheus)"
)
def test_promtool_accepts_the_config_and_the_alerts_fire_as_their_unit_tests_expect(tmp_path: Path) -> None:
    # promtool insists the API's bearer token file exists: the compose entrypoint writes it at start, here a copy
    # of the config reads a stand-in.
    config = yaml.safe_load((INFRA / "prometheus" / "prometheus.yml").read_text())
    token = tmp_path / "token"
    token.write_text("stand-in")
    for job in config["scrape_configs"]:
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
    checked = INFRA / "prometheus" / ".promtool-check.yml"
    checked.write_text(yaml.safe_dump(config))
    try:
        for args in (["check", "config", checked.name], ["test", "rules", "alerts.test.yml"]):
            result = subprocess.run(["promtool", *args], cwd=INFRA / "prometheus", capture_output=True, text=True)
            assert result.returncode == 0, result.stdout + result.stderr
    finally:
        checked.unlink()


def test_compose_protects_the_apis_metrics_with_the_token_prometheus_sends() -> None:
    services = COMPOSE["services"]
    assert "BACKFILL_METRICS_TOKEN:?" in services["api"]["environment"]["BACKFILL_METRICS_TOKEN"]
    config = yaml.safe_load((INFRA / "prometheus" / "prometheus.yml").read_text())
    api = next(job for job in config["scrape_configs"] if job["job_name"] == "backfill-api")
    token_file = api["authorization"]["credentials_file"]
    assert api["authorization"]["type"] == "Bearer"
    entrypoint = " ".join(services["prometheus"]["entrypoint"])  # writes the token where the config reads it
    assert token_file in entrypoint and "BACKFILL_METRICS_TOKEN" in entrypoint
