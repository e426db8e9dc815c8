package io.databus.spark;

import java.util.zip.CRC32;

/**
 * One event of a relay response (layout v2, docs/event-format.md), checked exactly as
 * {@code databus.core.event.decode} checks it: version, magic, header length, both CRCs,
 * lengths, key and parts. {@link #parse} fills this holder (no allocation per event).
 */
final class Wire {
    static final int HEADER_LEN = 45;
    static final int MAGIC = 0xCAFEDEED;
    static final int SRC_EOP = -2;
    /** A reduced answer's count of a window's data events left out before the next event. */
    static final int SRC_DROPPED = -51;
    static final int ATTR_KEY_BYTES = 0x0008;
    static final int ATTR_HAS_METADATA = 0x0010;
    static final int ATTR_SNAPSHOT = 0x0020;

    private final CRC32 crc = new CRC32();

    int total;
    int attributes;
    long timestampNs;
    int srcId;
    long scn;
    boolean keyBytes;
    long intKey;
    int keyOff;
    int keyLen;
    int metaOff = -1;   // -1: no metadata part
    int metaLen;
    int digestOff;
    int digestLen;
    int payloadOff;
    int payloadLen;

    static int i32(byte[] b, int p) {
        return (b[p] & 0xff) << 24 | (b[p + 1] & 0xff) << 16 | (b[p + 2] & 0xff) << 8 | (b[p + 3] & 0xff);
    }

    static long i64(byte[] b, int p) {
        return ((long) i32(b, p) << 32) | (i32(b, p + 4) & 0xffffffffL);
    }

    /** The event at {@code off} of {@code buf[0, end)}; CorruptEvent when damaged. */
    void parse(byte[] buf, int off, int end) {
        if (end - off < HEADER_LEN) {
            throw DatabusSourceException.corrupt("truncated header at offset " + off);
        }
        if (buf[off] != 2 || i32(buf, off + 1) != MAGIC || i32(buf, off + 5) != HEADER_LEN) {
            throw DatabusSourceException.corrupt("not a v2 event at offset " + off);
        }
        crc.reset();
        crc.update(buf, off, 9);
        crc.update(buf, off + 13, HEADER_LEN - 13);
        if ((int) crc.getValue() != i32(buf, off + 9)) {
            throw DatabusSourceException.corrupt("header CRC mismatch at offset " + off);
        }
        total = i32(buf, off + 17);
        if (total < HEADER_LEN + 8 + 7 || total > end - off) {
            throw DatabusSourceException.corrupt("bad total length " + total + " at offset " + off);
        }
        crc.reset();
        crc.update(buf, off + HEADER_LEN, total - HEADER_LEN);
        if ((int) crc.getValue() != i32(buf, off + 13)) {
            throw DatabusSourceException.corrupt("body CRC mismatch at offset " + off);
        }
        attributes = (buf[off + 21] & 0xff) << 8 | (buf[off + 22] & 0xff);
        timestampNs = i64(buf, off + 23);
        srcId = i32(buf, off + 31);
        scn = i64(buf, off + 37);
        int evEnd = off + total;
        int p = off + HEADER_LEN;
        keyBytes = (attributes & ATTR_KEY_BYTES) != 0;
        if (keyBytes) {
            keyLen = i32(buf, p);
            if (keyLen < 0 || keyLen > evEnd - p - 4) {
                throw DatabusSourceException.corrupt("bad key length at offset " + off);
            }
            keyOff = p + 4;
            p += 4 + keyLen;
        } else {
            if (evEnd - p < 8) {
                throw DatabusSourceException.corrupt("truncated body at offset " + off);
            }
            intKey = i64(buf, p);
            p += 8;
        }
        metaOff = -1;
        if ((attributes & ATTR_HAS_METADATA) != 0) {
            p = part(buf, p, evEnd, off);
            metaOff = payloadOff;
            metaLen = payloadLen;
        }
        p = part(buf, p, evEnd, off);
        if (p != evEnd) {
            throw DatabusSourceException.corrupt("body length mismatch at offset " + off);
        }
    }

    /** A part (int32 length, int16 version, uint8 digest length, digest, data). */
    private int part(byte[] buf, int p, int evEnd, int off) {
        if (evEnd - p < 7) {
            throw DatabusSourceException.corrupt("truncated body at offset " + off);
        }
        int dlen = i32(buf, p);
        int glen = buf[p + 6] & 0xff;
        p += 7;
        if (dlen < 0 || (long) glen + dlen > evEnd - p) {
            throw DatabusSourceException.corrupt("bad part length");
        }
        digestOff = p;
        digestLen = glen;
        payloadOff = p + glen;
        payloadLen = dlen;
        return p + glen + dlen;
    }

    boolean isControl() {
        return srcId < 0;
    }

    boolean isEop() {
        return srcId == SRC_EOP;
    }
}
