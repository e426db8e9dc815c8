package io.databus.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.IOException;
import java.io.Serializable;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.StringJoiner;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * The executor side of {@code databus-snapshot}: one input partition reads the rows of its
 * id range {@code (after, last]} of each source in turn, as pages of the bootstrap server's
 * snapshot phase: {@code GET /bootstrap?sources=<src>&snapshotEnd=<last>&batchSize=<pageRows>}
 * from the checkpoint {@code BOOTSTRAP_SNAPSHOT, bootstrap_start_scn = X + 1,
 * snapshot_offset = after}; each answer is the stored events (rows with scn <= X, in id
 * order) and a CHECKPOINT control event holding the next checkpoint, which this reader sends
 * back as it is until the server moves past the snapshot phase (the range is done).
 *
 * <p>Rows are the Python reader's: the change envelope decoded by {@link RowDecoder} with op
 * {@code r}, sequence {@code (scn, 0)}, {@code source.snapshot} true and no before image; an
 * event with an SCN above X is a {@code CorruptEvent}. With {@code prefetchBatches} > 0 the
 * next page is fetched (one thread per partition) while the current one is decoded. A
 * transient failure (server restarting) is retried for 30 s before the task fails.
 */
final class SnapshotReader implements PartitionReader<InternalRow> {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final int SRC_CHECKPOINT = -3;
    private static final UTF8String READ = UTF8String.fromString("r");
    private static final double RETRY_SECONDS = 30.0;

    /** One partition: ids {@code after < id <= last} of every source. */
    record Range(int index, long after, long last) implements InputPartition {}

    /** What every task needs: serialised from the driver. */
    record Factory(SnapshotOptions opts, List<Integer> srcIds, List<String> names, String registryJson,
                   StructType row, long scn) implements PartitionReaderFactory, Serializable {
        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            return new SnapshotReader(this, (Range) partition);
        }
    }

    private final Factory f;
    private final Range range;
    private final RelayClient conn;
    private final RowDecoder decoder;
    private final Wire event = new Wire();
    private final ExecutorService ahead;
    private int src = -1;          // index into f.srcIds of the source being read
    private String next;           // the checkpoint of the source's next page; null: source done
    private CompletableFuture<byte[]> pending;  // that page, being fetched
    private byte[] data;
    private int off;
    private int end;               // where the page's rows end (its CHECKPOINT event)
    private InternalRow current;

    SnapshotReader(Factory f, Range range) {
        this.f = f;
        this.range = range;
        conn = f.opts().client();
        decoder = new RowDecoder(Registry.parse(f.registryJson()),
            () -> Registry.parse(conn.register(f.srcIds())), f.row(), false);
        ahead = f.opts().prefetch && range.last() > range.after()
            ? Executors.newSingleThreadExecutor(r -> {
                Thread t = new Thread(r, "databus-snapshot-prefetch-" + range.index());
                t.setDaemon(true);
                return t;
            })
            : null;
    }

    static String join(List<Integer> ids) {
        StringJoiner j = new StringJoiner(",");
        ids.forEach(i -> j.add(Integer.toString(i)));
        return j.toString();
    }

    /** The first checkpoint of a range read of {@code source}: after row id {@code after}. */
    static String checkpoint(long scn, String source, long after) {
        ObjectNode cp = JSON.createObjectNode();
        cp.put("consumption_mode", "BOOTSTRAP_SNAPSHOT");
        cp.put("bootstrap_start_scn", scn + 1);
        cp.put("snapshot_source", source);
        cp.put("snapshot_offset", after);
        return cp.toString();
    }

    /** One snapshot page of {@code src} from checkpoint {@code cp}, ids up to {@code last}. */
    static byte[] page(RelayClient conn, int src, String cp, int rows, long last) {
        Map<String, String> p = new LinkedHashMap<>();
        p.put("sources", Integer.toString(src));
        p.put("checkPoint", cp);
        p.put("batchSize", Integer.toString(rows));
        p.put("snapshotEnd", Long.toString(last));
        return conn.get("/bootstrap", p, null).body();
    }

    private byte[] fetch(String cp) {
        int s = f.srcIds().get(src);
        return Planning.retrying(() -> page(conn, s, cp, f.opts().pageRows, range.last()), RETRY_SECONDS);
    }

    private CompletableFuture<byte[]> request(String cp) {
        if (ahead == null) {
            return CompletableFuture.completedFuture(fetch(cp));
        }
        return CompletableFuture.supplyAsync(() -> fetch(cp), ahead);
    }

    private static byte[] await(CompletableFuture<byte[]> page) {
        try {
            return page.get();
        } catch (ExecutionException e) {
            if (e.getCause() instanceof RuntimeException r) {
                throw r;
            }
            throw new DatabusSourceException("TerminalError", "databus-snapshot: " + e.getCause(), false, e);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new DatabusSourceException("RelayUnavailable", "interrupted", true, e);
        }
    }

    /**
     * Takes the page that {@code pending} brings: its rows end where its CHECKPOINT event
     * starts; the next page is asked for at once when the checkpoint is still in the
     * snapshot phase of this source.
     */
    private void take() {
        data = await(pending);
        pending = null;
        off = 0;
        int p = 0;
        int last = -1;
        while (p < data.length) {  // headers only: find the last event
            if (data.length - p < Wire.HEADER_LEN) {
                throw DatabusSourceException.corrupt("truncated header at offset " + p);
            }
            int length = Wire.i32(data, p + 17);
            if (length < Wire.HEADER_LEN || length > data.length - p) {
                throw DatabusSourceException.corrupt("bad total length " + length + " at offset " + p);
            }
            last = p;
            p += length;
        }
        if (last < 0) {
            throw new DatabusSourceException("TerminalError", "databus-snapshot: the bootstrap server "
                + conn.url() + " answered an empty snapshot page (no checkpoint)");
        }
        event.parse(data, last, data.length);
        if (event.srcId != SRC_CHECKPOINT) {
            throw new DatabusSourceException("TerminalError", "databus-snapshot: a snapshot page of "
                + conn.url() + " does not end with its checkpoint");
        }
        end = last;
        String cp = SnapshotProvider.text(data, event.payloadOff, event.payloadLen);
        JsonNode node;
        try {
            node = JSON.readTree(cp);
        } catch (IOException e) {
            throw DatabusSourceException.corrupt("the snapshot page's checkpoint is not JSON: " + e.getMessage());
        }
        boolean more = "BOOTSTRAP_SNAPSHOT".equals(node.path("consumption_mode").asText())
            && f.names().get(src).equals(node.path("snapshot_source").asText());
        next = more ? cp : null;
        if (more) {
            pending = request(next);
        }
    }

    @Override
    public boolean next() {
        while (true) {
            if (data != null && off < end) {
                event.parse(data, off, end);
                off += event.total;
                if (event.isControl()) {
                    continue;
                }
                if (event.scn > f.scn()) {
                    throw DatabusSourceException.corrupt("databus-snapshot: a snapshot row's event has SCN "
                        + event.scn + ", above the snapshot SCN " + f.scn() + " its store row was selected by");
                }
                GenericInternalRow row = (GenericInternalRow) decoder.decode(data, event, 0);
                row.update(0, READ);
                row.update(6, null);
                ((GenericInternalRow) row.getStruct(4, 9)).update(8, true);
                current = row;
                return true;
            }
            data = null;
            if (pending == null) {  // this source's range is done: the next source
                if (range.last() <= range.after() || ++src >= f.srcIds().size()) {
                    return false;
                }
                pending = request(checkpoint(f.scn(), f.names().get(src), range.after()));
            }
            take();
        }
    }

    @Override
    public InternalRow get() {
        return current;
    }

    @Override
    public void close() {
        data = null;
        if (ahead != null) {
            ahead.shutdownNow();
        }
    }
}
