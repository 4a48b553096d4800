"""The admin commands (``quota``, ``enforcement``, ``replication``, ``lookup``) as an operator runs
them: a real broker holds the configuration log, a real Redis the decisions; no mocks."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pytest
import redis
import yaml

from quotastream.redis_contract import remote_log_key, remote_log_value
from state.config import load_quota_config
from state.live_config import DeleteClientQuota
from state.remote_log_view import RemoteLog, RetentionView
from streaming.commands.cli import main
from streaming.commands.exit_codes import EXIT_FAILURE, EXIT_UNREACHABLE
from streaming.engine.config_log import ConfigLog
from streaming.engine.sinks import SinkSettings, write_batches
from streaming.engine.stages import DECISION_SCHEMA
from streaming.services import LocalService, free_port
from tests.support.admin import write_settings
from tests.support.factories import decision_row


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


class Cli(Protocol):
    topic: str
    prefix: str
    engine: Path
    quotas: Path

    def __call__(self, *argv: str) -> Result: ...


@dataclass
class _Cli:
    capsys: pytest.CaptureFixture[str]
    engine: Path
    quotas: Path
    topic: str
    prefix: str

    def __call__(self, *argv: str) -> Result:
        self.capsys.readouterr()
        code = main([*argv, "--engine-config", str(self.engine)])
        captured = self.capsys.readouterr()
        return Result(code, captured.out, captured.err)


def new_environment(
    kafka: LocalService, redis_server: LocalService, directory: Path
) -> tuple[Path, Path, str]:
    """Settings on a config topic of their own (and a Redis key prefix of the same name)."""
    topic = f"admin-{uuid.uuid4().hex[:10]}"
    engine, quotas = write_settings(
        directory, kafka.address, (redis_server.host, redis_server.port), topic
    )
    # Created up front, as a running engine would have: reading a topic that does not exist yet
    # costs kafka-python a metadata retry (100 ms) per command.
    log = ConfigLog(kafka.address, topic)
    try:
        log.ensure_topic()
    finally:
        log.close()
    return engine, quotas, topic


@pytest.fixture
def cli(
    kafka: LocalService,
    redis_server: LocalService,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> Cli:
    """``quotastream ...`` in-process, on its own config topic and Redis key prefix."""
    engine, quotas, topic = new_environment(kafka, redis_server, tmp_path)
    return _Cli(capsys, engine, quotas, topic, topic)


@pytest.fixture(scope="module")
def shared_environment(
    kafka: LocalService, redis_server: LocalService, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, str]:
    return new_environment(kafka, redis_server, tmp_path_factory.mktemp("shared"))


@pytest.fixture
def refused(shared_environment: tuple[Path, Path, str], capsys: pytest.CaptureFixture[str]) -> Cli:
    """Like ``cli``, on one topic for the module: for commands that must write nothing."""
    engine, quotas, topic = shared_environment
    return _Cli(capsys, engine, quotas, topic, topic)


def version_of(cli: Cli) -> int:
    listed = cli("quota", "list", "--json")
    assert listed.code == 0, listed.err
    version: int = listed.json()["version"]
    return version


# ------------------------------------------------------------------------------------- quota set
def test_set_get_list_delete_round_trip(cli: Cli, kafka: LocalService) -> None:
    assert version_of(cli) == 0
    done = cli("quota", "set", "--user", "bob", "producer_byte_rate=1048576", "--by", "ops@test")
    assert (done.code, done.err) == (0, "")
    assert done.out.strip() == "version 1: set user=bob: producer_byte_rate=1048576.0"

    got = cli("quota", "get", "--user", "bob")
    assert got.out.splitlines() == ["user=bob (version 1)", "  producer_byte_rate=1048576"]
    assert cli("quota", "get", "--user", "bob", "--json").json() == {
        "version": 1,
        "entity": "user=bob",
        "values": {"producer_byte_rate": 1048576.0},
    }
    added = cli("quota", "set", "--user", "bob", "consumer_byte_rate=5e5")
    assert added.out.startswith("version 2:")
    listed = cli("quota", "list", "--json").json()
    assert listed["version"] == 2
    bob = next(c for c in listed["clients"] if c["entity"] == "user=bob")
    assert (bob["producer_byte_rate"], bob["consumer_byte_rate"]) == (1048576.0, 500000.0)

    # What the engine reads from the log is what the command wrote.
    log = ConfigLog(kafka.address, cli.topic)
    try:
        live = log.current(load_quota_config(cli.quotas))
    finally:
        log.close()
    assert live.version == 2
    entry = next(q for q in live.config.clients if q.entity == ("bob", None))
    assert (entry.producer_byte_rate, entry.consumer_byte_rate) == (1048576.0, 500000.0)

    removed = cli("quota", "delete", "--user", "bob", "producer_byte_rate")
    assert removed.out.strip() == "version 3: delete user=bob: producer_byte_rate"
    assert cli("quota", "get", "--user", "bob", "--json").json()["values"] == {
        "consumer_byte_rate": 500000.0
    }
    gone = cli("quota", "delete", "--user", "bob")
    assert gone.code == 0
    nothing = cli("quota", "get", "--user", "bob")
    assert (nothing.code, nothing.out.strip()) == (0, "no quota is set for user=bob (version 4)")

    history = cli("quota", "history", "--json").json()
    assert [h["version"] for h in history] == [1, 2, 3, 4]
    assert history[0]["by"] == "ops@test"
    assert "@" in history[1]["by"]  # $USER@hostname by default
    assert abs(history[0]["at_ms"] - time.time() * 1000) < 60_000
    text = cli("quota", "history", "--last", "1").out
    assert text.strip().endswith("delete user=bob: every key")


def test_list_shows_every_kind_of_entity(cli: Cli) -> None:
    cli("quota", "set", "--topic", "orders", "leader.replication.throttled.replicas=0:1,1:2")
    cli("enforcement", "shadow", "fetch")
    listed = cli("quota", "list")
    assert listed.code == 0
    lines = listed.out.splitlines()
    assert lines[0].startswith("version 2 (")
    assert any("user=alice,client-id=<default>" in line and "=300" in line for line in lines)
    assert any(line.strip().startswith("user=mirror ") and "exempt=true" in line for line in lines)
    assert any("broker 3" in line and "copy.max.bytes.per.second=900" in line for line in lines)
    assert any("topic orders" in line and "=0:1,1:2" in line for line in lines)
    assert lines[-1] == "enforcement: enabled; shadow: fetch"
    as_json = cli("quota", "list", "--json").json()
    assert as_json["topics"] == {"orders": {"leader.replication.throttled.replicas": "0:1,1:2"}}
    assert as_json["brokers"]["3"] == {"remote.log.manager.copy.max.bytes.per.second": 900.0}
    assert as_json["enforcement"] == {"enabled": True, "shadow": ["fetch"]}


def test_default_entities_and_broker_quotas(cli: Cli) -> None:
    both = cli(
        "quota", "set", "--user", "<default>", "--client-id", "<default>", "producer_byte_rate=10"
    )
    assert both.code == 0, both.err
    assert "user=<default>,client-id=<default>" in both.out
    only_client = cli("quota", "set", "--client-id", "<default>", "consumer_byte_rate=20")
    assert only_client.code == 0, only_client.err
    broker = cli("quota", "set", "--broker", "<default>", "follower.replication.throttled.rate=5")
    assert broker.code == 0, broker.err
    override = cli(
        "quota", "set", "--broker", "3", "remote.log.manager.fetch.max.bytes.per.second=77"
    )
    assert override.code == 0, override.err
    assert cli("quota", "get", "--broker", "3", "--json").json()["values"] == {
        "remote.log.manager.copy.max.bytes.per.second": 900.0,
        "remote.log.manager.fetch.max.bytes.per.second": 77.0,
    }
    deleted = cli(
        "quota", "delete", "--broker", "3", "remote.log.manager.copy.max.bytes.per.second"
    )
    assert deleted.code == 0, deleted.err
    assert "(removed)" in deleted.out
    assert list(cli("quota", "get", "--broker", "3", "--json").json()["values"]) == [
        "remote.log.manager.fetch.max.bytes.per.second"
    ]


def test_a_new_broker_needs_new_broker(cli: Cli) -> None:
    rejected = cli("quota", "set", "--broker", "7", "leader.replication.throttled.rate=100")
    assert rejected.code == 2
    assert "unknown broker 7" in rejected.err
    assert "--new-broker" in rejected.err
    assert "configured: <default>, 3" in rejected.err
    created = cli(
        "quota", "set", "--broker", "7", "leader.replication.throttled.rate=100", "--new-broker"
    )
    assert created.code == 0, created.err
    # Known from now on.
    again = cli("quota", "set", "--broker", "7", "follower.replication.throttled.rate=50")
    assert again.code == 0, again.err


def test_exempting_replaces_rates_and_a_rate_ends_the_exemption(cli: Cli) -> None:
    cli("quota", "set", "--user", "bob", "producer_byte_rate=100")
    assert cli("quota", "set", "--user", "bob", "exempt=true").code == 0
    assert cli("quota", "get", "--user", "bob", "--json").json()["values"] == {"exempt": True}
    assert cli("quota", "set", "--user", "bob", "consumer_byte_rate=9").code == 0
    assert cli("quota", "get", "--user", "bob", "--json").json()["values"] == {
        "consumer_byte_rate": 9.0
    }


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--user", "", "producer_byte_rate=1"], "--user must not be empty"),
        (["--client-id", "", "producer_byte_rate=1"], "--client-id must not be empty"),
        (["--user", "x" * 1025, "producer_byte_rate=1"], "entity names are at most 1024"),
        (["--user", "a", "producer_byte_rate=-5"], "producer_byte_rate=-5: must be > 0"),
        (["--user", "a", "consumer_byte_rate=0"], "consumer_byte_rate=0: must be > 0"),
        (["--user", "a", "producer_byte_rate=fast"], "not a number"),
        (["--user", "a", "producer_byte_rate=inf"], "finite"),
        (["--user", "a", "bogus=1"], "unknown key 'bogus' for user=a"),
        (["--user", "a", "producer_byte_rate"], "'producer_byte_rate' is not KEY=VALUE"),
        (["--user", "a", "=5"], "'=5' is not KEY=VALUE"),
        (["--user", "a", "producer_byte_rate=1", "producer_byte_rate=2"], "given twice"),
        (["--user", "a", "exempt=maybe"], "must be true or false"),
        (
            ["--user", "a", "exempt=true", "producer_byte_rate=5"],
            "refused, nothing written: after set user=a",
        ),
        (["--broker", "<default>", "producer_byte_rate=5"], "is a client key"),
        (["--user", "a", "leader.replication.throttled.rate=5"], "is a broker key"),
        (["--broker", "9", "leader.replication.throttled.rate=5"], "unknown broker 9"),
        (["--broker", "-1", "leader.replication.throttled.rate=5"], "is not a broker id"),
        (["--broker", "b1", "leader.replication.throttled.rate=5"], "is not a broker id"),
        (["--broker", "2147483648", "leader.replication.throttled.rate=5"], "is not a broker id"),
        (["--broker", "3", "--user", "a", "producer_byte_rate=5"], "name different entities"),
        (["producer_byte_rate=5"], "name an entity"),
        (["--user", "a", "--new-broker", "producer_byte_rate=1"], "--new-broker goes with"),
        (["--topic", "no spaces", "leader.replication.throttled.replicas=*"], "legal Kafka topic"),
        (["--topic", "t", "leader.replication.throttled.replicas=0-1"], "partition:broker"),
        (["--topic", "t", "leader.replication.throttled.replicas="], "is empty"),
    ],
)
def test_a_bad_set_is_refused_and_writes_nothing(
    refused: Cli, argv: list[str], message: str
) -> None:
    result = refused("quota", "set", *argv)
    assert result.code == 2, result
    assert result.err.startswith("quotastream: error: ")
    assert message in result.err
    assert result.out == ""
    assert refused("quota", "history").out.startswith("no changes in")  # nothing was written


def test_dry_run_validates_and_writes_nothing(cli: Cli) -> None:
    result = cli("quota", "set", "--user", "bob", "producer_byte_rate=5", "--dry-run")
    assert (result.code, result.out.strip()) == (
        0,
        "dry run, not written: set user=bob: producer_byte_rate=5.0",
    )
    assert version_of(cli) == 0
    rejected = cli(
        "quota", "set", "--user", "bob", "exempt=true", "producer_byte_rate=1", "--dry-run"
    )
    assert rejected.code == 2


# ---------------------------------------------------------------------------------- quota delete
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--user", "nobody"], "nothing to delete: no quota is set for user=nobody"),
        (["--user", "alice"], "no quota is set for user=alice"),  # alice,<default> is another
        (["--user", "alice", "--client-id", "<default>", "consumer_byte_rate"], "does not set"),
        (["--user", "alice", "--client-id", "<default>", "bogus"], "unknown key 'bogus'"),
        (["--broker", "5"], "no quota is set for broker 5"),
        (["--broker", "3", "leader.replication.throttled.rate"], "does not set"),
        (["--topic", "nothing-here"], "no quota is set for topic nothing-here"),
    ],
)
def test_deleting_nothing_is_an_error(refused: Cli, argv: list[str], message: str) -> None:
    result = refused("quota", "delete", *argv)
    assert result.code == 2, result
    assert message in result.err
    assert version_of(refused) == 0


def test_delete_topic_throttles(cli: Cli) -> None:
    cli(
        "quota",
        "set",
        "--topic",
        "orders",
        "leader.replication.throttled.replicas=*",
        "follower.replication.throttled.replicas=0:3",
    )
    assert (
        cli("quota", "delete", "--topic", "orders", "leader.replication.throttled.replicas").code
        == 0
    )
    assert cli("quota", "get", "--topic", "orders", "--json").json()["values"] == {
        "follower.replication.throttled.replicas": "0:3"
    }
    assert cli("quota", "delete", "--topic", "orders").code == 0
    assert cli("quota", "list", "--json").json()["topics"] == {}


# -------------------------------------------------------------------------------- quota describe
def test_describe_follows_kafka_precedence(cli: Cli) -> None:
    # alice: user=alice,client-id=<default> (level 2) beats user=<default> (level 6).
    alice = cli("quota", "describe", "--user", "alice", "--client-id", "app", "--json").json()
    produce = alice["client"]["quotas"]["produce"]
    assert (produce["limit"], produce["level"], produce["from"]) == (
        300.0,
        2,
        "user=alice,client-id=<default>",
    )
    assert (produce["exempt"], produce["mode"]) == (False, "enforced")
    assert produce["counter"] == "user=alice,client-id=app,broker=N"
    # alice sets no fetch quota at levels 1-5: user=<default> (level 6) applies, per user.
    fetch = alice["client"]["quotas"]["fetch"]
    assert (fetch["limit"], fetch["level"], fetch["from"]) == (3000.0, 6, "user=<default>")
    assert fetch["counter"] == "user=alice,broker=N"

    # A client-id quota (level 7) loses to user=<default> (level 6) ...
    cli("quota", "set", "--client-id", "app", "producer_byte_rate=50")
    bob = cli("quota", "describe", "--user", "bob", "--client-id", "app", "--json").json()
    assert bob["client"]["quotas"]["produce"]["level"] == 6
    # ... until the defaults go: then it applies, shared by every user of that client-id.
    cli("quota", "delete", "--user", "<default>")
    bob = cli("quota", "describe", "--user", "bob", "--client-id", "app", "--json").json()
    produce = bob["client"]["quotas"]["produce"]
    assert (produce["limit"], produce["level"], produce["from"]) == (50.0, 7, "client-id=app")
    assert produce["counter"] == "client-id=app,broker=N"
    fetch = bob["client"]["quotas"]["fetch"]
    assert (fetch["limit"], fetch["level"], fetch["from"]) == (None, 0, None)

    text = cli("quota", "describe", "--user", "bob", "--client-id", "app", "--broker", "2")
    assert text.code == 0
    assert text.out.splitlines()[0] == "user=bob, client-id=app (version 2)"
    assert "produce: 50 B/s, level 7 (client-id=app), exempt: no, mode: enforced" in text.out
    assert "counter: client-id=app,broker=2" in text.out
    assert "fetch: unlimited, no level sets it" in text.out


def test_describe_an_exempt_entity_and_a_more_specific_quota(cli: Cli) -> None:
    found = cli("quota", "describe", "--user", "mirror", "--client-id", "mm2", "--json").json()
    produce = found["client"]["quotas"]["produce"]
    assert (produce["exempt"], produce["mode"], produce["level"], produce["limit"]) == (
        True,
        "exempt",
        3,
        None,
    )
    # Exempt at its own level (3): the more specific user=mirror,client-id=special still applies.
    special = cli(
        "quota", "describe", "--user", "mirror", "--client-id", "special", "--json"
    ).json()
    produce = special["client"]["quotas"]["produce"]
    assert (produce["exempt"], produce["mode"], produce["level"], produce["limit"]) == (
        False,
        "enforced",
        1,
        700.0,
    )
    assert special["client"]["quotas"]["fetch"]["exempt"] is True  # 'special' sets no fetch rate
    text = cli("quota", "describe", "--user", "mirror", "--client-id", "mm2").out
    assert "produce: unlimited (exempt), level 3 (user=mirror), exempt: yes, mode: exempt" in text


def test_describe_a_broker(refused: Cli) -> None:
    found = refused("quota", "describe", "--broker", "3", "--json").json()["broker"]["quotas"]
    assert found["remote_copy"]["limit"] == 900.0
    assert found["remote_copy"]["from"] == "override"
    assert (found["leader_replication"]["limit"], found["leader_replication"]["from"]) == (
        1500.0,
        "default",
    )
    assert (found["remote_fetch"]["limit"], found["remote_fetch"]["from"]) == (None, None)
    other = refused("quota", "describe", "--broker", "4", "--json").json()["broker"]
    assert other["has_override"] is False
    assert other["quotas"]["remote_copy"] == {
        "key": "remote.log.manager.copy.max.bytes.per.second",
        "limit": 4000.0,
        "from": "default",
        "cluster": False,
        "mode": "enforced",
    }
    text = refused("quota", "describe", "--broker", "3").out
    assert (
        "remote_copy (remote.log.manager.copy.max.bytes.per.second): 900 B/s from broker 3's "
        "override, mode: enforced" in text
    )
    assert (
        "remote_fetch (remote.log.manager.fetch.max.bytes.per.second): unlimited (not set)" in text
    )


def test_describe_a_client_id_alone_as_kafka_configs_does(cli: Cli) -> None:
    """``kafka-configs --describe --entity-type clients --entity-name special`` works, so does
    ours: what applies to that client-id's clients of any user without a quota of its own, and
    the users that have one."""
    found = cli("quota", "describe", "--client-id", "special", "--json")
    assert found.code == 0, found.err
    client = found.json()["client"]
    assert (client["user"], client["client_id"]) == (None, "special")
    produce = client["quotas"]["produce"]
    # Any other user's: user=<default> (level 6), one counter per user.
    assert (produce["limit"], produce["level"], produce["from"], produce["counter"]) == (
        2000.0,
        6,
        "user=<default>",
        "user=U,broker=N",
    )
    own = {o["user"]: (o["limit"], o["level"], o["from"]) for o in produce["own_quotas"]}
    assert own == {
        "alice": (300.0, 2, "user=alice,client-id=<default>"),
        "mirror": (700.0, 1, "user=mirror,client-id=special"),
    }
    # mirror is exempt for fetch at its own level (3); alice sets no fetch rate.
    fetch_own = client["quotas"]["fetch"]["own_quotas"]
    assert [(o["user"], o["exempt"], o["level"]) for o in fetch_own] == [("mirror", True, 3)]
    kafkas = cli(
        "quota", "describe", "--entity-type", "clients", "--entity-name", "special", "--json"
    )
    assert (kafkas.code, kafkas.json()) == (0, found.json())

    text = cli("quota", "describe", "--client-id", "special").out.splitlines()
    assert text[0] == "client-id=special, any user without a quota of its own (version 0)"
    assert text[1].startswith("  produce: 2000 B/s, level 6 (user=<default>), exempt: no")
    assert text[2] == (
        "    but user=alice: 300 B/s, level 2 (user=alice,client-id=<default>), exempt: no, "
        "mode: enforced, counter: user=alice,client-id=special,broker=N "
        "(one counter per (user, client-id))"
    )

    # A client-id quota (level 7) applies once no user level does: shared by all its users.
    cli("quota", "set", "--client-id", "app", "producer_byte_rate=50")
    cli("quota", "delete", "--user", "<default>")
    app = cli("quota", "describe", "--client-id", "app", "--broker", "2", "--json").json()
    produce = app["client"]["quotas"]["produce"]
    assert (produce["limit"], produce["level"], produce["counter"]) == (
        50.0,
        7,
        "client-id=app,broker=2",
    )
    assert [o["user"] for o in produce["own_quotas"]] == ["alice", "mirror"]
    assert app["broker"]["broker"] == 2


def test_describe_a_user_alone(refused: Cli) -> None:
    """``--user`` alone: that user's clients of any client-id without a quota of its own."""
    found = refused("quota", "describe", "--user", "mirror", "--json")
    assert found.code == 0, found.err
    produce = found.json()["client"]["quotas"]["produce"]
    assert (produce["exempt"], produce["level"], produce["from"], produce["counter"]) == (
        True,
        3,
        "user=mirror",
        "user=mirror,broker=N",
    )
    own = {o["client_id"]: (o["limit"], o["level"]) for o in produce["own_quotas"]}
    assert own == {"special": (700.0, 1)}
    assert found.json()["client"]["quotas"]["fetch"]["own_quotas"] == []
    text = refused("quota", "describe", "--user", "mirror").out.splitlines()
    assert text[0] == "user=mirror, any client-id without a quota of its own (version 0)"
    assert "    but client-id=special: 700 B/s, level 1 (user=mirror,client-id=special)" in (
        "\n".join(text)
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "describe what"),
        (["--broker", "<default>"], "--broker needs a broker id"),
        (["--broker", "x"], "is not a broker id"),
        (["--user", "", "--client-id", "c"], "--user must not be empty"),
    ],
)
def test_describe_errors(refused: Cli, argv: list[str], message: str) -> None:
    result = refused("quota", "describe", *argv)
    assert result.code == 2
    assert message in result.err


# ----------------------------------------------------------------------------------- enforcement
def test_enforcement_switches(cli: Cli) -> None:
    status = cli("enforcement", "status", "--json").json()
    assert status == {
        "version": 0,
        "enabled": True,
        "shadow": [],
        "modes": dict.fromkeys(
            [
                "produce",
                "fetch",
                "remote_copy",
                "remote_fetch",
                "leader_replication",
                "follower_replication",
            ],
            "enforced",
        ),
    }
    shadow = cli("enforcement", "shadow", "produce", "remote_copy")
    assert (
        shadow.out.strip()
        == "version 1: set enforcement: shadow.produce=True, shadow.remote_copy=True"
    )
    again = cli("enforcement", "shadow", "produce")
    assert (again.code, version_of(cli)) == (0, 1)
    assert "already in shadow mode" in again.out
    assert cli("enforcement", "status", "--json").json()["modes"]["produce"] == "shadow"

    assert cli("enforcement", "disable").out.strip() == "version 2: set enforcement: enabled=False"
    status_text = cli("enforcement", "status").out.splitlines()
    assert status_text[0] == "enforcement: DISABLED (no decision binds) (version 2)"
    assert "  produce: disabled (shadow once enabled)" in status_text
    assert "  fetch: disabled" in status_text
    described = cli("quota", "describe", "--user", "mirror", "--client-id", "x", "--json").json()
    assert described["client"]["quotas"]["produce"]["mode"] == "disabled"
    assert "already disabled" in cli("enforcement", "disable").out

    assert cli("enforcement", "enable").code == 0
    assert cli("enforcement", "unshadow", "produce").code == 0
    modes = cli("enforcement", "status", "--json").json()["modes"]
    assert (modes["produce"], modes["remote_copy"]) == ("enforced", "shadow")
    assert "already out of shadow mode" in cli("enforcement", "unshadow", "fetch").out
    assert version_of(cli) == 4


def test_shadowing_an_unknown_quota_type_is_refused(refused: Cli) -> None:
    result = refused("enforcement", "shadow", "produce", "bandwidth")
    assert result.code == 2
    assert "unknown quota type 'bandwidth' (one of produce, fetch, remote_copy" in result.err
    assert refused("enforcement", "unshadow", "Produce").code == 2
    assert version_of(refused) == 0


# ----------------------------------------------------------------------------------- replication
THROTTLE = [
    "replication",
    "throttle",
    "--topic",
    "orders",
    "--leader-replicas",
    "0:1,1:2",
    "--follower-replicas",
    "0:3",
    "--brokers",
    "1,2,3",
    "--partitions-moved",
    "10",
    "--total-partitions",
    "40",
    "--log-size-per-broker",
    "100000000000",
    "--max-bytes-in",
    "2000000",
]


def test_replication_throttle_sets_lists_and_rates_and_estimates(cli: Cli) -> None:
    result = cli(
        *THROTTLE, "--rate", "10000000", "--network", "12000000", "--replication-factor", "3"
    )
    assert (result.code, result.err) == (0, "")
    lines = result.out.splitlines()
    assert lines[0] == (
        "version 1: set topic orders: leader.replication.throttled.replicas='0:1,1:2', "
        "follower.replication.throttled.replicas='0:3'"
    )
    assert [line.split(":")[0] for line in lines[1:4]] == ["version 2", "version 3", "version 4"]
    assert "set broker 1: leader.replication.throttled.rate=10000000.0, " in lines[1]
    assert "MoveRatio: 0.25" in lines
    # 0.25 x 100 GB x 3 brokers / (10 MB/s - 2 MB/s) = 9375 s
    assert "MoveTime: 9375 s (2h36m15s) at 8000000 B/s spare (rate - max BytesIn)" in lines
    assert "bound IN < T < N - IN/R: 2000000 < 10000000 < 11333333.333: holds" in lines
    listed = cli("quota", "list", "--json").json()
    assert listed["topics"]["orders"] == {
        "leader.replication.throttled.replicas": "0:1,1:2",
        "follower.replication.throttled.replicas": "0:3",
    }
    for broker in ("1", "2"):
        assert listed["brokers"][broker] == {
            "leader.replication.throttled.rate": 10000000.0,
            "follower.replication.throttled.rate": 10000000.0,
        }
    assert listed["brokers"]["3"]["remote.log.manager.copy.max.bytes.per.second"] == 900.0

    removed = cli("replication", "throttle", "--topic", "orders", "--remove", "--brokers", "1,2,3")
    assert removed.code == 0, removed.err
    assert len(removed.out.splitlines()) == 4
    listed = cli("quota", "list", "--json").json()
    assert "orders" not in listed["topics"]
    assert set(listed["brokers"]) == {"<default>", "3"}
    assert listed["brokers"]["3"] == {"remote.log.manager.copy.max.bytes.per.second": 900.0}
    nothing = cli("replication", "throttle", "--topic", "orders", "--remove", "--brokers", "1")
    assert nothing.code == 2
    assert "nothing to remove" in nothing.err


def test_replication_throttle_on_default_with_a_broker_count(cli: Cli) -> None:
    argv = [a for a in THROTTLE if a not in {"--brokers", "1,2,3"}]
    missing = cli(*argv, "--rate", "3000000")
    assert missing.code == 2
    assert "--broker-count" in missing.err
    done = cli(*argv, "--rate", "3000000", "--broker-count", "6")
    assert done.code == 0, done.err
    assert "set broker <default>: leader.replication.throttled.rate=3000000.0" in done.out
    assert "MoveTime: 150000 s (41h40m00s)" in done.out


@pytest.mark.parametrize(
    ("rate", "network", "side"),
    [
        ("1500000", "100000000", "is not above the inbound rate IN = 2000000 B/s (lower side"),
        ("2000000", "100000000", "is not above the inbound rate IN = 2000000 B/s (lower side"),
        ("11500000", "12000000", "is not below N - IN/R = 11333333.333 B/s (upper side"),
    ],
)
def test_replication_throttle_warns_when_the_bound_breaks(
    cli: Cli, rate: str, network: str, side: str
) -> None:
    result = cli(*THROTTLE, "--rate", rate, "--network", network, "--replication-factor", "3")
    assert result.code == 0
    warnings = [line for line in result.err.splitlines() if "IN < T < N - IN/R" in line]
    assert len(warnings) == 1
    assert warnings[0].startswith("quotastream: WARNING: ")
    assert side in warnings[0]
    assert "BROKEN" in result.out


def test_a_throttle_at_or_below_bytes_in_never_completes(cli: Cli) -> None:
    result = cli(*THROTTLE, "--rate", "2000000")
    assert result.code == 0
    assert "MoveTime: never (the move never completes: the rate (2000000 B/s) is not above " in (
        result.out
    )
    assert "quotastream: WARNING: the move never completes" in result.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate", "-1"], "--rate must be > 0"),
        (["--rate", "fast"], "--rate 'fast' is not a number"),
        ([], "--rate is required"),
        (["--rate", "5", "--network", "100"], "also needs --replication-factor"),
        (["--rate", "5", "--total-partitions", "0"], "total partition count must be > 0"),
        (["--rate", "5", "--partitions-moved", "50"], "between 0 and the total (40)"),
        (["--rate", "5", "--network", "9", "--replication-factor", "0"], "factor must be >= 1"),
        (["--rate", "5", "--brokers", "1,2,9"], "unknown broker 9"),
        (["--rate", "5", "--remove"], "--remove takes only --topic and --brokers"),
    ],
)
def test_replication_throttle_errors(refused: Cli, argv: list[str], message: str) -> None:
    args = list(THROTTLE)
    for option in ("--partitions-moved", "--total-partitions", "--brokers"):
        if option in argv:
            position = args.index(option)
            del args[position : position + 2]
    result = refused(*args, *argv)
    assert result.code == 2, result
    assert message in result.err
    assert version_of(refused) == 0


def test_replication_throttle_needs_replicas_and_a_legal_topic(cli: Cli) -> None:
    no_lists = cli("replication", "throttle", "--topic", "orders", "--rate", "5")
    assert (no_lists.code, "--leader-replicas and/or --follower-replicas" in no_lists.err) == (
        2,
        True,
    )
    bad_topic = cli(
        "replication", "throttle", "--topic", "a/b", "--rate", "5", "--leader-replicas", "*"
    )
    assert (bad_topic.code, "legal Kafka topic name" in bad_topic.err) == (2, True)
    new_broker = cli(
        "replication", "throttle", "--topic", "t", "--rate", "5", "--leader-replicas", "*",
        "--brokers", "8", "--new-broker",
    )  # fmt: skip
    assert new_broker.code == 0, new_broker.err


def test_a_missing_required_option_is_a_usage_error(cli: Cli) -> None:
    with pytest.raises(SystemExit) as exited:
        cli("replication", "throttle", "--rate", "5")
    assert exited.value.code == 2


# ---------------------------------------------------------------------------------------- lookup
def write_decision(redis_server: LocalService, prefix: str, entity: str, **row: Any) -> int:
    now = int(time.time() * 1000)
    values = decision_row(entity, now, 60_000, rate=450.0, limit=300.0) | row
    batch = pa.RecordBatch.from_pylist([values], schema=DECISION_SCHEMA)
    settings = SinkSettings.local(redis_server.host, redis_server.port, key_prefix=prefix)
    (counts,) = write_batches(iter([batch]), settings)
    assert counts.to_pylist() == [{"decisions": 1, "rejects": 0}]
    return now


def test_lookup_prints_what_the_agent_sees(cli: Cli, redis_server: LocalService) -> None:
    # alice's produce quota is user=alice,client-id=<default> (level 2): a per-pair counter.
    entity = "user=alice,client-id=app,broker=1"
    now = write_decision(redis_server, cli.prefix, entity)
    client = [
        "lookup",
        "--quota",
        "produce",
        "--user",
        "alice",
        "--client-id",
        "app",
        "--broker",
        "1",
    ]
    found = cli(*client, "--json").json()
    assert found["key"] == f"{cli.prefix}:produce:{entity}"
    assert found["resolved_at_version"] == 0
    decision = found["decision"]
    assert (decision["entity"], decision["throttle_ms"], decision["until"]) == (
        entity,
        60_000,
        now + 60_000,
    )
    assert (decision["enforced"], decision["mode"], decision["limit"]) == (True, "enforced", 300.0)
    assert 50_000 < found["throttle_ms_now"] <= 60_000

    text = cli(*client).out.splitlines()
    assert text[0] == f"key: {cli.prefix}:produce:{entity}"
    assert text[1] == "resolved with config version: 0"
    assert f'entity: "{entity}"' in text
    assert 'mode: "enforced"' in text
    assert text[-1].startswith("throttle_ms_now: ")

    by_key = cli("lookup", "--quota", "produce", "--entity", entity, "--json").json()
    assert by_key["decision"] == decision
    assert by_key["resolved_at_version"] is None


def test_lookup_of_a_shadow_decision_reports_no_delay_now(
    cli: Cli, redis_server: LocalService
) -> None:
    write_decision(redis_server, cli.prefix, "broker=3", quota="remote_copy", mode="shadow")
    found = cli("lookup", "--quota", "remote_copy", "--entity", "broker=3", "--json").json()
    assert (found["decision"]["mode"], found["decision"]["enforced"]) == ("shadow", False)
    assert found["decision"]["throttle_ms"] == 60_000
    assert found["throttle_ms_now"] == 0


def test_lookup_follows_the_live_configuration(cli: Cli, redis_server: LocalService) -> None:
    # A user quota (level 3) for bob: one counter per user, so the key drops the client-id.
    cli("quota", "set", "--user", "bob", "--client-id", "<default>", "producer_byte_rate=10")
    client = ["lookup", "--quota", "produce", "--user", "bob", "--client-id", "c", "--broker", "2"]
    assert cli(*client, "--json").json()["key"].endswith(":produce:user=bob,client-id=c,broker=2")
    cli("quota", "delete", "--user", "bob", "--client-id", "<default>")
    cli("quota", "set", "--user", "bob", "producer_byte_rate=10")
    found = cli(*client, "--json").json()
    assert found["key"].endswith(":produce:user=bob,broker=2")
    assert found["resolved_at_version"] == 3


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (b"{not json", "malformed"),
        (b"42", "Expected `object`"),
        (b'{"quota": "produce"}', "missing required field"),
        (b"x" * 3, "malformed"),
    ],
)
def test_lookup_of_a_value_that_is_not_a_decision_fails_in_one_line(
    refused: Cli, redis_server: LocalService, value: bytes, problem: str
) -> None:
    key = f"{refused.prefix}:produce:user=mallory,broker=1"
    redis.Redis(host=redis_server.host, port=redis_server.port).set(key, value)
    result = refused("lookup", "--quota", "produce", "--entity", "user=mallory,broker=1")
    assert result.code == EXIT_FAILURE
    assert result.err.startswith(f"quotastream: error: {key} does not hold a quotastream value: ")
    assert problem in result.err
    assert len(result.err.splitlines()) == 1


def test_lookup_without_a_decision(refused: Cli) -> None:
    result = refused("lookup", "--quota", "fetch", "--entity", "user=nobody,broker=1")
    assert result.code == 0
    assert result.out.splitlines() == [
        f"key: {refused.prefix}:fetch:user=nobody,broker=1",
        "no decision: the agent applies no throttle (throttle_ms_now: 0)",
    ]
    as_json = refused("lookup", "--quota", "fetch", "--entity", "user=nobody,broker=1", "--json")
    assert as_json.json()["decision"] is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--quota", "bandwidth", "--entity", "broker=1"], "unknown quota type 'bandwidth'"),
        (
            ["--quota", "remote_copy", "--user", "a", "--client-id", "c", "--broker", "1"],
            "not a client quota",
        ),
        (
            ["--quota", "produce", "--user", "a", "--client-id", "c"],
            "give --broker: produce is measured per broker (quota_types.produce.scope: broker)",
        ),
        (["--quota", "produce", "--user", "a", "--broker", "1"], "give --user, --client-id"),
        (["--user", "a", "--client-id", "c", "--broker", "1"], "give --quota (a decision)"),
        (["--topic", "orders"], "needs both --topic and --partition"),
        (
            ["--quota", "remote_copy", "--topic", "orders", "--partition", "1"],
            "--topic and --partition read a partition's remote log size, which has no --quota",
        ),
        (["--topic", "no way", "--partition", "1"], "'no way' is not a legal Kafka topic name"),
        (["--topic", "orders", "--partition", "-1"], "--partition '-1' is not a partition"),
        (["--quota", "produce", "--entity", "broker=1", "--user", "a"], "either --entity or"),
        (
            ["--quota", "produce", "--user", "a", "--client-id", "c", "--broker", "<default>"],
            "broker id",
        ),
        (["--quota", "produce", "--entity", "nonsense"], "'nonsense' is not an entity key"),
        (["--quota", "produce", "--entity", ""], "'' is not an entity key"),
        (["--quota", "produce", "--entity", "broker=1"], "'broker=1' is not an entity key"),
        (["--quota", "remote_copy", "--entity", "user=a"], "'user=a' is not an entity key"),
        (["--quota", "fetch", "--entity", "user=a,broker=x"], "broker must be a number"),
    ],
)
def test_lookup_errors(refused: Cli, argv: list[str], message: str) -> None:
    result = refused("lookup", *argv)
    assert result.code == 2
    assert message in result.err


def test_lookup_of_a_client_under_a_cluster_wide_quota_needs_no_broker(
    tmp_path: Path, redis_server: LocalService, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cluster-wide quota's counter names no broker, so neither does its lookup; a quota
    measured per broker still needs the client's broker, and says so."""
    prefix = f"cluster-{uuid.uuid4().hex[:8]}"
    quotas = {
        "quota_types": {"produce": {"scope": "cluster"}},
        "clients": [{"user": "<default>", "producer_byte_rate": 2000, "consumer_byte_rate": 30}],
    }
    # No configuration topic: the quota file is the live configuration, Kafka is never asked.
    engine, quotas_path = write_settings(
        tmp_path,
        "127.0.0.1:9",
        (redis_server.host, redis_server.port),
        None,
        quotas,
        redis={"key_prefix": prefix},
    )
    cli = _Cli(capsys, engine, quotas_path, "", prefix)
    now = write_decision(redis_server, prefix, "user=alice")
    found = cli("lookup", "--quota", "produce", "--user", "alice", "--client-id", "app", "--json")
    assert found.code == 0, found.err
    assert found.json()["key"] == f"{prefix}:produce:user=alice"
    assert found.json()["decision"]["until"] == now + 60_000
    # The broker a client is connected to does not change a cluster-wide counter.
    with_broker = cli(
        *("lookup", "--quota", "produce", "--user", "alice", "--client-id", "app"),
        *("--broker", "3", "--json"),
    )
    assert with_broker.json()["key"] == found.json()["key"]

    per_broker = cli("lookup", "--quota", "fetch", "--user", "alice", "--client-id", "app")
    assert per_broker.code == 2
    assert per_broker.err.strip() == (
        "quotastream: error: give --broker: fetch is measured per broker "
        "(quota_types.fetch.scope: broker), so the client's counter names the broker it is "
        "connected to"
    )


def test_lookup_of_a_partitions_remote_log_size(refused: Cli, redis_server: LocalService) -> None:
    """What ``QuotaClient.remote_log`` reads: the partition's KIP-852 sizes, in one GET."""
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    remote_log = RemoteLog(
        topic,
        3,
        400,
        {0: 200, 1: 300, 2: 100},
        [("a", 0, 100), ("b", 1, 100), ("c", 1, 100), ("d", 2, 100)],
        RetentionView(
            [(0, 0), (1, 100), (2, 150)],
            400,
            300,
            [("a", 100, True), ("b", 100, True), ("c", 100, False), ("d", 100, True)],
        ),
    )
    key = remote_log_key(refused.prefix, topic, 3)
    redis.Redis(host=redis_server.host, port=redis_server.port).set(
        key, remote_log_value(remote_log)
    )
    found = refused("lookup", "--topic", topic, "--partition", "3", "--json")
    assert found.code == 0, found.err
    assert found.json() == {"key": key, "remote_log": json.loads(remote_log_value(remote_log))}

    text = refused("lookup", "--topic", topic, "--partition", "3").out.splitlines()
    assert text[:4] == [f"key: {key}", f'topic: "{topic}"', "partition: 3", "total: 400"]
    assert 'epochs: {"0": 200, "1": 300, "2": 100}' in text

    # No key: the partition has no remote segments (the engine deletes the key with its last).
    none = refused("lookup", "--topic", topic, "--partition", "4")
    assert (none.code, none.out.splitlines()) == (
        0,
        [
            f"key: {remote_log_key(refused.prefix, topic, 4)}",
            "no remote segments: the partition's remote log size is 0",
        ],
    )
    as_json = refused("lookup", "--topic", topic, "--partition", "4", "--json").json()
    assert (as_json["remote_log"]["total"], as_json["remote_log"]["segments"]) == (0, [])


def test_lookup_of_a_remote_log_value_that_is_not_one_fails_in_one_line(
    refused: Cli, redis_server: LocalService
) -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    key = remote_log_key(refused.prefix, topic, 0)
    redis.Redis(host=redis_server.host, port=redis_server.port).set(key, b'{"topic": 1}')
    result = refused("lookup", "--topic", topic, "--partition", "0")
    assert result.code == EXIT_FAILURE
    assert result.err.startswith(f"quotastream: error: {key} does not hold a quotastream value")
    assert len(result.err.splitlines()) == 1


# ------------------------------------------------------------------------- servers and settings
def test_unreachable_kafka_exits_3_naming_the_server(
    tmp_path: Path, redis_server: LocalService, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{free_port()}"
    engine, _ = write_settings(
        tmp_path,
        address,
        (redis_server.host, redis_server.port),
        "admin-unreachable",
        kafka={"client": {"sasl_plain_password": "hunter2-secret"}},
    )
    started = time.monotonic()
    for argv in (
        ["quota", "set", "--user", "a", "producer_byte_rate=5"],
        ["enforcement", "status"],
    ):
        code = main([*argv, "--engine-config", str(engine), "--timeout", "0.3"])
        err = capsys.readouterr().err
        assert code == EXIT_UNREACHABLE, err
        assert err.startswith(f"quotastream: error: Kafka at {address}: ")
        assert "hunter2" not in err
    assert time.monotonic() - started < 10  # --timeout bounds the wait
    # Bad input is refused before Kafka is asked anything.
    bad = ["quota", "set", "--user", "a", "producer_byte_rate=-1"]
    assert main([*bad, "--engine-config", str(engine)]) == 2
    assert "must be > 0" in capsys.readouterr().err


def test_unreachable_redis_exits_3_naming_the_server(
    tmp_path: Path, kafka: LocalService, capsys: pytest.CaptureFixture[str]
) -> None:
    port = free_port()
    engine, _ = write_settings(
        tmp_path,
        kafka.address,
        ("127.0.0.1", port),
        "admin-no-redis",
        redis={"password": "redis-s3cret"},
    )
    code = main(
        [
            *("lookup", "--quota", "produce", "--entity", "user=a,broker=1"),
            *("--engine-config", str(engine), "--timeout", "1"),
        ]
    )
    err = capsys.readouterr().err
    assert code == EXIT_UNREACHABLE
    assert err.startswith(f"quotastream: error: Redis at 127.0.0.1:{port}: ")
    assert "s3cret" not in err


def test_bad_settings_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = main(["quota", "list", "--engine-config", str(tmp_path / "nope.yaml")])
    assert (missing, "nope.yaml: file not found" in capsys.readouterr().err) == (2, True)
    engine = tmp_path / "engine.yaml"
    engine.write_text(yaml.safe_dump({"quotas": str(tmp_path / "quotas.yaml")}))
    (tmp_path / "quotas.yaml").write_text("clients: [{user: a, producer_byte_rate: -1}]\n")
    assert main(["quota", "list", "--engine-config", str(engine)]) == 2
    assert "producer_byte_rate" in capsys.readouterr().err
    assert main(["quota", "list", "--engine-config", str(engine), "--timeout", "0"]) == 2
    assert "--timeout must be > 0" in capsys.readouterr().err


def test_without_a_config_topic_reads_the_file_and_refuses_changes(
    tmp_path: Path,
    kafka: LocalService,
    redis_server: LocalService,
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine, _ = write_settings(
        tmp_path, kafka.address, (redis_server.host, redis_server.port), None
    )
    assert main(["quota", "list", "--json", "--engine-config", str(engine)]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == 0
    code = main(
        ["quota", "set", "--user", "a", "producer_byte_rate=5", "--engine-config", str(engine)]
    )
    assert code == 2
    assert "kafka.config_topic is null" in capsys.readouterr().err


def test_environment_overrides_apply(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, kafka: LocalService
) -> None:
    other = f"{cli.topic}-env"
    monkeypatch.setenv("QUOTASTREAM_KAFKA__CONFIG_TOPIC", other)
    assert cli("quota", "set", "--user", "bob", "producer_byte_rate=5").code == 0
    monkeypatch.delenv("QUOTASTREAM_KAFKA__CONFIG_TOPIC")
    assert version_of(cli) == 0
    log = ConfigLog(kafka.address, other)
    try:
        assert log.end() == 1
    finally:
        log.close()


def test_a_change_made_invalid_by_another_is_reported_as_skipped(
    cli: Cli, kafka: LocalService
) -> None:
    # Written by something that did not validate it: the log keeps it, every reader skips it.
    log = ConfigLog(kafka.address, cli.topic)
    try:
        log.ensure_topic()
        log.append(DeleteClientQuota(user="ghost", at_ms=1, by="script"))
    finally:
        log.close()
    assert cli("quota", "set", "--user", "bob", "producer_byte_rate=5").code == 0
    history = cli("quota", "history")
    assert "     1  1970-01-01T00:00:00Z  script  delete user=ghost: every key  (SKIPPED: " in (
        history.out
    )
    listed = cli("quota", "list")
    assert "skipped: version 1: no quota is set for user=ghost" in listed.out
    assert cli("quota", "list", "--json").json()["skipped"] == [
        {"version": 1, "reason": "no quota is set for user=ghost"}
    ]


# ------------------------------------------------------------------------ kafka-configs.sh dialect
def test_kafka_configs_dialect_sets_several_keys_in_one_argument(cli: Cli) -> None:
    done = cli(
        *("quota", "set", "--entity-type", "users", "--entity-name", "bob"),
        *("--entity-type", "clients", "--entity-default"),
        "producer_byte_rate=1024,consumer_byte_rate=2048",
    )
    assert (done.code, done.err) == (0, "")
    got = cli("quota", "get", "--user", "bob", "--client-id", "<default>", "--output", "json")
    assert got.json()["values"] == {"producer_byte_rate": 1024.0, "consumer_byte_rate": 2048.0}

    lists = cli(
        *("quota", "set", "--entity-type", "topics", "--entity-name", "orders"),
        "--add-config",
        "leader.replication.throttled.replicas=[0:1,1:2],follower.replication.throttled.replicas=0:3",
    )
    assert lists.code == 0, lists.err
    assert cli("quota", "get", "--topic", "orders", "--json").json()["values"] == {
        "leader.replication.throttled.replicas": "0:1,1:2",
        "follower.replication.throttled.replicas": "0:3",
    }
    bare = cli("quota", "set", "--topic", "orders", "leader.replication.throttled.replicas=0:4,1:5")
    assert bare.code == 0, bare.err
    got_bare = cli("quota", "get", "--topic", "orders", "--json").json()["values"]
    assert got_bare["leader.replication.throttled.replicas"] == "0:4,1:5"

    broker = cli(
        *("quota", "set", "--entity-type", "brokers", "--entity-default"),
        "--add-config",
        "leader.replication.throttled.rate=100,follower.replication.throttled.rate=200",
    )
    assert broker.code == 0, broker.err
    removed = cli(
        *("quota", "delete", "--entity-type", "users", "--entity-name", "bob"),
        *("--entity-type", "clients", "--entity-default"),
        *("--delete-config", "producer_byte_rate,consumer_byte_rate"),
    )
    assert removed.code == 0, removed.err
    assert (
        cli("quota", "get", "--user", "bob", "--client-id", "<default>", "--json").json()["values"]
        == {}
    )


def test_describe_takes_kafka_entity_options(cli: Cli) -> None:
    ours = cli("quota", "describe", "--user", "alice", "--client-id", "app1", "--output", "json")
    kafkas = cli(
        *("quota", "describe", "--entity-type", "users", "--entity-name", "alice"),
        *("--entity-type", "clients", "--entity-name", "app1", "--json"),
    )
    assert ours.code == kafkas.code == 0, kafkas.err
    assert ours.json() == kafkas.json()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["set", "--entity-name", "bob", "producer_byte_rate=1"], "goes after the --entity-type"),
        (["set", "--entity-type", "users", "producer_byte_rate=1"], "needs --entity-name"),
        (
            ["set", "--user", "a", "--entity-type", "users", "--entity-name", "b", "x=1"],
            "--entity-type users and --user name the same thing",
        ),
        (
            ["describe", "--entity-type", "topics", "--entity-name", "t"],
            "this command takes no --topic",
        ),
        (["set", "--user", "bob"], "name what to set"),
        # A part without '=' continues the value before it (a bare list, as kafka-configs.sh).
        (["set", "--user", "bob", "producer_byte_rate=1,x"], "'1,x' is not a number"),
        (["set", "--user", "bob", "nonsense,producer_byte_rate=1"], "'nonsense' is not KEY=VALUE"),
        (["set", "--user", "bob", "producer_byte_rate=1,producer_byte_rate=2"], "given twice"),
        (["delete", "--user", "alice", "--delete-config", "producer_byte_rate,bogus"], "'bogus'"),
    ],
)
def test_kafka_dialect_errors(refused: Cli, argv: list[str], message: str) -> None:
    result = refused("quota", *argv)
    assert result.code == 2, result.err
    assert message in result.err


def test_output_json_is_the_json_flag(refused: Cli) -> None:
    for command in (["quota", "list"], ["quota", "history"], ["enforcement", "status"]):
        as_output = refused(*command, "--output", "json")
        as_flag = refused(*command, "--json")
        assert as_output.code == as_flag.code == 0
        assert as_output.json() == as_flag.json()
        table = refused(*command, "--output", "table")
        assert table.code == 0
        with pytest.raises(json.JSONDecodeError):
            json.loads(table.out)
