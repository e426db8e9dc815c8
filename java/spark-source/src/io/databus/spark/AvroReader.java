package io.databus.spark;

import java.nio.charset.StandardCharsets;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Avro binary over a slice of a byte array, every read checked against the slice's end:
 * truncated or malformed input (a varint beyond 64 bits, a negative length, invalid UTF-8)
 * is a {@code SchemaError} naming {@link #what}, never a read out of bounds.
 */
final class AvroReader {
    final byte[] buf;
    int pos;
    private final int end;
    private final String what;

    AvroReader(byte[] buf, int pos, int end, String what) {
        this.buf = buf;
        this.pos = pos;
        this.end = end;
        this.what = what;
    }

    DatabusSourceException bad(String detail) {
        return DatabusSourceException.schema("cannot decode " + what + ": " + detail);
    }

    long zlong() {
        long v = 0;
        for (int shift = 0; shift < 70; shift += 7) {
            if (pos >= end) {
                throw bad("truncated");
            }
            int b = buf[pos++] & 0xff;
            if (shift == 63 && (b & 0x7e) != 0) {
                throw bad("varint beyond 64 bits");
            }
            v |= (long) (b & 0x7f) << shift;
            if ((b & 0x80) == 0) {
                return (v >>> 1) ^ -(v & 1);
            }
        }
        throw bad("varint too long");
    }

    boolean bool() {
        if (pos >= end || (buf[pos] & 0xff) > 1) {
            throw bad("boolean");
        }
        return buf[pos++] != 0;
    }

    float float32() {
        if (end - pos < 4) {
            throw bad("truncated");
        }
        int bits = (buf[pos] & 0xff) | (buf[pos + 1] & 0xff) << 8 | (buf[pos + 2] & 0xff) << 16
            | (buf[pos + 3] & 0xff) << 24;
        pos += 4;
        return Float.intBitsToFloat(bits);
    }

    double float64() {
        if (end - pos < 8) {
            throw bad("truncated");
        }
        long bits = 0;
        for (int i = 7; i >= 0; i--) {
            bits = bits << 8 | (buf[pos + i] & 0xff);
        }
        pos += 8;
        return Double.longBitsToDouble(bits);
    }

    /** The span of a string/bytes value: its length (the data starts at {@code pos - len}). */
    int span() {
        long len = zlong();
        if (len < 0 || len > end - pos) {
            throw bad("bad length " + len);
        }
        pos += (int) len;
        return (int) len;
    }

    byte[] bytes() {
        int n = span();
        byte[] out = new byte[n];
        System.arraycopy(buf, pos - n, out, 0, n);
        return out;
    }

    byte[] fixed(int n) {
        if (n < 0 || end - pos < n) {
            throw bad("truncated");
        }
        byte[] out = new byte[n];
        System.arraycopy(buf, pos, out, 0, n);
        pos += n;
        return out;
    }

    UTF8String utf8() {
        int n = span();
        if (!Utf8.valid(buf, pos - n, n)) {
            throw bad("invalid UTF-8");
        }
        return UTF8String.fromBytes(buf, pos - n, n);
    }

    /** The span of a string value, checked UTF-8: its length (the data starts at {@code pos - len}). */
    int utf8Span() {
        int n = span();
        if (!Utf8.valid(buf, pos - n, n)) {
            throw bad("invalid UTF-8");
        }
        return n;
    }

    long blockCount() {
        long n = zlong();
        if (n < 0) {  // a negative count is followed by the block's byte size
            zlong();
            n = -n;
        }
        return n;
    }

    static String text(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }
}
