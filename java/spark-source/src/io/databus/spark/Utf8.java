package io.databus.spark;

/** Strict UTF-8, as Python's decoder: no overlongs, surrogates or code points above U+10FFFF. */
final class Utf8 {
    private Utf8() {}

    static boolean valid(byte[] s, int off, int n) {
        int i = off;
        int end = off + n;
        while (i < end) {
            int c = s[i] & 0xff;
            if (c < 0x80) {
                i++;
                continue;
            }
            int more;
            int lo = 0x80;
            int hi = 0xBF;
            if (c >= 0xC2 && c <= 0xDF) {
                more = 1;
            } else if (c == 0xE0) {
                more = 2;
                lo = 0xA0;
            } else if (c == 0xED) {
                more = 2;
                hi = 0x9F;
            } else if (c >= 0xE1 && c <= 0xEF) {
                more = 2;
            } else if (c == 0xF0) {
                more = 3;
                lo = 0x90;
            } else if (c >= 0xF1 && c <= 0xF3) {
                more = 3;
            } else if (c == 0xF4) {
                more = 3;
                hi = 0x8F;
            } else {
                return false;
            }
            if (more > end - 1 - i) {
                return false;
            }
            int b1 = s[i + 1] & 0xff;
            if (b1 < lo || b1 > hi) {
                return false;
            }
            for (int k = 2; k <= more; k++) {
                if ((s[i + k] & 0xC0) != 0x80) {
                    return false;
                }
            }
            i += more + 1;
        }
        return true;
    }
}
