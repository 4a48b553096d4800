"""Redis ACL users: the engine writes its prefix, agents only read it (``docs/agents.md``).

The rule lists are what ``ACL SETUSER <name> <rules...>`` takes (Redis 7+: ``%R~`` read-only key
patterns). The docs and the tests use these functions, so they cannot drift apart.
"""

from __future__ import annotations

import hashlib

import redis

ENGINE_USER = "quotastream-engine"
AGENT_USER = "quotastream-agent"

#: What the sink sends (pipelined, without MULTI): decisions (``eval`` of a script that runs
#: ``set`` per key: the script's commands are checked against these rules too), the live
#: configuration (``eval`` of a script that runs ``get`` and ``set``), remote log sizes (``set``,
#: ``del``), timer counts (``hset``), release notices (``publish``); ``get`` for checks.
ENGINE_COMMANDS = ("set", "get", "del", "hset", "publish", "eval")
#: What ``QuotaClient`` sends: ``get`` (decisions, remote log sizes, the live configuration),
#: ``hgetall`` (timer counts), ``mget`` (several keys at once), and the pub/sub commands
#: ``wait_until_released`` uses.
AGENT_COMMANDS = (
    "get",
    "mget",
    "hgetall",
    "subscribe",
    "unsubscribe",
    "psubscribe",
    "punsubscribe",
)


def password_rule(password: str) -> str:
    """The ACL rule setting ``password``, as its SHA-256 (the secret is not stored in Redis)."""
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def engine_acl(prefix: str, password: str) -> list[str]:
    """The engine's user: read and write keys under ``{prefix}:``, publish release notices."""
    return [
        "reset",
        "on",
        password_rule(password),
        f"~{prefix}:*",
        f"&{prefix}:released:*",
        "-@all",
        *(f"+{command}" for command in ENGINE_COMMANDS),
    ]


def agent_acl(prefix: str, password: str) -> list[str]:
    """An agent's user: read keys under ``{prefix}:``, subscribe to release notices."""
    return [
        "reset",
        "on",
        password_rule(password),
        f"%R~{prefix}:*",
        f"&{prefix}:released:*",
        "-@all",
        *(f"+{command}" for command in AGENT_COMMANDS),
    ]


def setuser_command(user: str, rules: list[str]) -> str:
    """The ``ACL SETUSER`` line for ``redis-cli`` (or an ``aclfile``, after ``user``)."""
    return " ".join(["ACL", "SETUSER", user, *rules])


def set_user(client: redis.Redis, user: str, rules: list[str]) -> None:
    """Run ``ACL SETUSER`` (as an admin user) with ``rules``."""
    # redis-py leaves execute_command unannotated; acl_setuser() takes no raw rule list.
    client.execute_command("ACL", "SETUSER", user, *rules)  # type: ignore[no-untyped-call]
