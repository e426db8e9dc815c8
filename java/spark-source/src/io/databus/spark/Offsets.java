package io.databus.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.Iterator;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * The source's offsets, written to Spark's offset log as the Python source writes them::
 *
 * <pre>{"v": 1, "partitions": N, "buckets": {"0": {"windowScn": S, "windowOffset": -1, "prevScn": P}, ...}}</pre>
 *
 * <p>one Databus checkpoint per MOD bucket; micro-batches end on window boundaries, so
 * every bucket of an end offset holds the same {@code windowScn}. The text is the Python
 * source's, byte for byte ({@code json.dumps}' separators), so a checkpoint written by
 * either source resumes with the other.
 */
final class Offsets {
    private static final ObjectMapper JSON = new ObjectMapper();
    static final int VERSION = 1;

    private Offsets() {}

    /** An offset: per bucket (windowScn, windowOffset, prevScn). */
    static final class DatabusOffset extends Offset {
        final int partitions;
        final long[][] buckets;

        DatabusOffset(int partitions, long[][] buckets) {
            this.partitions = partitions;
            this.buckets = buckets;
        }

        @Override
        public String json() {
            StringBuilder b = new StringBuilder("{\"v\": 1, \"partitions\": ").append(partitions)
                .append(", \"buckets\": {");
            for (int i = 0; i < buckets.length; i++) {
                b.append(i > 0 ? ", " : "").append('"').append(i).append("\": {\"windowScn\": ")
                    .append(buckets[i][0]).append(", \"windowOffset\": ").append(buckets[i][1])
                    .append(", \"prevScn\": ").append(buckets[i][2]).append('}');
            }
            return b.append("}}").toString();
        }

        /** The common window SCN of an end offset. */
        long scn() {
            return buckets[0][0];
        }
    }

    /** Every bucket after window {@code scn} (-1: the relay's oldest). */
    static DatabusOffset of(long scn, long prevScn, int partitions) {
        long[][] b = new long[partitions][];
        for (int i = 0; i < partitions; i++) {
            b[i] = new long[] {scn, -1, prevScn};
        }
        return new DatabusOffset(partitions, b);
    }

    /** Parses and checks an offset of this query's shape (the Python source's messages). */
    static DatabusOffset parse(String json, int partitions) {
        JsonNode raw;
        try {
            raw = JSON.readTree(json);
        } catch (IOException e) {
            raw = null;
        }
        if (raw == null || raw.path("v").asInt(-1) != VERSION || !raw.path("buckets").isObject()) {
            throw DatabusSourceException.config("databus source: unreadable offset " + json + " in the checkpoint");
        }
        int got = raw.path("partitions").asInt(-1);
        if (got != partitions) {
            throw DatabusSourceException.config("databus source: the checkpoint was written with partitions="
                + raw.path("partitions") + ", the query now has partitions=" + partitions
                + "; keep the number of partitions or start a new checkpointLocation");
        }
        long[][] b = new long[partitions][];
        Long scn = null;
        for (Iterator<String> it = raw.get("buckets").fieldNames(); it.hasNext(); ) {
            String k = it.next();
            JsonNode cp = raw.get("buckets").get(k);
            int i;
            try {
                i = Integer.parseInt(k);
            } catch (NumberFormatException e) {
                i = -1;
            }
            if (i < 0 || i >= partitions || !cp.isObject()) {
                throw DatabusSourceException.config("databus source: unreadable offset " + json + " in the checkpoint");
            }
            b[i] = new long[] {cp.path("windowScn").asLong(-1), cp.path("windowOffset").asLong(-1),
                cp.path("prevScn").asLong(-1)};
            if (scn != null && scn != b[i][0]) {
                throw DatabusSourceException.config("databus source: offset buckets disagree: " + json);
            }
            scn = b[i][0];
        }
        for (long[] x : b) {
            if (x == null) {
                throw DatabusSourceException.config("databus source: unreadable offset " + json + " in the checkpoint");
            }
        }
        return new DatabusOffset(partitions, b);
    }
}
