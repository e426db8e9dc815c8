package io.databus.spark;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;

/**
 * newestPerKey: where each key's newest event of a read is, and every truncate, in the
 * order of those events (the order a consumer applying them must keep).
 *
 * <p>Events are noted in read order (page, offset, index in window); a key's newer event
 * marks its older one dead. Integer keys, by far the common kind, are looked up in an open
 * addressing table of (source, key) held in primitive arrays; byte keys in a
 * {@link HashMap}. Written by hand instead of one {@code LinkedHashMap} of key records, for
 * a measured reason: that map's puts (an entry object, a boxed record key, access-order
 * relinking, a record {@code hashCode}/{@code equals} through method handles) were the
 * hottest frames of a newestPerKey read into Delta (JFR, bench/results/spark_lakehouse.md).
 */
final class NewestEvents {
    private final List<byte[]> pages = new ArrayList<>();
    private byte[] lastPage;
    // per noted event, in read order
    private int[] pageOf = new int[1024];
    private int[] offOf = new int[1024];
    private int[] indexOf = new int[1024];
    private long[] alive = new long[16];
    private int count;
    // integer keys: slot -> (source, key) and the position of its newest event + 1 (0: free)
    private long[] keys = new long[1024];
    private int[] srcs = new int[1024];
    private int[] at = new int[1024];
    private int used;
    private HashMap<ByteKey, Integer> byteKeys;

    /** A byte key of one source. */
    private record ByteKey(int src, ByteBuffer bytes) {}

    /** Notes the event at {@code off} of {@code page}: a key's newest so far. */
    void key(byte[] page, int off, int index, Wire e) {
        int pos = note(page, off, index);
        int older;
        if (e.keyBytes) {
            if (byteKeys == null) {
                byteKeys = new HashMap<>();
            }
            ByteBuffer k = ByteBuffer.wrap(Arrays.copyOfRange(page, e.keyOff, e.keyOff + e.keyLen));
            Integer was = byteKeys.put(new ByteKey(e.srcId, k), pos);
            older = was == null ? -1 : was;
        } else {
            older = putInt(e.srcId, e.intKey, pos);
        }
        if (older >= 0) {
            alive[older >>> 6] &= ~(1L << older);
        }
    }

    /** Notes a truncate: kept whatever follows. */
    void truncate(byte[] page, int off, int index) {
        note(page, off, index);
    }

    /** The position of the first kept event at or after {@code from}; -1 past the last. */
    int nextKept(int from) {
        if (from >= count) {
            return -1;
        }
        int w = from >>> 6;
        long word = alive[w] & (-1L << from);
        while (word == 0) {
            if (++w >= alive.length || (long) w << 6 >= count) {
                return -1;
            }
            word = alive[w];
        }
        int p = (w << 6) + Long.numberOfTrailingZeros(word);
        return p < count ? p : -1;
    }

    byte[] page(int pos) {
        return pages.get(pageOf[pos]);
    }

    int offset(int pos) {
        return offOf[pos];
    }

    int index(int pos) {
        return indexOf[pos];
    }

    private int note(byte[] page, int off, int index) {
        if (page != lastPage) {
            pages.add(page);
            lastPage = page;
        }
        if (count == pageOf.length) {
            int n = count * 2;
            pageOf = Arrays.copyOf(pageOf, n);
            offOf = Arrays.copyOf(offOf, n);
            indexOf = Arrays.copyOf(indexOf, n);
        }
        if ((count >>> 6) >= alive.length) {
            alive = Arrays.copyOf(alive, alive.length * 2);
        }
        int pos = count++;
        pageOf[pos] = pages.size() - 1;
        offOf[pos] = off;
        indexOf[pos] = index;
        alive[pos >>> 6] |= 1L << pos;
        return pos;
    }

    /** Maps (src, key) to {@code pos}; the position it held before, else -1. */
    private int putInt(int src, long key, int pos) {
        if (2 * (used + 1) > keys.length) {
            grow();
        }
        int mask = keys.length - 1;
        int i = slot(src, key, mask);
        while (at[i] != 0) {
            if (keys[i] == key && srcs[i] == src) {
                int was = at[i] - 1;
                at[i] = pos + 1;
                return was;
            }
            i = (i + 1) & mask;
        }
        keys[i] = key;
        srcs[i] = src;
        at[i] = pos + 1;
        used++;
        return -1;
    }

    private static int slot(int src, long key, int mask) {
        long h = (key ^ ((long) src << 32)) * 0x9E3779B97F4A7C15L;  // Fibonacci hashing
        return (int) (h ^ (h >>> 32)) & mask;
    }

    private void grow() {
        long[] oldKeys = keys;
        int[] oldSrcs = srcs;
        int[] oldAt = at;
        int n = oldKeys.length * 2;
        keys = new long[n];
        srcs = new int[n];
        at = new int[n];
        int mask = n - 1;
        for (int j = 0; j < oldKeys.length; j++) {
            if (oldAt[j] != 0) {
                int i = slot(oldSrcs[j], oldKeys[j], mask);
                while (at[i] != 0) {
                    i = (i + 1) & mask;
                }
                keys[i] = oldKeys[j];
                srcs[i] = oldSrcs[j];
                at[i] = oldAt[j];
            }
        }
    }
}
