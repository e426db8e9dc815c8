package io.databus.spark;

import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Optional;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadAllAvailable;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxBytes;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.ReportsSourceMetrics;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.types.StructType;

/**
 * The driver side of a streaming query: offsets, admission control, input partitions.
 *
 * <p>Offsets are per-bucket Databus checkpoints ({@link Offsets}); {@code latestOffset}
 * asks the relay for its newest window, or scans window headers when a row/byte limit
 * applies ({@code maxRowsPerBatch}, {@code maxBytesPerBatch}: whole windows, at least one).
 * Unlike the Python source on Spark 4.1, Spark passes every batch's start and limit here,
 * so the first batch of a query is capped too, and an availableNow run
 * ({@code prepareForTriggerAvailableNow} pins the relay's newest window) runs as several
 * capped batches. Each batch is one input partition per MOD bucket.
 *
 * <p>The query's progress names the relay and sources ({@link #toString}, Spark's
 * {@code description}) and carries {@link #metrics}: the relay's identity and how far the
 * query's last batch is behind the relay's newest window ({@link Planning#lag}); a relay
 * that cannot be asked then leaves only {@code relayError} (progress never fails the query).
 */
final class DatabusStream implements MicroBatchStream, SupportsAdmissionControl, SupportsTriggerAvailableNow,
        ReportsSourceMetrics {
    private final SourceOptions opts;
    private final List<Integer> srcIds;
    private final String registryJson;
    private final StructType row;
    private final Offsets.Identity identity;  // stamped on every offset, checked on every one read
    private Long target;  // availableNow: never plan past this window
    // the SCN range of the batch planned last, for the scan's size estimate (read by the
    // query's thread, the one that plans): {start, end}, null before the first one
    private volatile long[] planned;

    DatabusStream(SourceOptions opts, List<Integer> srcIds, String registryJson, StructType row,
                  Offsets.Identity identity) {
        this.opts = opts;
        this.srcIds = srcIds;
        this.registryJson = registryJson;
        this.row = row;
        this.identity = identity;
    }

    private RelayClient conn() {
        return new RelayClient(opts);
    }

    static Offsets.DatabusOffset initial(SourceOptions opts, List<Integer> srcIds, Offsets.Identity id) {
        String pos = opts.startingPosition;
        if (pos.equals("earliest")) {
            return Offsets.of(-1, -1, opts.partitions, id);
        }
        if (pos.equals("latest")) {
            return Offsets.of(Planning.relayTop(new RelayClient(opts), srcIds, 0), -1, opts.partitions, id);
        }
        return Offsets.of(opts.sourceScn(), -1, opts.partitions, id);
    }

    @Override
    public Offset initialOffset() {
        return initial(opts, srcIds, identity);
    }

    @Override
    public Offset deserializeOffset(String json) {
        return Offsets.parse(json, opts.partitions, identity);
    }

    @Override
    public void commit(Offset end) {
        // nothing to do: the relay keeps no consumer state
    }

    @Override
    public void stop() {
        // no resources held between calls
    }

    @Override
    public Offset latestOffset() {
        throw new UnsupportedOperationException("latestOffset(Offset, ReadLimit) is the one Spark calls");
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        if (opts.maxRowsPerBatch != null) {
            return ReadLimit.maxRows(opts.maxRowsPerBatch);
        }
        if (opts.maxBytesPerBatch != null) {
            return ReadLimit.maxBytes(opts.maxBytesPerBatch);
        }
        return ReadLimit.allAvailable();
    }

    @Override
    public void prepareForTriggerAvailableNow() {
        target = Planning.relayTop(conn(), srcIds, opts.relayRetrySeconds);
    }

    /**
     * {@code (startScn, endScn)} of the batch Spark planned last (the one it is about to
     * optimise and run), or null when it planned none in this process (a batch re-run
     * after a restart comes from Spark's offset log, not from {@link #latestOffset}).
     */
    long[] plannedRange() {
        return planned;
    }

    @Override
    public Offset latestOffset(Offset startOffset, ReadLimit limit) {
        Offset end = nextEnd((Offsets.DatabusOffset) startOffset, limit);
        planned = new long[] {((Offsets.DatabusOffset) startOffset).scn(), ((Offsets.DatabusOffset) end).scn()};
        return end;
    }

    private Offset nextEnd(Offsets.DatabusOffset start, ReadLimit limit) {
        long startScn = start.scn();
        RelayClient conn = conn();
        long top = target != null ? target : Planning.relayTop(conn, srcIds, opts.relayRetrySeconds);
        if (top <= startScn) {
            return start;
        }
        Long maxRows = null;
        Long maxBytes = null;
        if (limit instanceof ReadMaxRows r) {
            maxRows = r.maxRows();
            maxBytes = opts.maxBytesPerBatch;
        } else if (limit instanceof ReadMaxBytes b) {
            maxBytes = b.maxBytes();
        } else if (!(limit instanceof ReadAllAvailable)) {
            maxRows = opts.maxRowsPerBatch;
            maxBytes = opts.maxBytesPerBatch;
        }
        if (maxRows == null && maxBytes == null) {
            return Offsets.of(top, startScn, opts.partitions, identity);
        }
        Planning.Scan scan = Planning.scanLimit(conn, srcIds, startScn, start.buckets[0][2], top, maxRows,
            maxBytes, opts.fetchBytes, opts.relayRetrySeconds);
        if (scan.scn() <= startScn) {
            return start;
        }
        return Offsets.of(scan.scn(), scan.prevScn(), opts.partitions, identity);
    }

    @Override
    public Offset reportLatestOffset() {
        try {
            return Offsets.of(Planning.relayTop(conn(), srcIds, 0), -1, opts.partitions, identity);
        } catch (DatabusSourceException e) {
            return null;  // only informational (query progress)
        }
    }

    /** What {@code StreamingQueryProgress.sources[].description} shows. */
    @Override
    public String toString() {
        return "databus[relay=" + identity.relay() + (identity.origin() == null ? "" : ", origin=" + identity.origin())
            + ", sources=" + String.join(",", identity.sources()) + ", partitions=" + opts.partitions + "]";
    }

    /**
     * {@code StreamingQueryProgress.sources[].metrics}: {@code relay}, {@code relayOrigin},
     * {@code sources}; after a batch, {@code consumedScn}, {@code relayNewestScn},
     * {@code windowsBehindRelay} and {@code bytesBehindRelay} (estimates, see
     * {@link Planning#lag}) and {@code secondsBehindRelay}.
     */
    @Override
    public Map<String, String> metrics(Optional<Offset> latestConsumedOffset) {
        Map<String, String> m = new LinkedHashMap<>();
        m.put("relay", identity.relay());
        m.put("relayOrigin", identity.origin() == null ? "" : identity.origin());
        m.put("sources", String.join(",", identity.sources()));
        if (latestConsumedOffset.isEmpty()) {
            return m;
        }
        Offset o = latestConsumedOffset.get();
        Offsets.DatabusOffset at = o instanceof Offsets.DatabusOffset d ? d : (Offsets.DatabusOffset) deserializeOffset(o.json());
        m.put("consumedScn", Long.toString(at.scn()));
        try {
            Planning.Lag lag = Planning.lag(conn(), srcIds, at.scn(), at.buckets[0][2]);
            m.put("relayNewestScn", Long.toString(lag.newest()));
            m.put("windowsBehindRelay", Long.toString(lag.windows()));
            m.put("bytesBehindRelay", Long.toString(lag.bytes()));
            m.put("secondsBehindRelay", String.format(Locale.ROOT, "%.3f", lag.seconds()));
        } catch (DatabusSourceException | ClassCastException e) {
            m.put("relayError", String.valueOf(e.getMessage()));
        }
        return m;
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        return partitions((Offsets.DatabusOffset) start, ((Offsets.DatabusOffset) end).scn(), opts.partitions);
    }

    static InputPartition[] partitions(Offsets.DatabusOffset start, long endScn, int partitions) {
        InputPartition[] out = new InputPartition[partitions];
        for (int b = 0; b < partitions; b++) {
            long[] cp = start.buckets[b];
            out[b] = new BucketReader.Bucket(b, cp[0], cp[1], cp[2], endScn);
        }
        return out;
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new BucketReader.Factory(opts, srcIds, registryJson, row);
    }
}
