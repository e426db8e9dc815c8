package io.databus.spark;

import java.io.Serializable;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The executor side: one input partition reads one MOD bucket of a batch {@code (start, end]},
 * as {@code databus.spark.reading.read_bucket} does. The windows after the bucket's start
 * checkpoint through window {@code endScn}, in the relay's order ({@link EventWalk});
 * {@code sequence.index} counts the bucket's data events inside each window. A response
 * that ends inside a window too large for the fetch budget resumes inside it
 * ({@code windowOffset}). Deterministic for a given (start, end) while the relay holds those
 * windows: what makes a restart from Spark's checkpoint lose and repeat nothing.
 *
 * <p>This reader gives Spark one row at a time (the default); with {@code columnarBatchRows}
 * > 0 the factory gives {@link ColumnarReader}s instead, the same rows in column vectors (a
 * changelog read always takes this one).
 *
 * <p>Fetching ahead: with {@code prefetchBatches} > 0 a thread of the read
 * ({@code databus-relay-fetch-<bucket>}, {@link EventWalk}) asks for the next {@code /stream}
 * page while the task decodes the current one. The next page's checkpoint comes from the
 * current page's event headers alone ({@link Cursor#advance}), so the rows, their order and
 * the offsets are those of a read without the thread. The thread holds at most one page
 * beyond the one decoded (a hand-off, no queue): at most two pages of {@code fetchBytes} per
 * partition read. Its failures are thrown by {@link #next} in the task, the same exception
 * as without the thread; {@link #close} (also on a task kill) interrupts it, which aborts
 * its request, and waits for it to end.
 *
 * <p>A changelog read (Spark 4.2's changelog API) decodes a window's events into the
 * decoder's per-key net changes and returns that window's change rows at its end-of-window
 * event ({@link RowDecoder#endWindow}); the reader's batches start and end on window
 * boundaries, and a checkpoint that starts inside a window is refused.
 *
 * <p>With {@code newestPerKey} the reader walks its whole share of the batch before giving the
 * first row, keeping per (source, key) only where the newest change is (its page and offset)
 * and every truncate, then decodes those events alone, in the order they were committed: a
 * consumer that applies rows in order, or keeps the newest per key (apply_changes SCD1), ends
 * with the same table as from every change. Each key's changes are in one partition (MOD
 * buckets of the key), so there is one row per key per batch. An event a newer change of its
 * key replaces is checked as every event is ({@link Wire#parse}: header, lengths, checksum)
 * but its row is never decoded. The pages holding a kept event stay in memory until the read
 * ends (at most the partition's share of the batch: bound it with {@code maxRowsPerBatch} /
 * {@code maxBytesPerBatch}); rows are given one at a time ({@code columnarBatchRows} is not
 * used).
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

        /** Columnar batches when {@code columnarBatchRows} > 0, but for a changelog read (change rows)
         * and for {@code newestPerKey}. */
        @Override
        public boolean supportColumnarReads(InputPartition partition) {
            return opts.columnarBatchRows > 0 && !opts.changelog && !opts.newestPerKey;
        }

        @Override
        public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            return new ColumnarReader(this, (Bucket) partition);
        }

        /** A decoder of this read's events (its registry refreshed from the relay once when needed). */
        RowDecoder decoder(EventWalk walk) {
            SourceOptions o = opts;
            // the fetch thread owns the cursor's client (a RelayClient is not thread-safe): a
            // schema refresh, rare, takes a client of its own
            return new RowDecoder(Registry.parse(registryJson),
                () -> Registry.parse((o.prefetchBatches > 0 ? new RelayClient(o) : walk.cursor.conn)
                    .register(srcIds)),
                row, o.flat, o.changelog);
        }
    }

    private final EventWalk walk;
    private final RowDecoder decoder;
    private InternalRow current;
    private final boolean changelog;
    private List<InternalRow> ready;       // a changelog read: the last window's change rows
    private int readyAt;
    private final boolean newest;          // newestPerKey
    private java.util.Iterator<InternalRow> kept;  // newestPerKey: the rows kept, once read

    /** A key of one source (an integer key, else its bytes). */
    private record Key(int src, long intKey, java.nio.ByteBuffer bytes) {}

    /** The n-th truncate of the read: never replaced by a later one. */
    private record Truncate(long n) {}

    BucketReader(Factory f, Bucket b) {
        SourceOptions o = f.opts();
        changelog = o.changelog;
        if (changelog && b.windowOffset() >= 0) {
            // a window's net changes need the whole window (this reader's offsets never split one)
            throw DatabusSourceException.config("databus changelog: the checkpoint starts inside window "
                + b.windowScn() + " (offset " + b.windowOffset() + "); a changelog read starts on a window "
                + "boundary: use a new checkpointLocation");
        }
        newest = o.newestPerKey;
        walk = new EventWalk(o, f.srcIds(), b);
        decoder = f.decoder(walk);
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

    @Override
    public boolean next() {
        if (newest) {
            if (kept == null) {
                kept = readNewest();
            }
            if (!kept.hasNext()) {
                return false;
            }
            current = kept.next();
            return true;
        }
        if (ready != null && readyAt < ready.size()) {  // a changelog window's rows
            current = ready.get(readyAt++);
            return true;
        }
        while (true) {
            EventWalk.Kind k = walk.step();
            if (k == EventWalk.Kind.END) {
                return false;
            }
            Wire event = walk.event;
            if (k == EventWalk.Kind.EOP) {
                if (changelog) {
                    ready = decoder.endWindow(event.timestampNs);
                    readyAt = 0;
                    if (!ready.isEmpty()) {
                        current = ready.get(readyAt++);
                        return true;
                    }
                }
                continue;
            }
            current = decoder.decode(walk.data, event, walk.index);
            if (!changelog) {
                return true;
            }
            // a changelog read: folded into the window's net changes
        }
    }

    /** Where a kept event is: its page, its offset there, its index in its window. */
    private record At(byte[] page, int off, int index) {}

    /**
     * newestPerKey: the whole read walked, then the rows of each key's newest event and of
     * every truncate, decoded one by one as Spark asks, in the order of those events.
     */
    private java.util.Iterator<InternalRow> readNewest() {
        // access order: a key's newer event moves it last, so the map iterates in the order
        // of each key's newest event
        java.util.LinkedHashMap<Object, At> kept = new java.util.LinkedHashMap<>(1024, 0.75f, true);
        long truncates = 0;
        while (true) {
            EventWalk.Kind k = walk.step();
            if (k == EventWalk.Kind.END) {
                break;
            }
            if (k == EventWalk.Kind.EOP) {
                continue;
            }
            Wire e = walk.event;
            Object key;
            if ((e.attributes & 7) == 5) {
                key = new Truncate(truncates++);
            } else if (e.keyBytes) {
                key = new Key(e.srcId, 0, java.nio.ByteBuffer.wrap(
                    java.util.Arrays.copyOfRange(walk.data, e.keyOff, e.keyOff + e.keyLen)));
            } else {
                key = new Key(e.srcId, e.intKey, null);
            }
            kept.put(key, new At(walk.data, walk.eventOffset(), walk.index));
        }
        java.util.Iterator<At> events = kept.values().iterator();
        Wire w = new Wire();
        return new java.util.Iterator<>() {
            @Override
            public boolean hasNext() {
                return events.hasNext();
            }

            @Override
            public InternalRow next() {
                At a = events.next();
                w.parse(a.page(), a.off(), a.page().length);
                return decoder.decode(a.page(), w, a.index());
            }
        };
    }

    @Override
    public InternalRow get() {
        return current;
    }

    /** Drops the page and stops the fetch thread: interrupted (its request aborted), joined. */
    @Override
    public void close() {
        walk.close();
    }

    /**
     * The fetch side of a bucket read: the checkpoint of the next {@code /stream} request, and
     * the requests. Used by one thread at a time (the fetch thread, else the task's).
     */
    static final class Cursor {
        final RelayClient conn;
        private final SourceOptions o;
        private final List<Integer> srcIds;
        private final String filter;
        private final long endScn;
        private long cpScn;
        private long cpOffset;
        private long cpPrev;
        boolean finished;  // the end window was seen (or a page the task will fail on)
        private int size;  // the byte budget of the next request

        /** The first request's budget when fetching ahead (see {@link #next}). */
        static final int FIRST_PAGE = 1024 * 1024;
        /** A newest-per-key read's pages, in fetchBytes (4: 32 MiB by default, half the
         *  relay's default largest answer). */
        static final long NEWEST_PAGES = 4;

        Cursor(SourceOptions o, List<Integer> srcIds, String filter, Bucket b) {
            this.o = o;
            this.srcIds = srcIds;
            this.filter = filter;
            endScn = b.endScn();
            cpScn = b.windowScn();
            cpOffset = b.windowOffset();
            cpPrev = b.prevScn();
            conn = new RelayClient(o);
            finished = cpOffset < 0 && cpScn >= endScn;
            // newest per key reads the whole range before it gives a row: no small first
            // page, and pages of NEWEST_PAGES x fetchBytes of the relay's events, which the
            // relay reduces per answer (a 1M-change benchmark's partition range in one
            // answer: 1.47 s against 1.83 s, bench/results/spark_lakehouse.md)
            size = o.newestPerKey ? (int) Math.min(Integer.MAX_VALUE / 2, NEWEST_PAGES * o.fetchBytes)
                 : o.prefetchBatches > 0 ? Math.min(o.fetchBytes, FIRST_PAGE) : o.fetchBytes;
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

        /**
         * The next page of the read, the cursor moved past it; null after the end window.
         * When fetching ahead the budget starts at {@link #FIRST_PAGE} and doubles per page
         * up to {@code fetchBytes}: the task starts decoding after a small first page
         * instead of waiting for a whole {@code fetchBytes} one, and the larger pages that
         * follow are fetched while it decodes.
         */
        byte[] next() {
            if (finished) {
                return null;
            }
            byte[] page = fetch();
            if (!o.newestPerKey) {
                size = (int) Math.min(o.fetchBytes, 2L * size);
            }
            advance(page);
            return page;
        }

        /**
         * Moves the cursor past {@code page} from its event headers only (length, source,
         * SCN): end-of-window events close windows, data events count into the open one. A
         * header too damaged to walk ends the read here: the task's full check of the same
         * bytes ({@link Wire#parse}) fails at or before it, with today's CorruptEvent.
         */
        void advance(byte[] page) {
            long win = -1;
            int count = 0;
            int p = 0;
            while (p < page.length) {
                int total = page.length - p < Wire.HEADER_LEN ? -1 : Wire.i32(page, p + 17);
                if (total < Wire.HEADER_LEN || total > page.length - p) {
                    finished = true;
                    return;
                }
                int src = Wire.i32(page, p + 31);
                long scn = Wire.i64(page, p + 37);
                p += total;
                if (src == Wire.SRC_EOP) {
                    eop(scn);
                    win = -1;
                    count = 0;
                    if (scn >= endScn) {
                        finished = true;
                        return;
                    }
                } else if (src >= 0) {
                    win = scn;
                    count++;
                }
            }
            if (win != -1) {
                partial(win, count);
            }
        }

        /** The next non-empty response of this bucket read (see the class comment). */
        private byte[] fetch() {
            long failingSince = -1;
            long behindSince = -1;
            int emptyAtTop = 0;
            double delay = 0.2;
            while (true) {
                RelayClient.Response r;
                try {
                    // newest per key: the relay reduces each answer to each key's last event
                    // up to this read's end; this reader's own map reduces across answers
                    r = conn.stream(checkpoint(), srcIds, size, filter, 1.0,
                                    o.newestPerKey ? endScn : -1);
                } catch (DatabusSourceException e) {
                    if (size > o.fetchBytes && "InvalidRequest".equals(e.code())) {
                        // a relay whose stream.max_size is below a newest-per-key page:
                        // pages of fetchBytes, as without newestPerKey (less is reduced)
                        size = o.fetchBytes;
                        continue;
                    }
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
    }
}
