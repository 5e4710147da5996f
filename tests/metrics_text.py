"""Reading a `/metrics` page in tests: the families it declares and its samples by name and labels."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Page:
    families: set[str]  # declared family names (# TYPE lines), counters with their `_total`
    samples: list[tuple[str, dict[str, str], float]]

    def values(self, name: str, **labels: str) -> list[float]:
        return [v for n, lab, v in self.samples if n == name and all(lab.get(k) == x for k, x in labels.items())]

    def total(self, name: str, **labels: str) -> float:
        return sum(self.values(name, **labels))

    def by(self, name: str, *keys: str, **labels: str) -> dict[tuple[str, ...], float]:
        out: dict[tuple[str, ...], float] = {}
        for n, lab, v in self.samples:
            if n == name and all(lab.get(k) == x for k, x in labels.items()):
                key = tuple(lab.get(k, "") for k in keys)
                out[key] = out.get(key, 0.0) + v
        return out


def parse(text: str) -> Page:
    families: set[str] = set()
    samples: list[tuple[str, dict[str, str], float]] = []
    for family in text_string_to_metric_families(text):
        families.add(family.name + ("_total" if family.type == "counter" else ""))
        samples += [(s.name, dict(s.labels), float(s.value)) for s in family.samples]
    return Page(families, samples)


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(base: str) -> Page:
    status, text = get(base + "/metrics")
    assert status == 200, (status, text)
    return parse(text)


def readyz(base: str) -> tuple[int, dict[str, object]]:
    status, text = get(base + "/readyz")
    return status, json.loads(text)
