// The oracle for quotastream/brokers/remote_log_metadata.py: Kafka's own RemoteLogMetadataSerde
// decodes each __remote_log_metadata value (one hex string per line on stdin) and prints it as
// one line of its fields, read through Kafka's own getters (tests/test_remote_log_metadata.py
// renders its decoding the same way and compares). Run as a single-file program:
//   java -cp '.kafka/libs/*' tests/java/RemoteLogMetadataOracle.java < values.hex
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.HexFormat;
import java.util.Map;
import java.util.Optional;
import java.util.stream.Collectors;

import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.server.log.remote.metadata.storage.serialization.RemoteLogMetadataSerde;
import org.apache.kafka.server.log.remote.storage.RemoteLogMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentId;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadata;
import org.apache.kafka.server.log.remote.storage.RemoteLogSegmentMetadataUpdate;
import org.apache.kafka.server.log.remote.storage.RemotePartitionDeleteMetadata;

public class RemoteLogMetadataOracle {
    public static void main(String[] args) throws Exception {
        RemoteLogMetadataSerde serde = new RemoteLogMetadataSerde();
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            RemoteLogMetadata metadata = serde.deserialize(HexFormat.of().parseHex(line.trim()));
            System.out.println(render(metadata));
        }
    }

    static String render(RemoteLogMetadata metadata) {
        if (metadata instanceof RemoteLogSegmentMetadata segment) {
            return String.join(" ", "segment", segmentId(segment.remoteLogSegmentId()),
                Long.toString(segment.startOffset()), Long.toString(segment.endOffset()),
                Integer.toString(segment.brokerId()), Long.toString(segment.maxTimestampMs()),
                Long.toString(segment.eventTimestampMs()), epochs(segment.segmentLeaderEpochs()),
                Integer.toString(segment.segmentSizeInBytes()), segment.state().name(),
                custom(segment.customMetadata().map(c -> c.value())),
                Boolean.toString(segment.isTxnIdxEmpty()));
        }
        if (metadata instanceof RemoteLogSegmentMetadataUpdate update) {
            return String.join(" ", "update", segmentId(update.remoteLogSegmentId()),
                Integer.toString(update.brokerId()), Long.toString(update.eventTimestampMs()),
                update.state().name(), custom(update.customMetadata().map(c -> c.value())));
        }
        if (metadata instanceof RemotePartitionDeleteMetadata delete) {
            return String.join(" ", "partition_delete", partition(delete.topicIdPartition()),
                Integer.toString(delete.brokerId()), Long.toString(delete.eventTimestampMs()),
                delete.state().name());
        }
        return "other " + metadata.getClass().getName();
    }

    static String partition(TopicIdPartition partition) {
        return partition.topic() + " " + partition.topicId() + " " + partition.partition();
    }

    static String segmentId(RemoteLogSegmentId id) {
        return partition(id.topicIdPartition()) + " " + id.id();
    }

    static String epochs(Map<Integer, Long> epochs) {
        return epochs.entrySet().stream().map(e -> e.getKey() + "=" + e.getValue())
            .collect(Collectors.joining(","));
    }

    static String custom(Optional<byte[]> value) {
        return value.map(v -> HexFormat.of().formatHex(v)).orElse("-");
    }
}
