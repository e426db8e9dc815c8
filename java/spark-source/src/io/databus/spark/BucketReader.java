package io.databus.spark;

import java.io.Serializable;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;

/**
 * The executor side: one input partition reads one MOD bucket of a batch {@code (start, end]},
 * as {@code databus.spark.reading.read_bucket} does. The windows after the bucket's start
 * checkpoint through window {@code endScn}, in the relay's order; {@code sequence.index}
 * counts the bucket's data events inside each window. A response that ends inside a window
 * too large for the fetch budget resumes inside it ({@code windowOffset}). Deterministic for
 * a given (start, end) while the relay holds those windows: what makes a restart from
 * Spark's checkpoint lose and repeat nothing.
 *
 * <p>An unreachable relay is retried for {@code relayRetrySeconds}; a relay that serves
 * nothing though it holds the end window, or holds less than the batch for longer than that,
 * fails the task with a {@code RelayProtocolError}.
 */
final class BucketReader implements PartitionReader<InternalRow> {

    /** One bucket's share of a batch: its start checkpoint, the batch's end window. */
    record Bucket(int bucket, long windowScn, long windowOffset, long prevScn, long endScn)
        implements InputPartition {}

    /** What every task needs: serialised from the driver. */
    record Factory(SourceOptions opts, List<Integer> srcIds, String registryJson, StructType row)
        implements PartitionReaderFactory, Serializable {
        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            return new BucketReader(this, (Bucket) partition);
        }
    }

    private final Factory f;
    private final int bucket;
    private final long endScn;
    private final RelayClient conn;
    private final RowDecoder decoder;
    private final Wire event = new Wire();
    private final String filter;
    // the cursor: the checkpoint of the next fetch, the next window index
    private long cpScn;
    private long cpOffset;
    private long cpPrev;
    private int index;
    // the response being read
    private byte[] data;
    private int off;
    private long winScn = -1;
    private int winCount;
    private boolean done;
    private InternalRow current;

    BucketReader(Factory f, Bucket b) {
        this.f = f;
        bucket = b.bucket();
        endScn = b.endScn();
        cpScn = b.windowScn();
        cpOffset = b.windowOffset();
        cpPrev = b.prevScn();
        index = cpOffset >= 0 ? (int) cpOffset : 0;
        conn = new RelayClient(f.opts());
        decoder = new RowDecoder(Registry.parse(f.registryJson()),
            () -> Registry.parse(conn.register(f.srcIds())), f.row(), f.opts().flat);
        filter = f.opts().partitions > 1 ? modFilter(f.srcIds(), f.opts().partitions, bucket) : null;
        done = cpOffset < 0 && cpScn >= endScn;
    }

    static String modFilter(List<Integer> srcIds, int buckets, int bucket) {
        StringBuilder b = new StringBuilder("{");
        List<Integer> sorted = srcIds.stream().map(String::valueOf).sorted().map(Integer::valueOf).toList();
        for (int i = 0; i < sorted.size(); i++) {
            b.append(i > 0 ? "," : "").append('"').append(sorted.get(i))
                .append("\":{\"filters\":[{\"bktRange\":{\"end\":").append(bucket + 1).append(",\"start\":")
                .append(bucket).append("},\"numBuckets\":").append(buckets)
                .append("}],\"partitionType\":\"MOD\"}");
        }
        return b.append('}').toString();
    }

    private String checkpoint() {
        if (cpScn == -1) {
            return null;  // flexible: the relay's oldest window
        }
        return "{\"prevScn\":" + cpPrev + ",\"windowOffset\":" + cpOffset + ",\"windowScn\":" + cpScn + "}";
    }

    /** Window {@code scn} has been read whole. */
    private void eop(long scn) {
        long prev = cpOffset < 0 ? cpScn : cpPrev;
        cpScn = scn;
        cpOffset = -1;
        cpPrev = prev;
        index = 0;
    }

    /** The response ended inside window {@code win} after {@code count} more data events. */
    private void partial(long win, int count) {
        long doneBefore = cpOffset >= 0 && cpScn == win ? cpOffset : 0;
        long prev = cpOffset < 0 ? cpScn : cpPrev;
        if (win == cpScn && cpOffset >= 0) {
            prev = cpPrev;
        }
        cpScn = win;
        cpOffset = doneBefore + count;
        cpPrev = prev;
    }

    @Override
    public boolean next() {
        while (!done) {
            if (data == null || off >= data.length) {
                if (data != null && winScn != -1) {
                    partial(winScn, winCount);
                }
                data = fetch();
                off = 0;
                winScn = -1;
                winCount = 0;
                if (data == null) {
                    done = true;
                    break;
                }
                continue;
            }
            event.parse(data, off, data.length);
            off += event.total;
            if (event.isEop()) {
                eop(event.scn);
                winScn = -1;
                winCount = 0;
                if (event.scn >= endScn) {
                    done = true;
                }
                continue;
            }
            if (event.isControl()) {
                continue;
            }
            winScn = event.scn;
            winCount++;
            current = decoder.decode(data, event, index);
            index++;
            return true;
        }
        return false;
    }

    /** The next non-empty response of this bucket read (see the class comment). */
    private byte[] fetch() {
        SourceOptions o = f.opts();
        long failingSince = -1;
        long behindSince = -1;
        int emptyAtTop = 0;
        double delay = 0.2;
        while (true) {
            RelayClient.Response r;
            try {
                r = conn.stream(checkpoint(), f.srcIds(), o.fetchBytes, filter, 1.0);
            } catch (DatabusSourceException e) {
                if (!e.isTransient()) {
                    throw e;
                }
                long now = System.nanoTime();
                failingSince = failingSince < 0 ? now : failingSince;
                if ((now - failingSince) / 1e9 > o.relayRetrySeconds) {
                    throw e;
                }
                sleep(delay);
                delay = Math.min(delay * 2, 5.0);
                continue;
            }
            failingSince = -1;
            delay = 0.2;
            if (r.data().length == 0) {
                if (r.maxScn() >= endScn) {
                    // once may be a window appended between the read and the header
                    if (++emptyAtTop > 1) {
                        throw new DatabusSourceException("RelayProtocolError", "relay " + o.relay
                            + " served nothing after " + checkpoint() + " though it holds windows up to "
                            + r.maxScn() + " (batch end " + endScn + ")");
                    }
                    continue;
                }
                // the relay is behind the planned end (e.g. refilling after a restart)
                long now = System.nanoTime();
                behindSince = behindSince < 0 ? now : behindSince;
                if ((now - behindSince) / 1e9 > o.relayRetrySeconds) {
                    throw new DatabusSourceException("RelayProtocolError", "relay " + o.relay
                        + " holds windows only up to " + r.maxScn() + " but the batch ends at " + endScn
                        + ": it lost windows it had served (memory buffer?)");
                }
                continue;
            }
            return r.data();
        }
    }

    private static void sleep(double seconds) {
        try {
            Thread.sleep((long) (seconds * 1000));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new DatabusSourceException("RelayUnavailable", "interrupted", true, e);
        }
    }

    @Override
    public InternalRow get() {
        return current;
    }

    @Override
    public void close() {
        data = null;
    }
}
