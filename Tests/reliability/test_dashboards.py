"""The operator dashboard and alerting rules under deploy/ read what Herald really exports.

* deploy/grafana/herald-dashboard.json: every metric name in every panel query and template
  variable query is a family a real daemon exports on its ``[metrics] listen`` endpoint (or in
  ``system.metrics``, which also carries ``herald_transport_state``, the per-app family a listener
  shows only with ``[metrics] app_figures = true``), with histogram ``_bucket``/``_sum``/``_count``
  samples mapped to their family, and every label name a query matches or groups by is one those
  families carry (or a target label Prometheus adds: ``job``, ``instance``). Every family the
  daemon exports is shown somewhere on the dashboard.
* deploy/prometheus/herald-alerts.yml: the same for every rule's expression;
  ``promtool check rules`` accepts the file and ``promtool test rules`` passes
  deploy/prometheus/herald-alerts.test.yml, whose healthy case lists every alert (none fires) and
  whose other cases make HeraldCredentialRejected and HeraldInstanceMissing (among others) fire.

Herald prints ``# HELP``/``# TYPE`` for every family at start, with every label set it knows
(counters at 0), so one scrape of an idle daemon sees them all. The two credential families
(``CREDENTIAL_METRICS``) are accepted when the daemon exports them or when a Swift source under
Sources/ declares them (a binary built before they were added).

promtool comes from Debian's ``prometheus`` package, the YAML reader from ``python3-yaml``
(``make deps`` installs both); without them the checks fail, they are never skipped.

Run: HERALD_BIN=.build/debug/herald .venv/bin/python -m pytest -q -p no:cacheprovider \
        Tests/reliability/test_dashboards.py
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from herald_fixtures import REPO, Daemon, parse_metrics

DASHBOARD = REPO / "deploy" / "grafana" / "herald-dashboard.json"
RULES = REPO / "deploy" / "prometheus" / "herald-alerts.yml"
RULES_TEST = REPO / "deploy" / "prometheus" / "herald-alerts.test.yml"

# Series the queries may read that Herald does not export: Prometheus's own, per target.
PROMETHEUS_SERIES = {"up": set()}
# Labels Prometheus adds to every series of a target.
TARGET_LABELS = {"job", "instance"}
# Families that may be declared in Sources/ and not yet exported by the binary under test, with
# the labels they carry.
CREDENTIAL_METRICS = {
    "herald_credential_ok": {"app", "platform"},
    "herald_credential_last_success_seconds": {"app", "platform"},
}
# What ``Exported.labels_of`` answers for a family exported with no sample yet.
ANY_LABELS: set[str] = set()
# Families the daemon exports that the dashboard need not show (none so far).
NOT_ON_DASHBOARD: set[str] = set()

PROMQL_KEYWORDS = {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left",
                   "group_right", "offset", "inf", "nan", "atan2"}


# ----------------------------------------------------------------------------- PromQL

def _strip_strings(text: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', text)


def promql_names(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """The series an expression reads, each with the label names its matchers use, and the label
    names of its grouping clauses (by, without, on, ignoring, group_left/right). Grafana variables
    (``$instance``, ``${x}``, ``$__rate_interval``) are allowed where PromQL takes a string or a
    range. AssertionError for a selector without a metric name."""
    text = re.sub(r"\$\{[^}]*\}|\$\w+", "x", expr)
    selectors: list[tuple[str, set[str]]] = []
    selector = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{((?:[^{}"]|"(?:[^"\\]|\\.)*")*)\}')

    def take(m):
        assert m.group(1), f"a selector without a metric name in {expr!r}"
        body = _strip_strings(m.group(2))
        selectors.append((m.group(1), set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", body))))
        return " __selector__ "

    text = selector.sub(take, text)
    text = _strip_strings(text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    grouping: set[str] = set()

    def group(m):
        grouping.update(x.strip() for x in m.group(2).split(",") if x.strip())
        return " "

    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", group, text)
    text = re.sub(r"\boffset\s+-?\w+|@\s*\S+", " ", text)
    it = iter(selectors)
    out: list[tuple[str, set[str]]] = []
    for m in re.finditer(r"(?<![\w.])[a-zA-Z_:][a-zA-Z0-9_:]*", text):
        word = m.group(0)
        if word == "__selector__":
            out.append(next(it))
            continue
        if word in PROMQL_KEYWORDS or re.match(r"\s*\(", text[m.end():]):
            continue
        out.append((word, set()))
    return out, grouping


def test_promql_names_reads_what_it_should():
    series, grouping = promql_names(
        'histogram_quantile(0.99, sum by (platform, le) (rate(herald_send_duration_seconds_bucket'
        '{job=~"$job", instance=~"$instance"}[$__rate_interval]))) / on (job) group_left x_total '
        'and up == 0 offset 5m unless vector(1e3)')
    assert series == [("herald_send_duration_seconds_bucket", {"job", "instance"}), ("x_total", set()),
                      ("up", set())]
    assert grouping == {"platform", "le", "job"}
    with pytest.raises(AssertionError):
        promql_names('{__name__="herald_ready"}')


def variable_queries(dashboard: dict) -> list[tuple[str, str, str | None]]:
    """(variable name, PromQL expression, label it lists or None) of every query variable."""
    out = []
    for v in dashboard.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        texts = {q["query"] if isinstance(q, dict) else q, v.get("definition")} - {None, ""}
        assert texts, f"variable {v['name']} has no query"
        for text in texts:
            m = re.fullmatch(r"\s*label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)\s*", text)
            if m:
                out.append((v["name"], m.group(1), m.group(2)))
                continue
            m = re.fullmatch(r"\s*query_result\((.*)\)\s*", text)
            assert m, f"variable {v['name']}: {text!r} is neither label_values(...) nor query_result(...)"
            out.append((v["name"], m.group(1), None))
    return out


def panels_of(dashboard: dict):
    for p in dashboard["panels"]:
        yield p
        yield from p.get("panels", [])


def dashboard_queries(dashboard: dict) -> list[tuple[str, str, str | None]]:
    """(where, expression, label listed) of every panel target and template variable."""
    out = []
    for p in panels_of(dashboard):
        for t in p.get("targets", []):
            out.append((f"panel {p['title']!r} target {t.get('refId')}", t.get("expr", ""), None))
    for name, expr, label in variable_queries(dashboard):
        out.append((f"variable ${name}", expr, label))
    return out


# ----------------------------------------------------------------------------- files

def load_yaml(path: Path):
    try:
        import yaml
        return yaml.safe_load(path.read_text())
    except ImportError:
        pass
    # The venv has no PyYAML; Debian's python3-yaml serves the system interpreter.
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else shutil.which("python3")
    r = subprocess.run([python or "python3", "-c",
                        "import json, sys, yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
                        str(path)], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        pytest.fail(f"cannot read {path} as YAML ({r.stderr.strip().splitlines()[-1:]}): install Debian's "
                    f"python3-yaml (apt-get install python3-yaml; `make deps` installs it)")
    return json.loads(r.stdout)


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        pytest.fail("promtool not found on PATH: install Debian's prometheus package "
                    "(apt-get install prometheus; `make deps` installs it)")
    return path


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def rules() -> list[dict]:
    doc = load_yaml(RULES)
    return [r for g in doc["groups"] for r in g["rules"]]


def declared_in_sources() -> set[str]:
    """Metric family names written as string literals in Sources/**/*.swift."""
    names = set()
    for path in (REPO / "Sources").rglob("*.swift"):
        names.update(re.findall(r'"(herald_[a-z0-9_]+)"', path.read_text(errors="replace")))
    return names


class Exported:
    """The families a real daemon exports ({name: type}) and the label names of their samples."""

    def __init__(self, texts: list[str]):
        self.families: dict[str, str] = {}
        self.labels: dict[str, set[str]] = {}
        for text in texts:
            m = parse_metrics(text)
            self.families.update(m.families)
            for (name, labels) in m:
                family = m.family_of(name)
                assert family, f"sample {name} of no declared family"
                self.labels.setdefault(family, set()).update(k for k, _ in labels)
        # Families declared with no sample yet: their label names are unknown here.
        self.unsampled = {f for f in self.families if f not in self.labels}
        self.sources = declared_in_sources()

    def family(self, name: str) -> str | None:
        """The exported family a series name belongs to, or None."""
        if name in self.families:
            return name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and self.families.get(name[: -len(suffix)]) in ("histogram", "summary"):
                return name[: -len(suffix)]
        if name.endswith("_total") and self.families.get(name[: -len("_total")]) == "counter":
            return name[: -len("_total")]
        return None

    def labels_of(self, name: str) -> set[str] | None:
        """The label names a series carries (target labels included), ``ANY_LABELS`` for a family
        exported with no sample yet (other than ``CREDENTIAL_METRICS``, whose labels are known), or
        None when Herald exports no such series (nor declares one of ``CREDENTIAL_METRICS`` in
        Sources/)."""
        family = self.family(name)
        if family in self.unsampled:
            return CREDENTIAL_METRICS[name] | TARGET_LABELS if name in CREDENTIAL_METRICS else ANY_LABELS
        if family:
            extra = {"le"} if name.endswith("_bucket") else set()
            base = self.labels[family] - ({"le"} if not name.endswith("_bucket") else set())
            return base | extra | TARGET_LABELS
        if name in PROMETHEUS_SERIES:
            return PROMETHEUS_SERIES[name] | TARGET_LABELS
        if name in CREDENTIAL_METRICS and name in self.sources:
            return CREDENTIAL_METRICS[name] | TARGET_LABELS
        return None


@pytest.fixture(scope="module")
def exported() -> Exported:
    """A real daemon's /metrics (listener without app_figures: herald_transport_apps) and its
    system.metrics (every family, herald_transport_state per app)."""
    d = Daemon(metrics_listen="127.0.0.1:0", start=False)
    try:
        d.start()
        line = d.log_lines("metrics_listening")[0]
        port = int(re.search(r"address=127\.0\.0\.1:(\d+)", line).group(1))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            scraped = r.read().decode()
        over_socket = d.call("system.metrics")["text"]
        d.shutdown()
    finally:
        d.cleanup()
    e = Exported([scraped, over_socket])
    assert "herald_build_info" in e.families and len(e.families) > 30, sorted(e.families)
    return e


def check_queries(queries, exported: Exported) -> list[str]:
    """The problems of [(where, expression, label listed or None)]: unknown series, unknown labels."""
    problems = []
    for where, expr, listed in queries:
        if not expr.strip():
            problems.append(f"{where}: empty expression")
            continue
        series, grouping = promql_names(expr)
        if not series:
            problems.append(f"{where}: reads no series: {expr!r}")
        known: set[str] = set()
        unknown_labels = False
        for name, matched in series:
            labels = exported.labels_of(name)
            if labels is None:
                how = (" (declared nowhere in Sources/ either)" if name in CREDENTIAL_METRICS else "")
                problems.append(f"{where}: {name} is not a series Herald exports{how}")
                continue
            if labels is ANY_LABELS:
                unknown_labels = True
                continue
            known = known | labels
            if matched - labels:
                problems.append(f"{where}: {name} has no label {sorted(matched - labels)} "
                                f"(its labels: {sorted(labels)})")
        wanted = grouping | ({listed} if listed else set())
        if known and not unknown_labels and wanted - known:
            problems.append(f"{where}: groups by or lists {sorted(wanted - known)}, which none of "
                            f"{sorted(n for n, _ in series)} carries (labels: {sorted(known)})")
    return problems


# ----------------------------------------------------------------------------- the dashboard

def test_dashboard_is_a_grafana_dashboard(dashboard):
    assert dashboard["title"] and dashboard["uid"]
    assert dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables.get("datasource", {}).get("type") == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables.get("instance", {}).get("type") == "query"
    ids = [p["id"] for p in panels_of(dashboard)]
    assert len(ids) == len(set(ids)), f"panel ids repeat: {ids}"
    for p in panels_of(dashboard):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, f"{p['title']}: {g}"
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert p["targets"] and len(refs) == len(set(refs)), f"{p['title']}: refIds {refs}"
        for t in p["targets"]:
            assert t["datasource"] == p["datasource"], p["title"]


def test_dashboard_queries_only_what_herald_exports(dashboard, exported):
    queries = dashboard_queries(dashboard)
    assert len(queries) > 40
    problems = check_queries(queries, exported)
    assert not problems, "\n".join(problems)


def test_dashboard_shows_every_exported_family(dashboard, exported):
    used = set()
    for _, expr, _ in dashboard_queries(dashboard):
        used.update(exported.family(n) or n for n, _ in promql_names(expr)[0])
    missing = set(exported.families) - used - NOT_ON_DASHBOARD
    assert not missing, (f"families Herald exports that no dashboard panel shows: {sorted(missing)} "
                         f"(add a panel to {DASHBOARD.relative_to(REPO)}, or list them in NOT_ON_DASHBOARD)")
    for name in CREDENTIAL_METRICS:
        assert name in used, f"the dashboard does not show {name}"


# ----------------------------------------------------------------------------- the alerts

def test_alert_rules_query_only_what_herald_exports(rules, exported):
    assert all(r.get("alert") for r in rules), "recording rules are not expected in herald-alerts.yml"
    for r in rules:
        assert r["labels"]["severity"] in ("critical", "warning"), r["alert"]
        assert r["annotations"]["summary"] and r["annotations"]["description"], r["alert"]
    problems = check_queries([(f"alert {r['alert']}", r["expr"], None) for r in rules], exported)
    assert not problems, "\n".join(problems)
    names = {r["alert"] for r in rules}
    assert {"HeraldDown", "HeraldInstanceMissing", "HeraldNotReady", "HeraldQueueGrowing",
            "HeraldDeliverySuccessLow", "HeraldCredentialRejected", "HeraldCredentialNotProven",
            "HeraldTransportDegraded", "HeraldStoreHoldingResults"} <= names, sorted(names)


def test_promtool_checks_the_rules():
    r = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"promtool check rules failed:\n{r.stdout}{r.stderr}"
    assert "SUCCESS" in r.stdout, r.stdout


def test_promtool_rule_tests_pass_and_cover_every_alert(rules):
    alerts = {r["alert"] for r in rules}
    tests = load_yaml(RULES_TEST)["tests"]
    healthy = tests[0]["alert_rule_test"]
    assert {t["alertname"] for t in healthy} == alerts, \
        f"the healthy case must list every alert (missing: {sorted(alerts - {t['alertname'] for t in healthy})})"
    assert all(t["exp_alerts"] == [] for t in healthy), "the healthy case expects no alert"
    fired = {t["alertname"] for case in tests[1:] for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    assert {"HeraldCredentialRejected", "HeraldInstanceMissing"} <= fired, sorted(fired)

    r = subprocess.run([promtool(), "test", "rules", str(RULES_TEST)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, f"promtool test rules failed:\n{r.stdout}{r.stderr}"
    assert "SUCCESS" in r.stdout, r.stdout
