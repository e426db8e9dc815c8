// Debezium's MySQL connector run embedded (DebeziumEngine, JSON values, no Kafka), for the
// side-by-side benches of bench/peers/compare.py and the Debezium-exact data of the tests.
//
// Tables: the --tables list plus the control table peerctl.mark (column v). The first
// change of peerctl.mark makes the harness print "STREAMING"; a row with v = --stop-token
// (default "stop") stops it. Every other change is a data event:
//
//   --mode count   count data events; at the first print nothing, at --expect N stop and
//                  print one line "RESULT {json}" (events, seconds from the first to the
//                  last event, seconds from the engine's start, peak RSS in kB)
//   --mode latency as count, and for each event the receive wall time minus the row's
//                  --latency-column (µs since the epoch), written "sent_us latency_us" per
//                  line to --out
//   --mode values  each data event's value (JSON with the Connect schema) on a line of --out
//
// Offsets and schema history are files (--offsets, --history), so a first run in
// snapshot.mode=no_data can mark the binlog's end and a second run read what was written
// after it (the pre-written binlog of the throughput bench).
//
// Usage: java -cp <bundle jars>:<build dir> DebeziumHarness --port P --mode count ...

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.Json;

import java.io.BufferedWriter;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Instant;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

public final class DebeziumHarness {
    private static final String CONTROL = "peerctl.mark";

    private final Map<String, String> opts;
    private final String mode;
    private final long expect;
    private final String latencyKey;
    private final String stopValue;
    private final BufferedWriter out;
    private final CountDownLatch done = new CountDownLatch(1);
    private final long startedNs = System.nanoTime();
    private long firstNs = -1;
    private long lastNs = -1;
    private long events = 0;
    private boolean streaming = false;
    private volatile String failure = null;

    private DebeziumHarness(Map<String, String> opts) throws IOException {
        this.opts = opts;
        this.mode = opts.getOrDefault("mode", "count");
        this.expect = Long.parseLong(opts.getOrDefault("expect", "0"));
        this.latencyKey = "\"" + opts.getOrDefault("latency-column", "sent_us") + "\":";
        this.stopValue = "\"v\":\"" + opts.getOrDefault("stop-token", "stop") + "\"";
        String file = opts.get("out");
        this.out = file == null ? null : Files.newBufferedWriter(Path.of(file), StandardCharsets.UTF_8);
    }

    private Properties properties() {
        Properties p = new Properties();
        p.setProperty("name", "peer-harness");
        p.setProperty("connector.class", "io.debezium.connector.mysql.MySqlConnector");
        p.setProperty("offset.storage", "org.apache.kafka.connect.storage.FileOffsetBackingStore");
        p.setProperty("offset.storage.file.filename", opts.get("offsets"));
        p.setProperty("offset.flush.interval.ms", "0");
        p.setProperty("schema.history.internal", "io.debezium.storage.file.history.FileSchemaHistory");
        p.setProperty("schema.history.internal.file.filename", opts.get("history"));
        p.setProperty("database.hostname", opts.getOrDefault("host", "127.0.0.1"));
        p.setProperty("database.port", opts.get("port"));
        p.setProperty("database.user", opts.getOrDefault("user", "root"));
        p.setProperty("database.password", opts.getOrDefault("password", ""));
        p.setProperty("database.server.id", opts.getOrDefault("server-id", "5400"));
        p.setProperty("topic.prefix", "peer");
        String tables = opts.getOrDefault("tables", "");
        p.setProperty("table.include.list", tables.isEmpty() ? CONTROL : tables + "," + CONTROL);
        p.setProperty("snapshot.mode", opts.getOrDefault("snapshot-mode", "no_data"));
        p.setProperty("include.schema.changes", "false");
        p.setProperty("converter.schemas.enable", mode.equals("values") ? "true" : "false");
        // the connector's defaults, written out: what the type comparison assumes
        p.setProperty("decimal.handling.mode", opts.getOrDefault("decimal-handling-mode", "precise"));
        p.setProperty("time.precision.mode", opts.getOrDefault("time-precision-mode", "adaptive_time_microseconds"));
        p.setProperty("bigint.unsigned.handling.mode", opts.getOrDefault("bigint-unsigned-handling-mode", "long"));
        p.setProperty("max.batch.size", opts.getOrDefault("max-batch-size", "2048"));
        p.setProperty("max.queue.size", opts.getOrDefault("max-queue-size", "8192"));
        p.setProperty("poll.interval.ms", opts.getOrDefault("poll-interval-ms", "1"));
        return p;
    }

    private static long nowMicros() {
        Instant t = Instant.now();
        return t.getEpochSecond() * 1_000_000L + t.getNano() / 1_000;
    }

    private static long sentMicros(String value, String key) {
        int at = value.indexOf("\"after\":");
        at = at < 0 ? -1 : value.indexOf(key, at);
        if (at < 0) {
            return -1;
        }
        int i = at + key.length();
        long v = 0;
        while (i < value.length() && Character.isDigit(value.charAt(i))) {
            v = v * 10 + (value.charAt(i++) - '0');
        }
        return v;
    }

    private void handle(List<ChangeEvent<String, String>> records,
                        DebeziumEngine.RecordCommitter<ChangeEvent<String, String>> committer)
            throws InterruptedException {
        try {
            for (ChangeEvent<String, String> r : records) {
                String value = r.value();
                if (value == null) {
                    committer.markProcessed(r);
                    continue;  // a tombstone
                }
                if (r.destination().endsWith("." + CONTROL)) {
                    if (!streaming) {
                        streaming = true;
                        System.out.println("STREAMING");
                        System.out.flush();
                    }
                    if (value.contains(stopValue)) {
                        done.countDown();
                    }
                } else if (expect == 0 || events < expect) {
                    long now = System.nanoTime();
                    if (firstNs < 0) {
                        firstNs = now;
                    }
                    lastNs = now;
                    events++;
                    if (mode.equals("values")) {
                        out.write(value);
                        out.write('\n');
                    } else if (mode.equals("latency")) {
                        long sent = sentMicros(value, latencyKey);
                        out.write(sent + " " + (nowMicros() - sent) + "\n");
                    }
                    if (expect > 0 && events == expect) {
                        done.countDown();
                    }
                }
                committer.markProcessed(r);
            }
            committer.markBatchFinished();
        } catch (IOException e) {
            failure = e.toString();
            done.countDown();
        }
    }

    private static long peakRssKb() {
        try {
            for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
                if (line.startsWith("VmHWM:")) {
                    return Long.parseLong(line.replaceAll("[^0-9]", ""));
                }
            }
        } catch (IOException | NumberFormatException e) {
            return -1;
        }
        return -1;
    }

    private int run() throws Exception {
        DebeziumEngine<ChangeEvent<String, String>> engine = DebeziumEngine.create(Json.class)
                .using(properties())
                .notifying(this::handle)
                .using((success, message, error) -> {
                    if (!success) {
                        failure = message + (error == null ? "" : ": " + error);
                    }
                    done.countDown();
                })
                .build();
        ExecutorService pool = Executors.newSingleThreadExecutor();
        pool.execute(engine);
        long timeout = Long.parseLong(opts.getOrDefault("timeout", "600"));
        boolean finished = done.await(timeout, TimeUnit.SECONDS);
        long endNs = lastNs;
        engine.close();
        pool.shutdown();
        pool.awaitTermination(60, TimeUnit.SECONDS);
        if (out != null) {
            out.close();
        }
        double span = firstNs < 0 ? 0.0 : (endNs - firstNs) / 1e9;
        double total = firstNs < 0 ? 0.0 : (endNs - startedNs) / 1e9;
        System.out.printf("RESULT {\"events\": %d, \"first_to_last_s\": %.6f, \"start_to_last_s\": %.6f,"
                + " \"peak_rss_kb\": %d, \"finished\": %b, \"failure\": %s}%n",
                events, span, total, peakRssKb(), finished,
                failure == null ? "null" : "\"" + failure.replace("\\", "\\\\").replace("\"", "'") + "\"");
        System.out.flush();
        return failure == null && finished ? 0 : 1;
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> opts = new HashMap<>();
        for (int i = 0; i + 1 < args.length; i += 2) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("expected --option value, got " + args[i]);
            }
            opts.put(args[i].substring(2), args[i + 1]);
        }
        for (String need : new String[] {"port", "offsets", "history"}) {
            if (!opts.containsKey(need)) {
                throw new IllegalArgumentException("--" + need + " is required");
            }
        }
        System.exit(new DebeziumHarness(opts).run());
    }
}
