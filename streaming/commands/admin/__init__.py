"""``quotastream quota | enforcement | replication | lookup``: the operator's commands.

In the spirit of ``kafka-configs.sh``: each change names one entity and the keys it sets or
removes, is validated against the current live configuration, and only then is appended to the
configuration log (``streaming.engine.config_log``), where the running engine picks it up. Reading
commands show the live configuration at its newest version. ``docs/operations.md`` is the guide.

Exit codes (``streaming/commands/exit_codes.py``): 0 done; 1 a value in Redis that is not the
engine's; 2 bad input or configuration (nothing written); 3 Kafka or Redis unreachable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Final

from state.configfile import ConfigError
from streaming.commands.admin.context import Admin
from streaming.commands.admin.entities import apply_kafka_entity_options
from streaming.commands.admin.errors import AdminError, bad
from streaming.commands.admin.parser import add_admin_commands
from streaming.commands.exit_codes import EXIT_UNREACHABLE, EXIT_USAGE

__all__ = ["ADMIN_COMMANDS", "add_admin_commands", "run_admin"]

ADMIN_COMMANDS: Final = frozenset({"quota", "enforcement", "replication", "lookup"})

Handler = Callable[[Admin], int]


def run_admin(args: argparse.Namespace) -> int:
    """Runs the admin command ``args`` names; prints errors and returns the exit code."""
    # Loaded here, not with the module: ``replay`` and ``run`` need neither client.
    import redis  # noqa: PLC0415
    from kafka.errors import KafkaError  # noqa: PLC0415

    from streaming.engine.config_log import ConfigLogError, MisshapenTopicError  # noqa: PLC0415

    handler: Handler = args.admin
    admin: Admin | None = None
    try:
        if args.timeout <= 0:
            raise bad(f"--timeout must be > 0, got {args.timeout:g}")
        apply_kafka_entity_options(args, getattr(args, "kafka_entities", None) or [])
        admin = Admin.load(args)
        return handler(admin)
    except AdminError as exc:
        return _fail(exc.code, exc.message, admin)
    except (ConfigError, MisshapenTopicError) as exc:
        return _fail(EXIT_USAGE, str(exc), admin)
    except (KafkaError, ConfigLogError) as exc:
        assert admin is not None
        where = admin.settings.kafka.bootstrap_servers
        return _fail(EXIT_UNREACHABLE, f"Kafka at {where}: {exc}", admin)
    except redis.RedisError as exc:
        assert admin is not None
        where = f"{admin.settings.redis.host}:{admin.settings.redis.port}"
        return _fail(EXIT_UNREACHABLE, f"Redis at {where}: {exc}", admin)
    finally:
        if admin is not None:
            admin.close()


def _fail(code: int, message: str, admin: Admin | None) -> int:
    if admin is not None:
        message = admin.scrub(message)
    print(f"quotastream: error: {message}", file=sys.stderr)
    return code
