"""Pure quota logic: Kafka-exact rolling rates, quota resolution and throttle decisions.

Nothing in this package knows about Spark, Kafka clients or Redis; the streaming job and the
``replay`` command both drive it through :class:`state.shard.Shard`.
"""
