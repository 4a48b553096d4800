"""The Spark job and command-line glue around the pure core in :mod:`state`."""
