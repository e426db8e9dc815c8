package io.databus.spark;

import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.HashMap;

/**
 * What a {@code newestPerKey} partition read keeps while it walks: for each (source, key) the
 * place of the key's newest event (its page, its offset there, its index in its window), and
 * a place for every truncate (never replaced). Each place remembers the ordinal of its event
 * in the read, so {@link #inOrder} gives them in the order those events were committed.
 *
 * <p>Written by hand rather than a {@code java.util} map: with a {@code LinkedHashMap} in
 * access order of (source, key) records (a key and a place object allocated per event, the
 * entry relinked at each newer change) the map took 54% of a relay-newest read's task time
 * (JFR samples of {@code bench.spark_lakehouse}'s reads, 333k changes per table,
 * 2026-11-30); here integer keys live in an open-addressing table over primitive arrays and
 * places in parallel arrays, updated in place, nothing allocated per event. Spark's class
 * path has no primitive-collections library to use instead. Keys given as bytes (a key that
 * is not one integer column, rarer) keep a {@code HashMap} from the key's bytes to its place.
 *
 * <p>Only the pages holding a kept event stay referenced (a replaced place drops its page).
 * Not thread-safe: one per partition read.
 */
final class NewestPerKey {

    private static final int EMPTY = -1;

    // the places: one per key and per truncate
    private byte[][] pages = new byte[1024][];
    private int[] offsets = new int[1024];
    private int[] indexes = new int[1024];
    private int[] ordinals = new int[1024];
    private int places;
    private int events;    // the ordinal the next event gets

    // integer keys: linear probing; a slot holds a place number, or EMPTY
    private long[] keys = new long[2048];
    private int[] sources = new int[2048];
    private int[] slots = filled(2048);
    private int used;

    private HashMap<BytesKey, Integer> bytesKeys;  // keys given as bytes, made when one comes

    private record BytesKey(int src, ByteBuffer bytes) {}

    /** The event at {@code off} of {@code page} (index {@code index}) is {@code key}'s newest so far. */
    void intKey(int src, long key, byte[] page, int off, int index) {
        int mask = slots.length - 1;
        int at = hash(src, key) & mask;
        while (true) {
            int place = slots[at];
            if (place == EMPTY) {
                place = newPlace();
                slots[at] = place;
                keys[at] = key;
                sources[at] = src;
                set(place, page, off, index);
                if (++used * 2 > slots.length) {
                    grow();
                }
                return;
            }
            if (keys[at] == key && sources[at] == src) {
                set(place, page, off, index);
                return;
            }
            at = (at + 1) & mask;
        }
    }

    /** As {@link #intKey}, for a key given as bytes ({@code keyLen} bytes at {@code keyOff} of {@code page}). */
    void bytesKey(int src, int keyOff, int keyLen, byte[] page, int off, int index) {
        if (bytesKeys == null) {
            bytesKeys = new HashMap<>();
        }
        BytesKey k = new BytesKey(src, ByteBuffer.wrap(Arrays.copyOfRange(page, keyOff, keyOff + keyLen)));
        Integer place = bytesKeys.get(k);
        if (place == null) {
            place = newPlace();
            bytesKeys.put(k, place);
        }
        set(place, page, off, index);
    }

    /** A truncate: kept whatever comes after it. */
    void truncate(byte[] page, int off, int index) {
        set(newPlace(), page, off, index);
    }

    /** The places, in the order of their events. */
    int[] inOrder() {
        long[] order = new long[places];
        for (int p = 0; p < places; p++) {
            order[p] = (long) ordinals[p] << 32 | p;
        }
        Arrays.sort(order);
        int[] out = new int[places];
        for (int i = 0; i < places; i++) {
            out[i] = (int) order[i];  // the low half: the place
        }
        return out;
    }

    byte[] page(int place) {
        return pages[place];
    }

    int offset(int place) {
        return offsets[place];
    }

    int index(int place) {
        return indexes[place];
    }

    private void set(int place, byte[] page, int off, int index) {
        pages[place] = page;
        offsets[place] = off;
        indexes[place] = index;
        ordinals[place] = events++;
    }

    private int newPlace() {
        if (places == pages.length) {
            int n = places * 2;
            pages = Arrays.copyOf(pages, n);
            offsets = Arrays.copyOf(offsets, n);
            indexes = Arrays.copyOf(indexes, n);
            ordinals = Arrays.copyOf(ordinals, n);
        }
        return places++;
    }

    private void grow() {
        long[] oldKeys = keys;
        int[] oldSources = sources;
        int[] oldSlots = slots;
        int n = oldSlots.length * 2;
        keys = new long[n];
        sources = new int[n];
        slots = filled(n);
        int mask = n - 1;
        for (int i = 0; i < oldSlots.length; i++) {
            if (oldSlots[i] != EMPTY) {
                int at = hash(oldSources[i], oldKeys[i]) & mask;
                while (slots[at] != EMPTY) {
                    at = (at + 1) & mask;
                }
                slots[at] = oldSlots[i];
                keys[at] = oldKeys[i];
                sources[at] = oldSources[i];
            }
        }
    }

    /**
     * Every bit of the key reaches the table's index bits (a 64-bit finalizer, as MurmurHash3's):
     * keys come as the wire's eight bytes, so small integers differ only in their high bits, and
     * a MOD bucket's keys share their low ones.
     */
    private static int hash(int src, long key) {
        long z = key ^ (src * 0x9E3779B97F4A7C15L);
        z = (z ^ (z >>> 33)) * 0xFF51AFD7ED558CCDL;
        z = (z ^ (z >>> 33)) * 0xC4CEB9FE1A85EC53L;
        return (int) (z ^ (z >>> 33));
    }

    private static int[] filled(int n) {
        int[] a = new int[n];
        Arrays.fill(a, EMPTY);
        return a;
    }
}
