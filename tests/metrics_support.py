"""Scraping a real process's Prometheus endpoint in tests: samples keyed by name and labels."""

from __future__ import annotations

import re

import httpx
from prometheus_client.parser import text_string_to_metric_families
from worker_support import WorkerProcess

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> Samples:
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """Summed over every other label."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def metrics_url(worker: WorkerProcess) -> str:
    worker.wait_log("/metrics")
    found = re.search(r"metrics on (http://\S+/metrics)", worker.log())
    assert found, worker.log()
    return found.group(1)
