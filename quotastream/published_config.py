"""The live configuration the engine decides with, published in Redis so that agents resolve a
client's counter as the engine does (``docs/redis.md``, ``docs/agents.md``).

The engine's sink writes it in the pipeline of the first decisions it makes with a configuration
version, before them: an agent that reads a decision made with a version can read that version's
configuration too. It is two keys, the document (run, version, configuration) and its identity
alone (run, version), so that agents notice a change by reading a few bytes.

A version is compared only within one run of the query (``run``): a micro-batch may report an
older version than the newest (a throttle released by a timer set under it) and must not replace
the newer one; a new run (a restart, perhaps with another quota file or configuration topic)
replaces whatever an earlier run published, whatever its version.
"""

from __future__ import annotations

from typing import Any

import msgspec
import redis

from quotastream.redis_contract import live_config_key, live_config_version_key
from state.live_config import LiveConfig, config_document


class PublishedVersion(msgspec.Struct, frozen=True):
    """Which configuration is published: the engine run that published it, and its version."""

    run: str
    version: int


class PublishedConfig(msgspec.Struct, frozen=True):
    """The document agents resolve clients with: ``config`` is the quota file's mapping
    (:func:`state.live_config.config_document`) with every live change up to ``version``."""

    run: str
    version: int
    config: dict[str, Any]

    @property
    def identity(self) -> PublishedVersion:
        return PublishedVersion(self.run, self.version)


#: KEYS: the version key, the document key. ARGV: run, version, the two values. Replaces the
#: published configuration unless this run already published a newer version; a value that is
#: not a version (another program's) is replaced.
_PUBLISH = """
local stored = redis.pcall('GET', KEYS[1])
if type(stored) == 'string' then
  local ok, current = pcall(cjson.decode, stored)
  if ok and type(current) == 'table' and current['run'] == ARGV[1]
      and type(current['version']) == 'number' and current['version'] > tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('SET', KEYS[2], ARGV[4])
redis.call('SET', KEYS[1], ARGV[3])
return 1
"""

_ENCODE = msgspec.json.Encoder().encode


def publish_arguments(prefix: str, live: LiveConfig, run: str) -> tuple[Any, ...]:
    """``EVAL``'s arguments that publish ``live`` as ``run``'s: the sink pipelines them before a
    batch's decisions, :func:`publish` sends them alone."""
    identity = PublishedVersion(run, live.version)
    document = PublishedConfig(run, live.version, config_document(live.config))
    keys = (live_config_version_key(prefix), live_config_key(prefix))
    return (_PUBLISH, len(keys), *keys, run, live.version, _ENCODE(identity), _ENCODE(document))


def publish(client: redis.Redis, prefix: str, live: LiveConfig, run: str) -> bool:
    """Publishes ``live`` now, as the sink does; False when ``run`` published a newer version."""
    return bool(client.eval(*publish_arguments(prefix, live, run)))
