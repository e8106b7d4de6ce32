"""The dashboard and the alert rules as tests read them: every PromQL expression, and the metrics each names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import promql_parser
import yaml

INFRA = Path(__file__).resolve().parents[1] / "infra"
DASHBOARD = INFRA / "grafana" / "backfill.json"
RULES = INFRA / "prometheus" / "alerts.yml"
# Grafana fills these in before Prometheus sees a query; stand-ins that keep the query's shape.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$model": ".*", "${datasource}": "prometheus"}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def as_prometheus_sees_it(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def dashboard_exprs() -> list[str]:
    """Every query of the dashboard (panel targets and the template variable), variables filled in."""
    board = dashboard()
    exprs = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":  # label_values(metric, label) is Grafana's, not PromQL: keep the metric
            inner = variable["query"]["query"].removeprefix("label_values(").split(",")[0]
            exprs.append(inner)
    return [as_prometheus_sees_it(expr) for expr in exprs]


def rule_exprs() -> list[str]:
    return [rule["expr"] for rule in rules()]


def metric_names(expr: str) -> set[str]:
    """The metric (sample) names an expression selects; raises ValueError if it is not valid PromQL."""
    names: set[str] = set()

    def walk(node: Any) -> None:
        if node is None:
            return
        if isinstance(node, promql_parser.VectorSelector):
            names.add(node.name)
            return
        for attribute in ("lhs", "rhs", "expr", "param", "vector_selector"):
            walk(getattr(node, attribute, None))
        for argument in getattr(node, "args", None) or []:
            walk(argument)

    walk(promql_parser.parse(expr))
    return names


def named_metrics() -> set[str]:
    """Every metric the dashboard and the rules name."""
    return {name for expr in dashboard_exprs() + rule_exprs() for name in metric_names(expr)}
