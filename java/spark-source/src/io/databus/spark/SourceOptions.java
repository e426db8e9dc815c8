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
 * The options of the {@code databus} format, validated: the same names, defaults, bounds
 * and messages as {@code databus.spark.options.StreamOptions} (Python). A bad option is a
 * {@link DatabusSourceException} ({@code ConfigError}) naming it, raised by {@code load()}.
 */
public final class SourceOptions implements Serializable {
    private static final long serialVersionUID = 1L;
    static final int MAX_PARTITIONS = 1024;

    private static final String[] NAMES = {
        "relay", "sources", "partitions", "maxRowsPerBatch", "maxBytesPerBatch",
        "startingPosition", "valueFormat", "envelope", "fetchBytes", "rowsPerArrowBatch",
        "prefetchBatches", "httpTimeout", "relayRetrySeconds", "tokenFile", "caFile", "certFile",
        "keyFile", "consumerName", "columnarBatchRows", "newestPerKey"};
    /** The most rows {@code columnarBatchRows} may ask for (its vectors are allocated whole). */
    static final int MAX_COLUMNAR_ROWS = 1 << 20;

    final String relay;
    final List<String> sources;
    final int partitions;
    final Long maxRowsPerBatch;
    final Long maxBytesPerBatch;
    final String startingPosition;
    final boolean jsonValues;
    final boolean flat;
    final int fetchBytes;
    final int rowsPerBatch;
    final int prefetchBatches;
    /** Rows per columnar batch handed to Spark ({@link ColumnarReader}); 0: the row reader. */
    final int columnarBatchRows;
    /**
     * Each partition's read gives one row per key, the key's newest change in the batch (and
     * every truncate), instead of every change ({@link BucketReader}).
     */
    final boolean newestPerKey;
    final double httpTimeout;
    final double relayRetrySeconds;
    final String tokenFile;
    final String caFile;
    final String certFile;
    final String keyFile;
    final String consumerName;  // X-Databus-Consumer; null: RelayClient's default
    /**
     * Rows are change rows ({@code _change_type}, {@code _commit_version},
     * {@code _commit_timestamp}): set only by Spark's changelog API (the catalog of the
     * Spark 4.2 line, {@link #asChangelog}), never by an option.
     */
    final boolean changelog;
    private final TreeMap<String, String> given;

    private SourceOptions(Map<String, String> v, boolean changelog) {
        this.changelog = changelog;
        given = new TreeMap<>(v);
        List<String> problems = new ArrayList<>();
        relay = required(v, "relay", problems);
        sources = sourceList(v, problems);
        partitions = (int) integer(v, "partitions", 1, 1, MAX_PARTITIONS, problems);
        maxRowsPerBatch = optInteger(v, "maxRowsPerBatch", 1, problems);
        maxBytesPerBatch = optInteger(v, "maxBytesPerBatch", 1, problems);
        startingPosition = v.getOrDefault("startingPosition", "earliest");
        String vf = v.getOrDefault("valueFormat", "struct");
        if (!vf.equals("struct") && !vf.equals("json")) {
            problems.add("valueFormat: Input should be 'struct' or 'json'");
        }
        jsonValues = vf.equals("json");
        String env = v.getOrDefault("envelope", "full");
        if (!env.equals("full") && !env.equals("flat")) {
            problems.add("envelope: Input should be 'full' or 'flat'");
        }
        flat = env.equals("flat");
        fetchBytes = (int) integer(v, "fetchBytes", 8L * 1024 * 1024, 4096, Integer.MAX_VALUE, problems);
        rowsPerBatch = (int) integer(v, "rowsPerArrowBatch", 8192, 1, Integer.MAX_VALUE, problems);
        prefetchBatches = (int) integer(v, "prefetchBatches", 8, 0, Integer.MAX_VALUE, problems);
        columnarBatchRows = (int) integer(v, "columnarBatchRows", 0, 0, MAX_COLUMNAR_ROWS, problems);
        newestPerKey = bool(v, "newestPerKey", problems);
        httpTimeout = number(v, "httpTimeout", 10.0, false, problems);
        relayRetrySeconds = number(v, "relayRetrySeconds", 30.0, true, problems);
        tokenFile = v.get("tokenFile");
        caFile = v.get("caFile");
        certFile = v.get("certFile");
        keyFile = v.get("keyFile");
        consumerName = v.get("consumerName");
        if (consumerName != null && !consumerName.matches("[\\x20-\\x7e]{1,200}")) {
            problems.add("consumerName: 1 to 200 printable ASCII characters");
        }
        if (!problems.isEmpty()) {
            throw DatabusSourceException.config(
                "databus source: invalid options: " + String.join("; ", problems));
        }
    }

    /** Validates Spark's (case-insensitive) options; raises naming the bad option. */
    public static SourceOptions parse(Map<String, String> raw) {
        Map<String, String> byLower = new TreeMap<>();
        for (String n : NAMES) {
            byLower.put(n.toLowerCase(Locale.ROOT), n);
        }
        byLower.put("path", "relay");  // what .load(url) passes
        byLower.put("url", "relay");
        Map<String, String> values = new TreeMap<>();
        for (Map.Entry<String, String> e : raw.entrySet()) {
            String name = byLower.get(e.getKey().toLowerCase(Locale.ROOT));
            if (name == null) {
                throw DatabusSourceException.config("databus source: unknown option '" + e.getKey()
                    + "'; known: " + known());
            }
            values.put(name, e.getValue());
        }
        SourceOptions o = new SourceOptions(values, false);
        if (o.flat && o.jsonValues) {
            throw DatabusSourceException.config("databus source: envelope=flat needs valueFormat=struct");
        }
        String pos = o.startingPosition;
        if (!pos.equals("earliest") && !pos.equals("latest") && o.sourceScn() == null) {
            throw DatabusSourceException.config(
                "databus source: startingPosition must be earliest, latest or an SCN, got '" + pos + "'");
        }
        return o;
    }

    private static String known() {
        TreeSet<String> sorted = new TreeSet<>(Arrays.asList(NAMES));
        StringBuilder b = new StringBuilder("[");
        for (String n : sorted) {
            b.append(b.length() > 1 ? ", " : "").append('\'').append(n).append('\'');
        }
        return b.append(']').toString();
    }

    /**
     * These options read as change rows (Spark's changelog API): one source, struct
     * values; {@code envelope} and {@code valueFormat} do not apply.
     */
    SourceOptions asChangelog() {
        if (given.containsKey("envelope") || given.containsKey("valueFormat")) {
            throw DatabusSourceException.config("databus changelog: envelope and valueFormat do not apply "
                + "to a changelog read (its rows are the table's columns and _change_type, "
                + "_commit_version, _commit_timestamp)");
        }
        if (sources.size() != 1) {
            throw DatabusSourceException.config("databus changelog: a changelog reads exactly one source");
        }
        if (newestPerKey) {
            throw DatabusSourceException.config("databus changelog: newestPerKey does not apply to a "
                + "changelog read (its rows are each window's net change per key already)");
        }
        return new SourceOptions(given, true);
    }

    /** The SCN of {@code startingPosition} when it is a number, else null. */
    Long sourceScn() {
        String p = startingPosition;
        String digits = p.startsWith("-") ? p.substring(1) : p;
        if (digits.isEmpty() || !digits.chars().allMatch(Character::isDigit)) {
            return null;
        }
        try {
            return Long.parseLong(p);
        } catch (NumberFormatException e) {
            return null;
        }
    }

    private static final List<String> TRUE = List.of("true", "1", "yes", "on", "t", "y");
    private static final List<String> FALSE = List.of("false", "0", "no", "off", "f", "n");

    /** The boolean option {@code name}, default false: the words the Python source's
     * options accept (pydantic's), any case. */
    static boolean bool(Map<String, String> v, String name, List<String> problems) {
        String s = v.getOrDefault(name, "false").trim().toLowerCase(Locale.ROOT);
        if (!TRUE.contains(s) && !FALSE.contains(s)) {
            problems.add(name + ": Input should be a valid boolean");
        }
        return TRUE.contains(s);
    }

    /** The non-empty text option {@code name}, or null with its problem added. */
    static String required(Map<String, String> v, String name, List<String> problems) {
        String value = v.get(name);
        if (value == null) {
            problems.add(name + ": Field required");
        } else if (value.isEmpty()) {
            problems.add(name + ": String should have at least 1 character");
        }
        return value;
    }

    /** The comma-separated {@code sources} option (blanks dropped, at least one name). */
    static List<String> sourceList(Map<String, String> v, List<String> problems) {
        List<String> srcs = new ArrayList<>();
        String rawSources = v.get("sources");
        if (rawSources == null) {
            problems.add("sources: Field required");
        } else {
            for (String s : rawSources.split(",")) {
                if (!s.strip().isEmpty()) {
                    srcs.add(s.strip());
                }
            }
            if (srcs.isEmpty()) {
                problems.add("sources: Tuple should have at least 1 item after validation, not 0");
            }
        }
        return List.copyOf(srcs);
    }

    static long integer(Map<String, String> v, String name, long dflt, long min, long max,
                                List<String> problems) {
        String s = v.get(name);
        if (s == null) {
            return dflt;
        }
        long n;
        try {
            n = Long.parseLong(s.strip());
        } catch (NumberFormatException e) {
            problems.add(name + ": Input should be a valid integer, unable to parse string as an integer");
            return dflt;
        }
        if (n < min) {
            problems.add(name + ": Input should be greater than or equal to " + min);
        } else if (n > max) {
            problems.add(name + ": Input should be less than or equal to " + max);
        }
        return n;
    }

    private static Long optInteger(Map<String, String> v, String name, long min, List<String> problems) {
        if (!v.containsKey(name)) {
            return null;
        }
        return integer(v, name, 0, min, Long.MAX_VALUE, problems);
    }

    static double number(Map<String, String> v, String name, double dflt, boolean zeroOk,
                                 List<String> problems) {
        String s = v.get(name);
        if (s == null) {
            return dflt;
        }
        double d;
        try {
            d = Double.parseDouble(s.strip());
        } catch (NumberFormatException e) {
            problems.add(name + ": Input should be a valid number, unable to parse string as a number");
            return dflt;
        }
        if (zeroOk ? d < 0 : d <= 0) {
            problems.add(name + ": Input should be greater than " + (zeroOk ? "or equal to 0" : "0"));
        }
        return d;
    }
}
