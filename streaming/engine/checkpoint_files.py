"""How the query writes its checkpoint's files (offset log, commit log, state store deltas).

Spark writes each of them as a temporary file renamed into place, through a
``CheckpointFileManager``. Its default uses Hadoop's ``FileContext``, which on the local file
system, without Hadoop's native library (PySpark ships none), runs a process for each step it
cannot do in Java: ``readlink`` four times per rename (is the source or the target a symbolic
link?) and ``chmod`` for the file and its ``.crc``. Each costs ~10 ms from the JVM on this
machine, and a micro-batch writes at least four such files (two logs, a delta per state task):
24 processes, ~100-150 ms of every batch's fixed cost (docs/streaming.md).

For a local checkpoint the engine uses Spark's ``FileSystemBasedCheckpointFileManager`` instead:
the same temporary-file-and-rename protocol through Hadoop's ``FileSystem`` API, whose local
rename is one ``rename(2)`` (atomic on POSIX file systems, as the commit protocol needs) with no
link checks. The ``chmod`` of a new file remains (``RawLocalFileSystem.setPermission``). Other
file systems (HDFS, object stores) keep Spark's own choice, and an operator's
``spark.sql.streaming.checkpointFileManagerClass`` in ``spark.conf`` always wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql import SparkSession

#: Spark's (internal) setting naming the class that writes checkpoint files.
FILE_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
#: Writes through Hadoop's FileSystem API: a local rename without processes.
FILE_SYSTEM_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def choose_file_manager(
    spark: SparkSession, location: str, operator_conf: Mapping[str, str]
) -> str | None:
    """Sets the session's checkpoint file manager for a query checkpointed at ``location``
    (before it starts); returns the class set, or None where Spark's default applies."""
    if FILE_MANAGER_KEY in operator_conf:
        return operator_conf[FILE_MANAGER_KEY]
    if file_system_scheme(spark, location) == "file":
        spark.conf.set(FILE_MANAGER_KEY, FILE_SYSTEM_MANAGER)
        return FILE_SYSTEM_MANAGER
    # A session that ran a local query before must not carry its choice to this one.
    spark.conf.unset(FILE_MANAGER_KEY)
    return None


def file_system_scheme(spark: SparkSession, location: str) -> str:
    """The scheme of the file system Hadoop resolves ``location`` to: its own, or that of
    ``fs.defaultFS`` for a path without one (as Spark resolves a checkpoint location)."""
    jvm: Any = spark.sparkContext._jvm
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    scheme = jvm.org.apache.hadoop.fs.Path(location).toUri().getScheme()
    if scheme is None:
        scheme = jvm.org.apache.hadoop.fs.FileSystem.getDefaultUri(hadoop_conf).getScheme()
    return str(scheme)
