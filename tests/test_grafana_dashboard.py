"""The shipped Grafana dashboard queries only series the exporter serves, with labels they carry,
and shows every series the exporter serves."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuwarden.daemon.metrics import GpuwardenCollector
from tests.test_metrics_exporter import Source

DASHBOARD = Path(__file__).resolve().parents[1] / "configs" / "grafana" / "gpuwarden.json"
SERIES = re.compile(r"\b((?:DCGM_FI_|gpuwarden_)[A-Za-z0-9_]+)\s*(\{[^}]*\})?")
LABEL = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
# The same reading as gpuwarden_gpu_energy_joules_total (which the dashboard plots), kept under
# dcgm-exporter's name for dashboards written for it.
SAME_READING = {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}


def _exported() -> dict[str, set[str]]:
    """Series name → label names, from the collector over a source with every field set."""
    source = Source()
    static, sample = source.gpus[0]
    assert sample is not None
    source.gpus[0] = (static, dataclasses.replace(sample, fan_pct=40))
    source.runs[0].update(tokens_per_s=100.0, samples_seen=640, mem_peak=2**30)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuwardenCollector(source, hostname="node-1"))
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


def _queries(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        query = node.get("query")
        if isinstance(query, dict) and isinstance(query.get("query"), str):
            found.append(query["query"])
        return found + [q for value in node.values() for q in _queries(value)]
    if isinstance(node, list):
        return [q for item in node for q in _queries(item)]
    return []


def test_every_query_names_an_exported_series_and_its_labels() -> None:
    exported = _exported()
    queries = _queries(json.loads(DASHBOARD.read_text()))
    assert len(queries) > 20
    used: set[str] = set()
    for query in queries:
        for name, selector in SERIES.findall(query):
            assert name in exported, f"{name} (in {query!r}) is not exported"
            used.add(name)
            for label in LABEL.findall(selector or ""):
                assert label in exported[name], f"{name} has no label {label} (in {query!r})"
    assert set(exported) - used - SAME_READING == set(), "series the dashboard does not show"


def test_panels_have_unique_ids_and_use_the_datasource_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
