"""Builds the class-data archives of the JVMs the tests start (:mod:`streaming.class_archive`),
the Kafka broker's and the local Spark driver's, where they are missing (a new Kafka or pyspark
release is archived anew). ``scripts/bootstrap --test-tools`` runs it::

    python -m streaming.build_archives
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from pyspark.sql import SparkSession

from streaming.class_archive import dump_archive, listing_option
from streaming.engine.job import driver_class_archive, local_spark
from streaming.engine.settings import EngineSettings
from streaming.kafka_broker import build_class_archive, class_archive, kafka_libs


def build_driver_class_archive() -> Path:
    """Starts a local Spark session once, runs a query through Python workers and Arrow (as
    the engine's do), and archives the classes its driver loaded as
    :func:`driver_class_archive`, for the driver's own classpath and added modules."""
    archive = driver_class_archive()
    archive.unlink(missing_ok=True)  # the listing driver must load its classes itself
    with tempfile.TemporaryDirectory(prefix="quotastream-classes-") as work:
        listed = Path(work) / "classes.lst"
        settings = EngineSettings()
        settings.spark.conf["spark.driver.extraJavaOptions"] = listing_option(listed)
        spark = local_spark(settings, "quotastream-class-listing")
        try:
            shards = spark.range(1000).selectExpr("id % 8 AS id")
            shards.groupBy("id").applyInPandas(_counted, "id long, rows long").collect()
            driver = driver_jvm(spark)
        finally:
            spark.stop()
        return dump_archive(driver.java, listed, archive, driver.classpath, driver.modules)


@dataclass(frozen=True)
class DriverJvm:
    """What decides whether an archive fits the driver's JVM, as that JVM has it."""

    java: str
    classpath: str  # as the launcher expanded it
    options: list[str]  # every option it was started with

    @property
    def modules(self) -> list[str]:
        """Its ``--add-modules`` options."""
        return [option for option in self.options if option.startswith("--add-modules")]


def driver_jvm(spark: SparkSession) -> DriverJvm:
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "a local session has its JVM here"
    system = jvm.java.lang.System
    options = list(
        jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    )
    return DriverJvm(
        java=f"{system.getProperty('java.home')}/bin/java",
        classpath=system.getProperty("java.class.path"),
        options=options,
    )


def _counted(rows: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"id": rows["id"].iloc[:1], "rows": [len(rows)]})


def main() -> None:
    if not class_archive(kafka_libs()).is_file():
        print(f"archived the Kafka broker's classes: {build_class_archive()}")
    if not driver_class_archive().is_file():
        print(f"archived the Spark driver's classes: {build_driver_class_archive()}")


if __name__ == "__main__":
    main()
