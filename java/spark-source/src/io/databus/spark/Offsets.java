package io.databus.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.TreeSet;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The source's offsets, written to Spark's offset log as the Python source writes them
 * ({@code databus.spark.offsets}, whose docstring is the contract)::
 *
 * <pre>{"v": 1, "partitions": N, "relay": "http://...", "origin": "...", "sources": ["db.t"],
 *  "buckets": {"0": {"windowScn": S, "windowOffset": -1, "prevScn": P}, ...}}</pre>
 *
 * <p>one Databus checkpoint per MOD bucket, stamped with the relay (the option's address,
 * and the relay's {@code Databus-Origin} when it sends one) and the sources' names; an
 * offset read back for another relay or other sources is refused ({@link Identity#check}),
 * one written before the stamp existed is accepted with a warning. Micro-batches end on
 * window boundaries, so every bucket of an end offset holds the same {@code windowScn}. The
 * text is the Python source's, byte for byte ({@code json.dumps}' separators and ASCII
 * escapes), so a checkpoint written by either source resumes with the other.
 */
final class Offsets {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Logger LOG = LoggerFactory.getLogger("databus.spark");
    static final int VERSION = 1;

    private Offsets() {}

    /** What a query reads: the relay's address and origin (null: none sent), the sources. */
    record Identity(String relay, String origin, List<String> sources) implements Serializable {
        private static final long serialVersionUID = 1L;

        /** The {@code relay} option as an offset records it: a zk:// address as given, URLs sorted. */
        static String address(String relay) {
            String text = relay.strip();
            if (text.startsWith("zk://")) {
                return stripSlashes(text);
            }
            List<String> urls = new ArrayList<>();
            for (String u : text.split(",")) {
                if (!u.strip().isEmpty()) {
                    urls.add(stripSlashes(u.strip()));
                }
            }
            Collections.sort(urls);
            return String.join(",", urls);
        }

        private static String stripSlashes(String s) {
            String t = s;
            while (t.endsWith("/")) {
                t = t.substring(0, t.length() - 1);
            }
            return t;
        }

        String describe() {
            return "relay " + relay + (origin != null && !origin.isEmpty() ? " (origin " + origin + ")" : "")
                + ", sources " + String.join(", ", sources);
        }

        /** Refuses an offset stamped for another relay or other sources (the Python message). */
        void check(Identity stored) {
            boolean sameSources = new TreeSet<>(stored.sources).equals(new TreeSet<>(sources));
            boolean sameRelay = stored.origin != null && origin != null ? stored.origin.equals(origin)
                : stored.relay.equals(relay);
            if (!(sameSources && sameRelay)) {
                throw DatabusSourceException.config("databus source: this checkpoint was written for "
                    + stored.describe() + "; this query reads " + describe()
                    + ": use the checkpointLocation of this query, or a new one");
            }
        }
    }

    /** An offset: per bucket (windowScn, windowOffset, prevScn), and what it was read from
     * (null for an offset written before offsets recorded it). */
    static final class DatabusOffset extends Offset {
        final int partitions;
        final long[][] buckets;
        final Identity identity;

        DatabusOffset(int partitions, long[][] buckets, Identity identity) {
            this.partitions = partitions;
            this.buckets = buckets;
            this.identity = identity;
        }

        @Override
        public String json() {
            StringBuilder b = new StringBuilder("{\"v\": 1, \"partitions\": ").append(partitions);
            if (identity != null) {
                b.append(", \"relay\": ");
                ascii(b, identity.relay());
                if (identity.origin() != null) {
                    b.append(", \"origin\": ");
                    ascii(b, identity.origin());
                }
                b.append(", \"sources\": [");
                for (int i = 0; i < identity.sources().size(); i++) {
                    b.append(i > 0 ? ", " : "");
                    ascii(b, identity.sources().get(i));
                }
                b.append(']');
            }
            b.append(", \"buckets\": {");
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

    /** A JSON string as Python's {@code json.dumps} writes it (ASCII only). */
    static void ascii(StringBuilder b, String s) {
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                case '\b': b.append("\\b"); break;
                case '\f': b.append("\\f"); break;
                default:
                    if (c < 0x20 || c > 0x7e) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        b.append('"');
    }

    /** Every bucket after window {@code scn} (-1: the relay's oldest), stamped with {@code id}. */
    static DatabusOffset of(long scn, long prevScn, int partitions, Identity id) {
        long[][] b = new long[partitions][];
        for (int i = 0; i < partitions; i++) {
            b[i] = new long[] {scn, -1, prevScn};
        }
        return new DatabusOffset(partitions, b, id);
    }

    /**
     * Parses and checks an offset of this query's shape and, when it carries one, its
     * identity against {@code id} (the Python source's messages); an unstamped one is
     * accepted with a warning.
     */
    static DatabusOffset parse(String json, int partitions, Identity id) {
        JsonNode raw;
        try {
            raw = JSON.readTree(json);
        } catch (IOException e) {
            raw = null;
        }
        if (raw == null || raw.path("v").asInt(-1) != VERSION || !raw.path("buckets").isObject()) {
            throw DatabusSourceException.config("databus source: unreadable offset " + json + " in the checkpoint");
        }
        Identity stored = null;
        if (raw.has("relay") || raw.has("sources")) {
            List<String> names = new ArrayList<>();
            raw.path("sources").forEach(n -> names.add(n.asText()));
            JsonNode origin = raw.path("origin");
            stored = new Identity(raw.path("relay").asText(""),
                origin.isMissingNode() || origin.isNull() ? null : origin.asText(), List.copyOf(names));
            if (id != null) {
                id.check(stored);
            }
        } else if (id != null) {
            LOG.warn("databus source: the checkpoint's offset records no relay and no sources (written "
                + "before databus recorded them); accepted for " + id.describe()
                + ", and the next offset written records them");
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
        return new DatabusOffset(partitions, b, stored);
    }
}
