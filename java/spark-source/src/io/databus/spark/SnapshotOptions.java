package io.databus.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * The options of {@code format("databus-snapshot")} read by the JVM reader, validated with the
 * names, defaults, bounds and messages of {@code databus.spark.snapshot.SnapshotOptions}
 * (Python), plus what a read over HTTP needs ({@code tokenFile}, {@code caFile},
 * {@code httpTimeout}, as the {@code databus} format has them). A bad option is a
 * {@link DatabusSourceException} ({@code ConfigError}) naming it, raised by {@code load()}.
 *
 * <p>{@code store} (also {@code bootstrap}, or {@code .load(url)}) is the bootstrap server's
 * URL here; {@link #isServer} tells a server URL from a store's SQLAlchemy URL, which the
 * Python reader serves. {@code rowsPerArrowBatch} is accepted and has no effect (the JVM
 * reader hands Spark rows, not Arrow batches); {@code prefetchBatches} > 0 fetches a
 * partition's next page while its current one is decoded, 0 fetches one page at a time.
 */
final class SnapshotOptions implements Serializable {
    private static final long serialVersionUID = 1L;
    static final String WHO = "databus-snapshot";
    /** The bootstrap server's largest batchSize ({@code databus.bootstrap.server.MAX_BATCH}). */
    static final int MAX_PAGE_ROWS = 1_000_000;

    private static final String[] NAMES = {
        "store", "sources", "partitions", "scn", "valueFormat", "rowsPerArrowBatch", "pageRows",
        "prefetchBatches", "tokenFile", "caFile", "httpTimeout"};

    final String store;
    final List<String> sources;
    final int partitions;
    final Long scn;
    final boolean jsonValues;
    final int pageRows;
    final boolean prefetch;
    final String tokenFile;
    final String caFile;
    final double httpTimeout;

    private SnapshotOptions(Map<String, String> v) {
        List<String> problems = new ArrayList<>();
        store = SourceOptions.required(v, "store", problems);
        sources = SourceOptions.sourceList(v, problems);
        partitions = (int) SourceOptions.integer(v, "partitions", 1, 1, SourceOptions.MAX_PARTITIONS, problems);
        scn = v.containsKey("scn") ? SourceOptions.integer(v, "scn", -1, -1, Long.MAX_VALUE, problems) : null;
        String vf = v.getOrDefault("valueFormat", "struct");
        if (!vf.equals("struct") && !vf.equals("json")) {
            problems.add("valueFormat: Input should be 'struct' or 'json'");
        }
        jsonValues = vf.equals("json");
        SourceOptions.integer(v, "rowsPerArrowBatch", 8192, 1, Integer.MAX_VALUE, problems);
        pageRows = (int) SourceOptions.integer(v, "pageRows", 10_000, 1, MAX_PAGE_ROWS, problems);
        prefetch = SourceOptions.integer(v, "prefetchBatches", 4, 0, Integer.MAX_VALUE, problems) > 0;
        tokenFile = v.get("tokenFile");
        caFile = v.get("caFile");
        httpTimeout = SourceOptions.number(v, "httpTimeout", 30.0, false, problems);
        if (!problems.isEmpty()) {
            throw DatabusSourceException.config(WHO + ": invalid options: " + String.join("; ", problems));
        }
    }

    /** Validates Spark's (case-insensitive) options; raises naming the bad option. */
    static SnapshotOptions parse(Map<String, String> raw) {
        return new SnapshotOptions(canonical(raw));
    }

    /** The options by their canonical names; ConfigError for an unknown one. */
    private static Map<String, String> canonical(Map<String, String> raw) {
        Map<String, String> byLower = new TreeMap<>();
        for (String n : NAMES) {
            byLower.put(n.toLowerCase(Locale.ROOT), n);
        }
        byLower.put("path", "store");  // what .load(url) passes
        byLower.put("url", "store");
        byLower.put("bootstrap", "store");
        Map<String, String> values = new TreeMap<>();
        for (Map.Entry<String, String> e : raw.entrySet()) {
            String name = byLower.get(e.getKey().toLowerCase(Locale.ROOT));
            if (name == null) {
                TreeSet<String> sorted = new TreeSet<>(Arrays.asList(NAMES));
                StringBuilder b = new StringBuilder("[");
                for (String n : sorted) {
                    b.append(b.length() > 1 ? ", " : "").append('\'').append(n).append('\'');
                }
                throw DatabusSourceException.config(WHO + ": unknown option '" + e.getKey() + "'; known: "
                    + b.append(']'));
            }
            values.put(name, e.getValue());
        }
        return values;
    }

    /**
     * Whether these raw options address a bootstrap server ({@code http://} or
     * {@code https://}, the JVM reader's) rather than a store's SQLAlchemy URL (the Python
     * reader's). False when no address is given: the Python reader then names what is missing.
     */
    static boolean isServer(Map<String, String> raw) {
        for (Map.Entry<String, String> e : raw.entrySet()) {
            String k = e.getKey().toLowerCase(Locale.ROOT);
            if (k.equals("store") || k.equals("path") || k.equals("url") || k.equals("bootstrap")) {
                String v = e.getValue().strip().toLowerCase(Locale.ROOT);
                if (v.startsWith("http://") || v.startsWith("https://")) {
                    return true;
                }
            }
        }
        return false;
    }

    /** A client of the bootstrap server with these options' token, CA and timeout. */
    RelayClient client() {
        return new RelayClient(store, "bootstrap server", WHO, "store", tokenFile, caFile, null, null,
            httpTimeout);
    }
}
