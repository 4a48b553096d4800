"""The Spark engine: the Kafka source, the two stages around the pure core, the sinks, the
query and its metrics (``docs/streaming.md``)."""
