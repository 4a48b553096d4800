"""What connects the engine to the traffic inside a cluster's brokers, which no proxy sees
(issue 28). So far: ``__remote_log_metadata``, the segment lifecycle Kafka's tiered storage
writes, decoded by Kafka's own schemas (:mod:`quotastream.brokers.remote_log_metadata`) and
turned into the engine's ``remote_segment`` events (:mod:`quotastream.brokers.segments`)."""
