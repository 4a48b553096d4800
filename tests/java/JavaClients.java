// Kafka's own Java clients (kafka-clients, the release the tests run), driven the way
// tests/client_libraries.py drives the Python ones, for the proxy's tests and bench/proxy.py.
// Run as a single-file program on the cluster's jars:
//   java -cp '.kafka/libs/*' tests/java/JavaClients.java MODE [key=value ...]
// Every key=value is a client property (bootstrap.servers, client.id, security settings), except
// the harness's own, which start with "offer.": offer.topic, offer.bytes_per_s,
// offer.duration_s, offer.record_bytes, offer.group, offer.count.
// Modes:
//   offer    a producer offering offer.bytes_per_s for offer.duration_s (the schedule of
//            client_libraries.Offer: it catches up at most offer.catch_up_s, 1 s by default);
//            with offer.backlog (records sent, not yet acknowledged) as its bound, or its own
//            buffer (buffer.memory, 32 MB by default: send() blocks when it is full) without one,
//            as Kafka's ProducerPerformance; prints "<monotonic s> <bytes>" per ack
//   read     a consumer (no group, every partition from the start) reading at that rate at
//            most for that long; prints "<monotonic s> <bytes>" per record
//   produce  the hex values on stdin, each its own key, acks=all; every one acknowledged
//   consume  offer.count values in group offer.group, committed; prints each as hex
// Times are System.nanoTime() in seconds: CLOCK_MONOTONIC on Linux, as Python's time.monotonic.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class JavaClients {
    static final long TIMEOUT_MS = 60_000;

    public static void main(String[] args) throws Exception {
        Properties client = new Properties();
        Properties offer = new Properties();
        for (String arg : List.of(args).subList(1, args.length)) {
            String[] pair = arg.split("=", 2);
            (pair[0].startsWith("offer.") ? offer : client).setProperty(pair[0], pair[1]);
        }
        StringBuilder out = new StringBuilder();
        switch (args[0]) {
            case "offer" -> offer(client, offer, out);
            case "read" -> read(client, offer, out);
            case "produce" -> produce(client, offer);
            case "consume" -> consume(client, offer, out);
            default -> throw new IllegalArgumentException("no mode " + args[0]);
        }
        System.out.print(out);
        System.out.flush();
    }

    static double now() {
        return System.nanoTime() / 1e9;
    }

    static void sleepUntil(double due) throws InterruptedException {
        long ms = (long) Math.ceil((due - now()) * 1000);
        if (ms > 0) {
            Thread.sleep(ms);
        }
    }

    static KafkaProducer<byte[], byte[]> producer(Properties client) {
        return new KafkaProducer<>(client, new ByteArraySerializer(), new ByteArraySerializer());
    }

    static KafkaConsumer<byte[], byte[]> consumer(Properties client) {
        return new KafkaConsumer<>(client, new ByteArrayDeserializer(), new ByteArrayDeserializer());
    }

    // client_libraries.Offer.schedule: a record due every record_bytes / bytes_per_s, catching
    // up at most a second when held back; at most a second of the rate sent and unacknowledged.
    static void offer(Properties client, Properties offer, StringBuilder out) throws Exception {
        String topic = offer.getProperty("offer.topic");
        double rate = Double.parseDouble(offer.getProperty("offer.bytes_per_s"));
        double duration = Double.parseDouble(offer.getProperty("offer.duration_s"));
        int recordBytes = Integer.parseInt(offer.getProperty("offer.record_bytes"));
        long backlog = Long.parseLong(offer.getProperty("offer.backlog", "0"));
        double catchUp = Double.parseDouble(offer.getProperty("offer.catch_up_s", "1.0"));
        client.putIfAbsent("acks", "1");
        byte[] value = new byte[recordBytes];
        java.util.Arrays.fill(value, (byte) 'o');
        List<double[]> acks = java.util.Collections.synchronizedList(new ArrayList<>());
        AtomicLong acked = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        java.util.concurrent.atomic.AtomicReference<Exception> firstError =
            new java.util.concurrent.atomic.AtomicReference<>();
        long sent = 0;
        try (KafkaProducer<byte[], byte[]> producer = producer(client)) {
            double due = now();
            double end = due + duration;
            while (due < end) {
                sleepUntil(due);
                while (backlog > 0 && sent - acked.get() - failed.get() >= backlog) {
                    Thread.sleep(5);
                }
                byte[] key = Long.toString(sent).getBytes(StandardCharsets.UTF_8);
                producer.send(new ProducerRecord<>(topic, key, value), (metadata, error) -> {
                    if (error == null) {
                        acks.add(new double[] {now(), recordBytes});
                        acked.incrementAndGet();
                    } else {
                        failed.incrementAndGet();
                        firstError.compareAndSet(null, error);
                    }
                });
                sent += 1;
                due = Math.max(due + recordBytes / rate, now() - catchUp);
            }
            producer.flush();
            report(producer.metrics());
        }
        if (failed.get() > 0) {
            // Records the producer gave up on: an offer is measured by its acknowledgements, so
            // the run must say it lost some rather than report a lower rate.
            System.err.println(failed.get() + " of " + sent + " records failed, the first: "
                + firstError.get());
            System.exit(3);
        }
        synchronized (acks) {
            for (double[] ack : acks) {
                out.append(ack[0]).append(' ').append((long) ack[1]).append('\n');
            }
        }
    }

    // What explains a run's rate after the fact (retries, time-outs, reconnections, the longest
    // wait for a response and the throttles the responses carried), on stderr, which the harness
    // passes on.
    static final List<String> REPORTED = List.of(
        "request-latency-max", "produce-throttle-time-max", "produce-throttle-time-avg",
        "record-retry-total", "record-error-total", "connection-close-total",
        "record-queue-time-max", "requests-in-flight", "bufferpool-wait-time-ns-total");

    static void report(java.util.Map<org.apache.kafka.common.MetricName,
            ? extends org.apache.kafka.common.Metric> metrics) {
        StringBuilder line = new StringBuilder("producer-metrics");
        metrics.forEach((name, metric) -> {
            if (name.group().equals("producer-metrics") && REPORTED.contains(name.name())) {
                line.append(' ').append(name.name()).append('=').append(metric.metricValue());
            }
        });
        System.err.println(line);
    }

    // client_libraries.Offer.read_pace: never more than a second behind the offered rate.
    static void read(Properties client, Properties offer, StringBuilder out) throws Exception {
        String topic = offer.getProperty("offer.topic");
        double rate = Double.parseDouble(offer.getProperty("offer.bytes_per_s"));
        double duration = Double.parseDouble(offer.getProperty("offer.duration_s"));
        client.putIfAbsent("auto.offset.reset", "earliest");
        client.putIfAbsent("max.poll.records", "100");
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(client)) {
            List<TopicPartition> partitions = new ArrayList<>();
            for (PartitionInfo info : consumer.partitionsFor(topic, Duration.ofMillis(TIMEOUT_MS))) {
                partitions.add(new TopicPartition(topic, info.partition()));
            }
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            double started = now();
            double deadline = started + duration;
            long read = 0;
            while (now() < deadline) {
                started = Math.max(started, now() - 1.0 - read / rate);
                sleepUntil(Math.min(started + read / rate, deadline));
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(200))) {
                    int size = record.value() == null ? 0 : record.value().length;
                    out.append(now()).append(' ').append(size).append('\n');
                    read += size;
                }
            }
        }
    }

    static void produce(Properties client, Properties offer) throws Exception {
        String topic = offer.getProperty("offer.topic");
        client.putIfAbsent("acks", "all");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer = producer(client)) {
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                byte[] value = HexFormat.of().parseHex(line.trim());
                sent.add(producer.send(new ProducerRecord<>(topic, value, value)));
            }
            for (Future<RecordMetadata> future : sent) {
                future.get(TIMEOUT_MS, TimeUnit.MILLISECONDS);
            }
        }
    }

    static void consume(Properties client, Properties offer, StringBuilder out) throws Exception {
        client.setProperty("group.id", offer.getProperty("offer.group"));
        client.putIfAbsent("auto.offset.reset", "earliest");
        client.putIfAbsent("enable.auto.commit", "false");
        long count = Long.parseLong(offer.getProperty("offer.count"));
        long deadline = System.currentTimeMillis() + TIMEOUT_MS;
        long received = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = consumer(client)) {
            consumer.subscribe(List.of(offer.getProperty("offer.topic")));
            while (received < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> record : consumer.poll(Duration.ofMillis(500))) {
                    out.append(HexFormat.of().formatHex(record.value())).append('\n');
                    received += 1;
                }
            }
            consumer.commitSync();
        }
    }
}
