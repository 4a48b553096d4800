"""``quotastream proxy``: a Kafka wire-protocol proxy in front of unmodified brokers.

It publishes every client's Produce and Fetch bytes as the broker counts them, and holds each
client by the engine's decision as a broker holds it (``docs/proxy.md``). One module per concern,
as Kroxylicious keeps one filter per concern:

* :mod:`.wire`: frames and the few message fields the proxy reads (kafka-python's codecs);
* :mod:`.routing`: which broker a port leads to, and every broker address clients are told;
* :mod:`.identity`: who a connection is (client-id, SASL principal);
* :mod:`.usage`: the bytes counted, summed and published to the events topic;
* :mod:`.holds`: the engine's decisions, read through the agents' cached client;
* :mod:`.connection`: one client connection and its broker connection, muted as a broker mutes;
* :mod:`.server`: the listeners, metrics and a draining stop.
"""
