package io.databus.spark;

import java.util.List;
import java.util.function.Supplier;

/**
 * Driver-side relay reads: the newest window, and how far a batch may go under a row or
 * byte limit ({@code databus.spark.reading.relay_top} and {@code scan_limit}).
 */
final class Planning {
    private Planning() {}

    /** Where a planning scan stopped: the last whole window taken and its predecessor. */
    record Scan(long scn, long prevScn, long rows) {}

    /** A size estimate: event bytes and data events. */
    record Size(long bytes, long rows) {}

    /**
     * The estimated event bytes and data events of the windows in {@code (startScn, endScn]},
     * from the relay's own buffer figures ({@code /containerStats/buffer}: bytes and events
     * held, oldest and newest window), without reading the windows: the buffer's totals
     * times the share of its SCN span {@code [min_scn, max_scn]} that the range covers.
     * Exact when the range covers the whole buffer (a query from {@code earliest}); else
     * it assumes bytes spread evenly over SCNs. An over-estimate when the query reads some
     * of the relay's sources (the buffer holds all of them). Wire bytes, not the decoded
     * rows' size. {@code (0, 0)} for an empty range.
     */
    static Size estimate(RelayClient conn, long startScn, long endScn) {
        if (endScn <= startScn) {
            return new Size(0, 0);
        }
        com.fasterxml.jackson.databind.JsonNode b = conn.bufferStats();
        long used = b.path("used_bytes").asLong(0);
        long events = b.path("events").asLong(0);
        long min = b.path("min_scn").asLong(-1);
        long max = b.path("max_scn").asLong(-1);
        if (used <= 0 || max < 0) {
            return new Size(0, 0);
        }
        if (min < 0 || min > max) {
            min = max;
        }
        // windows held: SCNs min..max; the range takes the SCNs in (startScn, endScn]
        double span = (double) max - min + 1;
        double covered = Math.min(endScn, max) - Math.max(startScn, min - 1);
        double share = Math.max(0.0, Math.min(1.0, covered / span));
        return new Size((long) Math.ceil(used * share), (long) Math.ceil(events * share));
    }

    /**
     * How far the windows after {@code (scn, prev)} are behind the relay's newest window,
     * for the query's progress ({@link DatabusStream#metrics}), from one look at the
     * relay's buffer figures and one header: {@code windows} and {@code bytes} estimated as
     * in {@link #estimate} (the buffer's windows and bytes times the share of its SCN span
     * the range covers: exact for the whole buffer, else assuming windows spread evenly over
     * SCNs); {@code seconds} exact: now minus the commit time of the oldest window not yet
     * read (0 when none is). {@code newest} is the relay's newest window.
     */
    record Lag(long newest, long windows, long bytes, double seconds) {}

    static Lag lag(RelayClient conn, List<Integer> srcIds, long scn, long prev) {
        com.fasterxml.jackson.databind.JsonNode b = conn.bufferStats();
        long max = b.path("max_scn").asLong(-1);
        long min = b.path("min_scn").asLong(-1);
        if (max <= scn) {
            return new Lag(max, 0, 0, 0.0);
        }
        if (min < 0 || min > max) {
            min = max;
        }
        double span = (double) max - min + 1;
        double share = Math.max(0.0, Math.min(1.0, (max - Math.max(scn, min - 1)) / span));
        long windows = Math.max(1, (long) Math.ceil(b.path("windows").asLong(0) * share));
        long bytes = (long) Math.ceil(b.path("used_bytes").asLong(0) * share);
        // a one-byte budget returns the first event after the position: its header's time
        byte[] first = conn.stream(after(scn, prev), srcIds, 1, null, 0.0).data();
        double seconds = 0.0;
        if (first.length >= Wire.HEADER_LEN) {
            Wire w = new Wire();
            w.parse(first, 0, first.length);
            long nowNs = java.time.Instant.now().getEpochSecond() * 1_000_000_000L
                + java.time.Instant.now().getNano();
            seconds = Math.max(0.0, (nowNs - w.timestampNs) / 1e9);
        }
        return new Lag(max, windows, bytes, seconds);
    }

    /** {@code call}, retrying a transient failure (relay restarting) for {@code retrySeconds}. */
    static <T> T retrying(Supplier<T> call, double retrySeconds) {
        double delay = 0.2;
        long deadline = System.nanoTime() + (long) (retrySeconds * 1e9);
        while (true) {
            try {
                return call.get();
            } catch (DatabusSourceException e) {
                if (!e.isTransient() || System.nanoTime() >= deadline) {
                    throw e;
                }
                try {
                    Thread.sleep((long) (delay * 1000));
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    throw e;
                }
                delay = Math.min(delay * 2, 2.0);
            }
        }
    }

    /** The newest window SCN the relay holds (-1 when empty). */
    static long relayTop(RelayClient conn, List<Integer> srcIds, double retrySeconds) {
        // a one-byte budget returns at most one event; only the header matters
        return retrying(() -> conn.stream(null, srcIds, 1, null, 0.0).maxScn(), retrySeconds);
    }

    private static String after(long scn, long prev) {
        return scn == -1 ? null : "{\"prevScn\":" + prev + ",\"windowOffset\":-1,\"windowScn\":" + scn + "}";
    }

    /**
     * Whole windows after {@code (startScn, startPrev)} up to {@code top} within the limits.
     * At least one window is taken even when it alone exceeds a limit (or the fetch budget:
     * the relay then serves a prefix of it). Only event headers are read.
     */
    static Scan scanLimit(RelayClient conn, List<Integer> srcIds, long startScn, long startPrev, long top,
                          Long maxRows, Long maxBytes, int fetchBytes, double retrySeconds) {
        String cp = after(startScn, startPrev);
        long rows = 0;
        long used = 0;
        long last = startScn;
        long prev = startPrev;
        while (last < top) {
            int budget = maxBytes == null ? fetchBytes : (int) Math.max(Math.min(fetchBytes, maxBytes - used), 1);
            String at = cp;
            byte[] data = retrying(() -> conn.stream(at, srcIds, budget, null, 0.0).data(), retrySeconds);
            if (data.length == 0) {
                break;
            }
            int off = 0;
            long winRows = 0;
            long winBytes = 0;
            boolean ended = false;
            while (off < data.length) {
                if (data.length - off < Wire.HEADER_LEN) {
                    throw DatabusSourceException.corrupt("truncated header at offset " + off);
                }
                int length = Wire.i32(data, off + 17);
                if (length < Wire.HEADER_LEN) {
                    throw DatabusSourceException.corrupt("bad total length " + length + " at offset " + off);
                }
                winBytes += length;
                if (Wire.i32(data, off + 31) != Wire.SRC_EOP) {
                    winRows++;
                    off += length;
                    continue;
                }
                long scn = Wire.i64(data, off + 37);
                off += length;
                ended = true;
                boolean over = (maxRows != null && rows + winRows > maxRows)
                    || (maxBytes != null && used + winBytes > maxBytes);
                if (over && last != startScn) {
                    return new Scan(last, prev, rows);
                }
                rows += winRows;
                used += winBytes;
                prev = last;
                last = scn;
                winRows = 0;
                winBytes = 0;
                if (over || scn >= top) {
                    return new Scan(last, prev, rows);
                }
            }
            if (!ended) {
                // the next window alone exceeds the budget: only a prefix of it came
                if (last != startScn) {
                    return new Scan(last, prev, rows);
                }
                return new Scan(Wire.i64(data, 37), last, rows + winRows);
            }
            cp = after(last, prev);
        }
        return new Scan(last, prev, rows);
    }
}
