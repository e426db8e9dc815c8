package io.databus.spark;

import java.util.List;
import java.util.concurrent.SynchronousQueue;
import java.util.concurrent.TimeUnit;
import org.apache.spark.TaskContext;

/**
 * The events of one bucket read, in the relay's order: what both partition readers (rows,
 * {@link BucketReader}; columnar batches, {@link ColumnarReader}) walk. {@link #step} moves
 * to the next data event or end-of-window event of the windows after the bucket's start
 * checkpoint through window {@code endScn}, every event checked in full ({@link Wire#parse});
 * {@link #index} counts the bucket's data events inside each window (a read that starts
 * inside a window starts at its {@code windowOffset}).
 *
 * <p>Pages come from the {@link BucketReader.Cursor}: with {@code prefetchBatches} > 0 from
 * a thread of this walk ({@code databus-relay-fetch-<bucket>}) that asks for the next page
 * while the task decodes the current one, handed over directly (no queue: at most two pages
 * per partition); its failures are thrown by {@link #step} in the task. {@link #close}
 * (also on a task kill) interrupts it, which aborts its request, and waits for it to end.
 */
final class EventWalk {
    /** What {@link #step} found. */
    enum Kind { DATA, EOP, END }

    /** What the fetch thread hands over: a page, the end ({@code data} null), or its failure. */
    private record Page(byte[] data, Throwable error) {}

    private static final Page END = new Page(null, null);

    final BucketReader.Cursor cursor;
    /** The event {@link #step} stopped at, parsed from {@link #data}. */
    final Wire event = new Wire();
    /** The page being read. */
    byte[] data;
    /** A data event's index in its window (valid after {@code step() == DATA}). */
    int index;
    private int next;                       // the next data event's index in its window
    private final long endScn;
    private final Thread ahead;              // null: pages are fetched in the task's thread
    private final SynchronousQueue<Page> handoff = new SynchronousQueue<>();
    private final long joinMillis;
    private boolean started;
    private int off;
    private boolean done;

    EventWalk(SourceOptions o, List<Integer> srcIds, BucketReader.Bucket b) {
        endScn = b.endScn();
        next = b.windowOffset() >= 0 ? (int) b.windowOffset() : 0;
        String filter = o.partitions > 1 ? BucketReader.modFilter(srcIds, o.partitions, b.bucket()) : null;
        cursor = new BucketReader.Cursor(o, srcIds, filter, b);
        done = cursor.finished;
        joinMillis = (long) (o.httpTimeout * 1000) + 2000;
        if (o.prefetchBatches > 0 && !done) {
            ahead = new Thread(this::fetchAhead, "databus-relay-fetch-" + b.bucket());
            ahead.setDaemon(true);  // never keeps an executor JVM alive
        } else {
            ahead = null;
        }
    }

    /**
     * The next data event ({@link Kind#DATA}: {@link #event} on it, {@link #index} its index)
     * or end-of-window event ({@link Kind#EOP}), skipping other control events; END after
     * the batch's last window.
     */
    Kind step() {
        while (!done) {
            if (data == null || off >= data.length) {
                data = take();
                off = 0;
                if (data == null) {
                    done = true;
                    break;
                }
                continue;
            }
            event.parse(data, off, data.length);
            off += event.total;
            if (event.isEop()) {
                next = 0;
                if (event.scn >= endScn) {
                    done = true;
                }
                return Kind.EOP;
            }
            if (event.srcId == Wire.SRC_DROPPED) {
                // the relay left this many of the window's events out (newestPerKey):
                // the next one keeps the index it has in the whole window
                next += (int) event.intKey;
                continue;
            }
            if (event.isControl()) {
                continue;
            }
            index = next++;
            return Kind.DATA;
        }
        return Kind.END;
    }

    /** Where in {@link #data} the event {@link #step} stopped at starts. */
    int eventOffset() {
        return off - event.total;
    }

    /** The next page: from the fetch thread when there is one (started at the first call). */
    private byte[] take() {
        if (ahead == null) {
            return cursor.next();
        }
        if (!started) {
            started = true;
            ahead.start();
        }
        while (true) {
            Page p;
            try {
                p = handoff.poll(100, TimeUnit.MILLISECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new DatabusSourceException("RelayUnavailable", "interrupted", true, e);
            }
            if (p == null) {
                // a killed task stops waiting here, as Spark's own iterators do between rows
                TaskContext task = TaskContext.get();
                if (task != null) {
                    task.killTaskIfInterrupted();
                }
                if (!ahead.isAlive() && (p = handoff.poll()) == null) {
                    throw new IllegalStateException("databus source: the fetch thread of this partition ended "
                        + "without a page");
                }
                if (p == null) {
                    continue;
                }
            }
            if (p.error() instanceof RuntimeException e) {
                throw e;
            }
            if (p.error() instanceof Error e) {
                throw e;
            }
            return p.data();
        }
    }

    /** The fetch thread: hands over every page of the read, then the end, or a failure. */
    private void fetchAhead() {
        try {
            while (true) {
                byte[] page = cursor.next();
                handoff.put(page == null ? END : new Page(page, null));
                if (page == null) {
                    return;
                }
            }
        } catch (InterruptedException e) {
            // closed: nobody takes pages any more
        } catch (Throwable e) {  // every failure is the task's to throw
            try {
                handoff.put(new Page(null, e));
            } catch (InterruptedException closed) {
                // closed while handing the failure over: the task no longer reads
            }
        }
    }

    /** Drops the page and stops the fetch thread: interrupted (its request aborted), joined. */
    void close() {
        data = null;
        if (ahead != null && started) {
            ahead.interrupt();
            boolean interrupted = false;
            long until = System.nanoTime() + joinMillis * 1_000_000;
            while (ahead.isAlive() && System.nanoTime() < until) {
                try {
                    ahead.join(Math.max(1, (until - System.nanoTime()) / 1_000_000));
                } catch (InterruptedException e) {
                    interrupted = true;  // a killed task's close: finish the join, keep the flag
                }
            }
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }
}
