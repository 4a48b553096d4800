"""``quotastream brokers``: what connects the engine to the traffic inside a cluster's brokers,
which no proxy sees (issue 28), and what applies its throttles there (``docs/brokers.md``).
One module per concern:

* :mod:`.remote_log_metadata`: ``__remote_log_metadata`` records, decoded by Kafka's own schemas;
* :mod:`.segments`: those records as the engine's ``remote_segment`` and ``remote_copy`` events;
* :mod:`.bridge`: the remote log bridge, from that topic to the events topic, from its position;
* :mod:`.lineage`: each tiered partition's leader-epoch lineage, as ``leader_epochs`` events;
* :mod:`.counters` and :mod:`.broker_metrics`: the brokers' JMX counters, scraped, as counts of
  remote fetch and replication bytes;
* :mod:`.throttles` and :mod:`.actuator`: Kafka's own replication and remote-copy throttle
  configs, set from the engine's configuration;
* :mod:`.settings`: the ``brokers:`` section (the cluster's login is
  :mod:`quotastream.agent_settings`', shared with the proxy).
"""
