"""Reading a live /metrics the way Prometheus does: prometheus-client's own text parser."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str, *, token: str | None = None) -> tuple[Samples, set[str]]:
    """(every sample by name and labels, every family name) of one scrape."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(url, headers=headers, timeout=30)
    response.raise_for_status()
    samples: Samples = {}
    families: set[str] = set()
    for family in text_string_to_metric_families(response.text):
        families.add(family.name)
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, families


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample's value, 0 if absent (a counter not yet incremented reads as zero)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over every sample of `name` whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(v for (n, got), v in samples.items() if n == name and wanted <= got)
