"""The Grafana dashboard and the alert rules query only metrics a worker exports."""

import json
import re
from pathlib import Path

import yaml

from processor.machines import builtin_machines
from processor.observe.metrics import WorkerMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAME = re.compile(r"\brunstate_[a-z_]+")


def exported() -> set[str]:
    metrics = WorkerMetrics(builtin_machines(), lambda: [], lambda: {})
    names: set[str] = set()
    for family in metrics.registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def test_dashboard_queries_exported_metrics() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "runstate.json").read_text())
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in NAME.findall(target["expr"])
    }
    assert used, "the dashboard queries nothing"
    assert used <= exported(), sorted(used - exported())
    assert len({p["gridPos"]["y"] * 100 + p["gridPos"]["x"] for p in dashboard["panels"]}) == len(
        dashboard["panels"]
    ), "panels overlap"


def test_alert_rules_query_exported_metrics() -> None:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    used = {
        name
        for group in rules["groups"]
        for rule in group["rules"]
        for name in NAME.findall(rule["expr"])
    }
    assert len(rules["groups"][0]["rules"]) == 6  # the six task alert rules
    assert used and used <= exported(), sorted(used - exported())
