"""Class-data archives (Java's AppCDS) for the JVMs the tests start again and again.

A JVM that maps an archive of the classes a start loads skips loading and verifying them one
by one: on two cores a Kafka broker starts in ~3.5 s instead of ~5.5 s, and a local Spark
session in ~6.5 s instead of ~12 s (its first query ~3.5 s instead of ~7 s). ``scripts/bootstrap
--test-tools`` builds both archives once (:mod:`streaming.build_archives`; the broker's and the
driver's JVMs map them when present): a JVM started once lists the classes it loads, and
``-Xshare:dump`` archives them for that JVM's classpath. The JVM checks an archive against its
own classpath and options and, where they differ, loads its classes as usual: a stale archive
costs time, never correctness.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path


class ArchiveError(RuntimeError):
    """``-Xshare:dump`` failed; its output says why."""


def listing_option(listed: Path) -> str:
    """The JVM option that writes the classes a JVM loads to ``listed``, as they load."""
    return f"-XX:DumpLoadedClassList={listed}"


def sharing_options(archive: Path) -> list[str]:
    """The JVM options that map ``archive``, if it has been built."""
    return [f"-XX:SharedArchiveFile={archive}"] if archive.is_file() else []


def dump_archive(
    java: str, listed: Path, archive: Path, classpath: str, options: Sequence[str] = ()
) -> Path:
    """Archives the classes of ``listed`` for a JVM started with ``classpath`` and ``options``
    (those that decide what an archive holds: the garbage collector, added modules), replacing
    ``archive`` only once the new one is complete."""
    with tempfile.TemporaryDirectory(prefix="quotastream-archive-") as work:
        partial = Path(work) / archive.name
        command = [
            java,
            *options,
            "-Xshare:dump",
            f"-XX:SharedClassListFile={listed}",
            f"-XX:SharedArchiveFile={partial}",
            "-cp",
            classpath,
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ArchiveError(f"-Xshare:dump failed: {done.stdout}{done.stderr}".strip())
        archive.unlink(missing_ok=True)
        shutil.move(partial, archive)
    return archive
