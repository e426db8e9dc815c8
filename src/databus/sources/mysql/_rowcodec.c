/*
 * Binlog rows events -> encoded databus events, in one pass per rows event.
 *
 * This is the compiled half of databus.sources.mysql.fastpath. A RowCodec is
 * made once per table version from a "program": one opcode per column (what
 * the binlog stores and what Avro type it becomes), built by fastpath.py from
 * the table map. RowCodec.encode() walks the row images of one rows event and
 * writes, for each row, a complete DbusEvent v2 (header, both CRCs, key,
 * metadata part, Avro payload part) straight from the binlog bytes: no Python
 * object per value.
 *
 * The output must be byte-identical to the pure-Python path (rows.py +
 * fastavro + core/event.py); tests compare both on the whole type matrix.
 * Any input that does not fit the program raises ValueError (the caller turns
 * it into CorruptEventError); nothing is ever read out of bounds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../../core/_cenc.h" /* CRC-32, Buf, Avro writers, the event and its schema */

/* ---------- opcodes (keep in step with fastpath.py) ---------- */
enum {
    OP_INT8 = 1, OP_UINT8, OP_INT16, OP_UINT16, OP_INT24, OP_UINT24, OP_INT32, OP_UINT32,
    OP_INT64, OP_UINT64_DEC, OP_FLOAT, OP_DOUBLE, OP_DECIMAL, OP_VARSTR, OP_CHAR,
    OP_BINARY_PAD, OP_BLOB, OP_ENUM, OP_SET, OP_BIT_LONG, OP_BIT_DEC, OP_YEAR, OP_DATE,
    OP_DATETIME2, OP_TIMESTAMP2, OP_TIME2
};
/* string conversions */
enum { CONV_COPY = 0, CONV_UTF8 = 1, CONV_LATIN1 = 2 };
/* key modes */
enum { KEY_INT = 0, KEY_ROWINDEX = 1, KEY_JSON = 2 };

typedef struct {
    int op;
    int a;          /* first parameter: bytes / precision / fsp / pack length */
    int b;          /* second parameter: scale / pad length */
    int conv;       /* string conversion */
    PyObject *values; /* ENUM/SET: tuple of UTF-8 bytes */
    int skip;       /* excluded by a column filter: parsed, not written */
} Col;

typedef struct {
    PyObject_HEAD
    Col *cols;
    int ncols;
    int *key_cols;
    int nkey;
    int key_mode;
    EvSchema schema;
    EvDigest meta_id;
} RowCodec;

/* ---------- input reader with bounds checks ---------- */
typedef struct {
    const unsigned char *p;
    Py_ssize_t pos, end;
    const char *table; /* for error messages */
} In;

static int need(In *in, Py_ssize_t n, int col) {
    if (n < 0 || in->pos + n > in->end) {
        PyErr_Format(PyExc_ValueError, "row image of %s truncated at column %d", in->table, col);
        return -1;
    }
    return 0;
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static uint64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* ---------- decimal: unscaled value as two's complement big-endian ---------- */
static const int DIG2BYTES[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};
static const uint32_t POW10[10] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000,
                                   100000000, 1000000000};

#define LIMBS 9 /* 288 bits: enough for 65 digits (216 bits) and 2^64 */

static void big_muladd(uint32_t *x, uint32_t mul, uint32_t add) {
    uint64_t carry = add;
    for (int i = 0; i < LIMBS; i++) {
        uint64_t t = (uint64_t)x[i] * mul + carry;
        x[i] = (uint32_t)t;
        carry = t >> 32;
    }
}

/* Writes the Avro bytes of a decimal whose magnitude is x (little-endian limbs). */
static int put_big(Buf *b, uint32_t *x, int negative) {
    int bits = 0;
    for (int i = LIMBS - 1; i >= 0; i--) {
        if (x[i]) {
            uint32_t v = x[i];
            int n = 0;
            while (v) { n++; v >>= 1; }
            bits = i * 32 + n;
            break;
        }
    }
    int nbytes = (bits + 8) / 8; /* as Python: (bit_length + 8) // 8 */
    unsigned char out[LIMBS * 4 + 1];
    for (int k = 0; k < nbytes; k++) {
        int byte_index = k; /* little-endian byte k */
        uint32_t limb = byte_index / 4 < LIMBS ? x[byte_index / 4] : 0;
        out[nbytes - 1 - k] = (unsigned char)(limb >> (8 * (byte_index % 4)));
    }
    if (negative) {
        int carry = 1;
        for (int k = nbytes - 1; k >= 0; k--) {
            int v = (unsigned char)~out[k] + carry;
            out[k] = (unsigned char)v;
            carry = v >> 8;
        }
    }
    return put_bytes(b, out, (size_t)nbytes);
}

static int decimal_value(In *in, Buf *b, int precision, int scale, int col) {
    int intg = precision - scale;
    int lead = intg % 9, tail = scale % 9;
    Py_ssize_t size = (intg / 9) * 4 + DIG2BYTES[lead] + (scale / 9) * 4 + DIG2BYTES[tail];
    if (size <= 0 || size > 40 || need(in, size, col) < 0) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "bad DECIMAL(%d,%d) in %s", precision, scale, in->table);
        return -1;
    }
    unsigned char raw[40];
    memcpy(raw, in->p + in->pos, (size_t)size);
    in->pos += size;
    int negative = !(raw[0] & 0x80);
    raw[0] ^= 0x80;
    if (negative)
        for (Py_ssize_t i = 0; i < size; i++) raw[i] = (unsigned char)~raw[i];
    uint32_t x[LIMBS] = {0};
    int p = 0;
    if (lead) {
        int n = DIG2BYTES[lead];
        big_muladd(x, POW10[lead], (uint32_t)be(raw + p, n));
        p += n;
    }
    for (int g = 0; g < intg / 9; g++) {
        big_muladd(x, POW10[9], (uint32_t)be(raw + p, 4));
        p += 4;
    }
    for (int g = 0; g < scale / 9; g++) {
        big_muladd(x, POW10[9], (uint32_t)be(raw + p, 4));
        p += 4;
    }
    if (tail) {
        int n = DIG2BYTES[tail];
        big_muladd(x, POW10[tail], (uint32_t)be(raw + p, n));
    }
    return put_big(b, x, negative);
}

/* ---------- dates ---------- */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

static int64_t frac_micros(In *in, int fsp) {
    int n = (fsp + 1) / 2;
    if (!n) return 0;
    uint64_t v = be(in->p + in->pos, n);
    in->pos += n;
    static const int64_t scale[4] = {1, 10000, 100, 1};
    return (int64_t)v * scale[n];
}

/* ---------- strings ---------- */
/* MySQL's latin1 is cp1252 with the five undefined bytes mapped to C1 controls */
static const uint16_t LATIN1_HI[32] = {
    0x20AC, 0x0081, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021,
    0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x008D, 0x017D, 0x008F,
    0x0090, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
    0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x009D, 0x017E, 0x0178};

static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { i++; continue; }
        int len;
        uint32_t cp;
        if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
        else return 0;
        if (i + (size_t)len > n) return 0;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += (size_t)len;
    }
    return 1;
}

static int put_text(Buf *b, const unsigned char *s, size_t n, int conv, int pad, In *in,
                    int col) {
    if (conv == CONV_LATIN1) {
        size_t out = 0;
        for (size_t i = 0; i < n; i++) {
            unsigned c = s[i];
            uint32_t cp = c < 0x80 ? c : (c < 0xA0 ? LATIN1_HI[c - 0x80] : c);
            out += cp < 0x80 ? 1 : (cp < 0x800 ? 2 : 3);
        }
        if (put_long(b, (int64_t)out) < 0 || buf_reserve(b, out) < 0) return -1;
        unsigned char *p = b->p + b->len;
        for (size_t i = 0; i < n; i++) {
            unsigned c = s[i];
            uint32_t cp = c < 0x80 ? c : (c < 0xA0 ? LATIN1_HI[c - 0x80] : c);
            if (cp < 0x80) *p++ = (unsigned char)cp;
            else if (cp < 0x800) {
                *p++ = (unsigned char)(0xC0 | (cp >> 6));
                *p++ = (unsigned char)(0x80 | (cp & 0x3F));
            } else {
                *p++ = (unsigned char)(0xE0 | (cp >> 12));
                *p++ = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                *p++ = (unsigned char)(0x80 | (cp & 0x3F));
            }
        }
        b->len += out;
        return 0;
    }
    if (conv == CONV_UTF8 && !utf8_valid(s, n)) {
        PyErr_Format(PyExc_ValueError, "column %d of %s is not valid UTF-8", col, in->table);
        return -1;
    }
    if (pad > 0 && (size_t)pad > n) { /* BINARY(n): the binlog drops the zero padding */
        if (put_long(b, pad) < 0 || buf_put(b, s, n) < 0 || buf_reserve(b, (size_t)pad - n) < 0)
            return -1;
        memset(b->p + b->len, 0, (size_t)pad - n);
        b->len += (size_t)pad - n;
        return 0;
    }
    return put_bytes(b, s, n);
}

/* ---------- one column value (after the union branch byte) ---------- */
static int column(RowCodec *rc, int i, In *in, Buf *b) {
    Col *c = &rc->cols[i];
    const unsigned char *p;
    switch (c->op) {
    case OP_INT8: case OP_UINT8: case OP_INT16: case OP_UINT16: case OP_INT24: case OP_UINT24:
    case OP_INT32: case OP_UINT32: case OP_INT64: {
        static const int sizes[] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 8};
        int n = sizes[c->op];
        if (need(in, n, i) < 0) return -1;
        uint64_t v = le(in->p + in->pos, n);
        in->pos += n;
        int64_t s;
        int is_signed = c->op == OP_INT8 || c->op == OP_INT16 || c->op == OP_INT24 ||
                        c->op == OP_INT32 || c->op == OP_INT64;
        if (is_signed && n < 8 && (v >> (8 * n - 1)) & 1) s = (int64_t)(v - ((uint64_t)1 << (8 * n)));
        else s = (int64_t)v;
        return put_long(b, s);
    }
    case OP_UINT64_DEC: case OP_BIT_DEC: {
        if (need(in, 8, i) < 0) return -1;
        uint64_t v = c->op == OP_UINT64_DEC ? le(in->p + in->pos, 8) : be(in->p + in->pos, 8);
        in->pos += 8;
        uint32_t x[LIMBS] = {0};
        x[0] = (uint32_t)v;
        x[1] = (uint32_t)(v >> 32);
        return put_big(b, x, 0);
    }
    case OP_FLOAT: case OP_DOUBLE: {
        int n = c->op == OP_FLOAT ? 4 : 8;
        if (need(in, n, i) < 0) return -1;
        if (buf_put(b, in->p + in->pos, (size_t)n) < 0) return -1;
        in->pos += n;
        return 0;
    }
    case OP_DECIMAL:
        return decimal_value(in, b, c->a, c->b, i);
    case OP_VARSTR: case OP_CHAR: case OP_BINARY_PAD: case OP_BLOB: {
        int lb = c->a; /* length prefix bytes */
        if (need(in, lb, i) < 0) return -1;
        Py_ssize_t n = (Py_ssize_t)le(in->p + in->pos, lb);
        in->pos += lb;
        if (need(in, n, i) < 0) return -1;
        p = in->p + in->pos;
        in->pos += n;
        return put_text(b, p, (size_t)n, c->conv, c->op == OP_BINARY_PAD ? c->b : 0, in, i);
    }
    case OP_ENUM: {
        if (need(in, c->a, i) < 0) return -1;
        Py_ssize_t idx = (Py_ssize_t)le(in->p + in->pos, c->a);
        in->pos += c->a;
        Py_ssize_t nv = PyTuple_GET_SIZE(c->values);
        if (idx < 1 || idx > nv) return put_long(b, 0);
        PyObject *v = PyTuple_GET_ITEM(c->values, idx - 1);
        return put_bytes(b, (const unsigned char *)PyBytes_AS_STRING(v),
                         (size_t)PyBytes_GET_SIZE(v));
    }
    case OP_SET: {
        if (need(in, c->a, i) < 0) return -1;
        uint64_t bits = le(in->p + in->pos, c->a);
        in->pos += c->a;
        Py_ssize_t nv = PyTuple_GET_SIZE(c->values);
        size_t total = 0;
        int first = 1;
        for (Py_ssize_t k = 0; k < nv && k < 64; k++)
            if (bits >> k & 1) {
                total += (size_t)PyBytes_GET_SIZE(PyTuple_GET_ITEM(c->values, k)) + (first ? 0 : 1);
                first = 0;
            }
        if (put_long(b, (int64_t)total) < 0) return -1;
        first = 1;
        for (Py_ssize_t k = 0; k < nv && k < 64; k++)
            if (bits >> k & 1) {
                PyObject *v = PyTuple_GET_ITEM(c->values, k);
                if ((!first && buf_byte(b, ',') < 0) ||
                    buf_put(b, PyBytes_AS_STRING(v), (size_t)PyBytes_GET_SIZE(v)) < 0)
                    return -1;
                first = 0;
            }
        return 0;
    }
    case OP_BIT_LONG: {
        if (need(in, c->a, i) < 0) return -1;
        uint64_t v = be(in->p + in->pos, c->a);
        in->pos += c->a;
        return put_long(b, (int64_t)v);
    }
    case OP_YEAR: {
        if (need(in, 1, i) < 0) return -1;
        int y = in->p[in->pos++];
        return put_long(b, y ? 1900 + y : 0);
    }
    default:
        PyErr_Format(PyExc_ValueError, "opcode %d is not a plain column", c->op);
        return -1;
    }
}

/* Temporal columns may be NULL-valued although not SQL NULL (zero dates), so they
 * write their own union branch. Returns 1 if handled here. */
static int temporal(RowCodec *rc, int i, In *in, Buf *b) {
    Col *c = &rc->cols[i];
    int n;
    switch (c->op) {
    case OP_DATE: {
        if (need(in, 3, i) < 0) return -1;
        uint64_t v = le(in->p + in->pos, 3);
        in->pos += 3;
        int y = (int)(v >> 9), m = (int)(v >> 5) & 15, d = (int)v & 31;
        if (!(y && m && d)) return buf_byte(b, 0) < 0 ? -1 : 1;
        if (buf_byte(b, 2) < 0 || put_long(b, days_from_civil(y, m, d)) < 0) return -1;
        return 1;
    }
    case OP_DATETIME2: {
        n = 5 + (c->a + 1) / 2;
        if (need(in, n, i) < 0) return -1;
        int64_t v = (int64_t)be(in->p + in->pos, 5) - 0x8000000000LL;
        in->pos += 5;
        int64_t frac = frac_micros(in, c->a);
        int64_t ym = v >> 22 & 0x1FFFF;
        int64_t y = ym / 13, mo = ym % 13, d = v >> 17 & 31;
        int64_t hh = v >> 12 & 31, mi = v >> 6 & 63, ss = v & 63;
        if (!(y && mo && d)) return buf_byte(b, 0) < 0 ? -1 : 1;
        int64_t secs = days_from_civil(y, mo, d) * 86400 + hh * 3600 + mi * 60 + ss;
        if (buf_byte(b, 2) < 0 || put_long(b, secs * 1000000 + frac) < 0) return -1;
        return 1;
    }
    case OP_TIMESTAMP2: {
        n = 4 + (c->a + 1) / 2;
        if (need(in, n, i) < 0) return -1;
        int64_t secs = (int64_t)be(in->p + in->pos, 4);
        in->pos += 4;
        int64_t frac = frac_micros(in, c->a);
        if (secs == 0 && frac == 0) return buf_byte(b, 0) < 0 ? -1 : 1;
        if (buf_byte(b, 2) < 0 || put_long(b, secs * 1000000 + frac) < 0) return -1;
        return 1;
    }
    case OP_TIME2: {
        int fb = (c->a + 1) / 2;
        n = 3 + fb;
        if (need(in, n, i) < 0) return -1;
        uint64_t raw = be(in->p + in->pos, n);
        in->pos += n;
        int64_t v = (int64_t)raw - (int64_t)((uint64_t)1 << (8 * n - 1));
        int sign = v < 0 ? -1 : 1;
        if (v < 0) v = -v;
        int frac_bits = 8 * fb;
        int64_t frac = frac_bits ? (v & (((int64_t)1 << frac_bits) - 1)) : 0;
        int64_t hms = v >> frac_bits;
        int64_t h = hms >> 12 & 0x3FF, mi = hms >> 6 & 63, s = hms & 63;
        static const int64_t scale[4] = {0, 10000, 100, 1};
        int64_t micros = fb ? frac * scale[fb] : 0;
        if (buf_byte(b, 2) < 0 ||
            put_long(b, sign * ((h * 3600 + mi * 60 + s) * 1000000 + micros)) < 0)
            return -1;
        return 1;
    }
    default:
        return 0;
    }
}

/* One row image: Avro record of nullable unions. Records where each key column's
 * encoded value starts and ends (key_spans, 2 per column) and its NULL-ness. */
static int image(RowCodec *rc, In *in, const unsigned char *present, int npresent, Buf *b,
                 Py_ssize_t *col_start, Py_ssize_t *col_end, int *col_null) {
    Py_ssize_t nbytes = (npresent + 7) / 8;
    if (need(in, nbytes, -1) < 0) return -1;
    const unsigned char *nulls = in->p + in->pos;
    in->pos += nbytes;
    int k = 0;
    for (int i = 0; i < rc->ncols; i++) {
        col_start[i] = (Py_ssize_t)b->len;
        col_null[i] = 1;
        int skip = rc->cols[i].skip;
        if (!(present[i >> 3] & (1 << (i & 7)))) {
            if (!skip && buf_byte(b, 0) < 0) return -1;
            col_end[i] = (Py_ssize_t)b->len;
            continue;
        }
        int is_null = nulls[k >> 3] & (1 << (k & 7));
        k++;
        if (is_null) {
            if (!skip && buf_byte(b, 0) < 0) return -1;
            col_end[i] = (Py_ssize_t)b->len;
            continue;
        }
        int t = temporal(rc, i, in, b);
        if (t < 0) return -1;
        if (t == 0) {
            if (buf_byte(b, 2) < 0 || column(rc, i, in, b) < 0) return -1;
        }
        col_null[i] = b->p[col_start[i]] == 0;
        col_end[i] = (Py_ssize_t)b->len;
        if (rc->cols[i].skip) b->len = (size_t)col_start[i];
    }
    return 0;
}

/* ---------- key ---------- */
/* Reads back an Avro long written by put_long at p. */
static int64_t get_long(const unsigned char *p) {
    uint64_t n = 0;
    int shift = 0;
    while (*p & 0x80) {
        n |= (uint64_t)(*p++ & 0x7F) << shift;
        shift += 7;
    }
    n |= (uint64_t)*p << shift;
    return (int64_t)((n >> 1) ^ (~(n & 1) + 1));
}

/* The key of one row from the encoded columns of its image, into kb.
 * Returns 1 for an int64 key (in *ikey), 0 for bytes in kb. */
static int make_key(RowCodec *rc, Buf *img, Py_ssize_t *cs, Py_ssize_t *ce, int *cn,
                    int64_t row_index, int64_t *ikey, Buf *kb) {
    if (rc->key_mode == KEY_ROWINDEX) {
        *ikey = row_index;
        return 1;
    }
    if (rc->key_mode == KEY_INT && !cn[rc->key_cols[0]]) {
        *ikey = get_long(img->p + cs[rc->key_cols[0]] + 1);
        return 1;
    }
    /* JSON array: integers and strings (the only key types compiled here) */
    kb->len = 0;
    if (buf_byte(kb, '[') < 0) return -1;
    for (int k = 0; k < rc->nkey; k++) {
        int i = rc->key_cols[k];
        if (k && buf_byte(kb, ',') < 0) return -1;
        if (cn[i]) {
            if (buf_put(kb, "null", 4) < 0) return -1;
            continue;
        }
        const unsigned char *p = img->p + cs[i] + 1;
        Col *c = &rc->cols[i];
        if (c->op == OP_UINT64_DEC) {
            /* bytes: varint length then big-endian two's complement (non-negative) */
            int64_t n = get_long(p);
            while (*p & 0x80) p++;
            p++;
            uint64_t v = 0;
            for (int64_t q = 0; q < n; q++) v = (v << 8) | p[q];
            char tmp[24];
            int len = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
            if (buf_put(kb, tmp, (size_t)len) < 0) return -1;
        } else if (c->op >= OP_INT8 && c->op <= OP_INT64) {
            char tmp[24];
            int len = snprintf(tmp, sizeof tmp, "%lld", (long long)get_long(p));
            if (buf_put(kb, tmp, (size_t)len) < 0) return -1;
        } else {
            int64_t n = get_long(p);
            while (*p & 0x80) p++;
            p++;
            if (json_string(kb, p, (size_t)n) < 0) return -1;
        }
    }
    if (buf_byte(kb, ']') < 0) return -1;
    return 0;
}

/* ---------- the event ---------- */
static int write_event(RowCodec *rc, Buf *out, int op, int64_t scn, int64_t ts, int is_int_key,
                       int64_t ikey, Buf *kb, Buf *meta, int extra_attrs,
                       const unsigned char *payload, size_t plen) {
    size_t start;
    /* meta NULL: no metadata part (snapshot events) */
    uint16_t attrs = (uint16_t)((op & 7) | extra_attrs | (meta ? EV_ATTR_HAS_METADATA : 0));
    if (ev_start(out, &start, is_int_key, ikey, is_int_key ? NULL : kb->p,
                 is_int_key ? 0 : kb->len, &attrs) < 0)
        return -1;
    if (meta && ev_part(out, 0, rc->meta_id.b, rc->meta_id.len, meta->p, meta->len) < 0)
        return -1;
    if (ev_part(out, rc->schema.version, rc->schema.id.b, rc->schema.id.len, payload, plen) < 0)
        return -1;
    ev_finish(out, start, attrs, ts, rc->schema.src_id, scn);
    return 0;
}

/* ---------- RowCodec type ---------- */
static void RowCodec_dealloc(RowCodec *self) {
    if (self->cols) {
        for (int i = 0; i < self->ncols; i++) Py_XDECREF(self->cols[i].values);
        PyMem_Free(self->cols);
    }
    PyMem_Free(self->key_cols);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int RowCodec_init(RowCodec *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"ops", "key_cols", "key_mode", "src_id", "schema_id",
                             "schema_version", "meta_id", "table", NULL};
    PyObject *ops, *keys;
    int key_mode, src_id, version;
    Py_buffer sid, mid;
    const char *table;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!iiy*iy*s", kwlist, &PyTuple_Type, &ops,
                                     &PyTuple_Type, &keys, &key_mode, &src_id, &sid, &version,
                                     &mid, &table))
        return -1;
    int ok = 0;
    if (ev_schema_set(&self->schema, src_id, version, &sid) < 0 ||
        ev_digest_set(&self->meta_id, &mid, "metadata") < 0)
        goto done;
    self->ncols = (int)PyTuple_GET_SIZE(ops);
    self->cols = PyMem_Calloc((size_t)self->ncols + 1, sizeof(Col));
    self->nkey = (int)PyTuple_GET_SIZE(keys);
    self->key_cols = PyMem_Calloc((size_t)self->nkey + 1, sizeof(int));
    if (!self->cols || !self->key_cols) {
        PyErr_NoMemory();
        goto done;
    }
    for (int i = 0; i < self->ncols; i++) {
        Col *c = &self->cols[i];
        PyObject *values = NULL;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(ops, i), "iiiiO!p", &c->op, &c->a, &c->b, &c->conv,
                              &PyTuple_Type, &values, &c->skip))
            goto done;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(values); k++)
            if (!PyBytes_Check(PyTuple_GET_ITEM(values, k))) {
                PyErr_SetString(PyExc_TypeError, "ENUM/SET values must be bytes");
                goto done;
            }
        Py_INCREF(values);
        c->values = values;
        if (c->op < OP_INT8 || c->op > OP_TIME2) {
            PyErr_Format(PyExc_ValueError, "unknown opcode %d", c->op);
            goto done;
        }
    }
    for (int k = 0; k < self->nkey; k++) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(keys, k));
        if (v == -1 && PyErr_Occurred()) goto done;
        if (v < 0 || v >= self->ncols) {
            PyErr_SetString(PyExc_ValueError, "key column out of range");
            goto done;
        }
        self->key_cols[k] = (int)v;
    }
    if (key_mode == KEY_INT && self->nkey != 1) {
        PyErr_SetString(PyExc_ValueError, "an int key has exactly one column");
        goto done;
    }
    self->key_mode = key_mode;
    ok = 1;
done:
    PyBuffer_Release(&sid);
    PyBuffer_Release(&mid);
    (void)table;
    return ok ? 0 : -1;
}

/* The metadata part: before image (a union: null, or bytes), the constant middle
 * (txid, file, pos, gtid, server_id), the row index (a union long). */
static int put_meta(Buf *meta, const unsigned char *before, size_t blen, Py_buffer *mid,
                    int64_t idx) {
    meta->len = 0;
    if (before != NULL) {
        if (buf_byte(meta, 2) < 0 || put_bytes(meta, before, blen) < 0) return -1;
    } else if (buf_byte(meta, 0) < 0) {
        return -1;
    }
    if (buf_put(meta, mid->buf, (size_t)mid->len) < 0 || buf_byte(meta, 2) < 0) return -1;
    return put_long(meta, idx);
}

/*
 * encode(body, event_type, scn, timestamp_ns, meta_mid, row_index, table_name)
 *   -> (events: bytes, rows: int)
 * body: the rows event body (checksum removed); row_index: position of the first
 * event in its transaction (metadata "row", and the key of tables without one).
 * An update that changes the key gives a delete (old key, before image) and an
 * insert (new key), so rows may count more events than the body has rows.
 */
static PyObject *RowCodec_encode(RowCodec *self, PyObject *args) {
    Py_buffer body, mid;
    int etype;
    long long scn, ts, row_index;
    const char *table;
    if (!PyArg_ParseTuple(args, "y*iLLy*Ls", &body, &etype, &scn, &ts, &mid, &row_index, &table))
        return NULL;
    PyObject *result = NULL;
    Buf out = {0}, img = {0}, before = {0}, meta = {0}, kb = {0}, kb2 = {0};
    Py_ssize_t *cs = PyMem_Calloc((size_t)self->ncols * 2 + 2, sizeof(Py_ssize_t));
    int *cn = PyMem_Calloc((size_t)self->ncols + 1, sizeof(int));
    Py_ssize_t *bcs = PyMem_Calloc((size_t)self->ncols * 2 + 2, sizeof(Py_ssize_t));
    int *bcn = PyMem_Calloc((size_t)self->ncols + 1, sizeof(int));
    if (!cs || !cn || !bcs || !bcn) {
        PyErr_NoMemory();
        goto done;
    }
    In in = {(const unsigned char *)body.buf, 0, body.len, table};
    int v2 = etype >= 30;
    int update = etype == 24 || etype == 31;
    int del = etype == 25 || etype == 32;
    int op = update ? 2 : (del ? 3 : 1);
    in.pos = 8;
    if (v2) {
        if (need(&in, 2, -1) < 0) goto done;
        in.pos += (Py_ssize_t)le(in.p + in.pos, 2);
    }
    if (need(&in, 1, -1) < 0) goto done;
    /* column count: a length-encoded integer */
    uint64_t n = in.p[in.pos];
    if (n < 0xFB) in.pos += 1;
    else if (n == 0xFC && need(&in, 3, -1) == 0) { n = le(in.p + in.pos + 1, 2); in.pos += 3; }
    else {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_ValueError, "unsupported column count in %s", table);
        goto done;
    }
    if ((int)n != self->ncols) {
        PyErr_Format(PyExc_ValueError, "rows event of %s has %d columns, table map %d", table,
                     (int)n, self->ncols);
        goto done;
    }
    Py_ssize_t bm = (self->ncols + 7) / 8;
    if (need(&in, bm * (update ? 2 : 1), -1) < 0) goto done;
    const unsigned char *present = in.p + in.pos;
    in.pos += bm;
    const unsigned char *present_after = present;
    int npresent = 0, npresent_after;
    for (int i = 0; i < self->ncols; i++) npresent += (present[i >> 3] >> (i & 7)) & 1;
    npresent_after = npresent;
    if (update) {
        present_after = in.p + in.pos;
        in.pos += bm;
        npresent_after = 0;
        for (int i = 0; i < self->ncols; i++) npresent_after += (present_after[i >> 3] >> (i & 7)) & 1;
    }
    long long rows = 0;
    Py_ssize_t *ce = cs + self->ncols + 1, *bce = bcs + self->ncols + 1;
    if (npresent == 0 || npresent_after == 0) {
        /* a row image without columns would consume nothing: corrupt, not a loop */
        PyErr_Format(PyExc_ValueError, "rows event of %s names no column", table);
        goto done;
    }
    while (in.pos < in.end) {
        int64_t idx = row_index + rows;
        before.len = 0;
        img.len = 0;
        if (update) {
            if (image(self, &in, present, npresent, &before, bcs, bce, bcn) < 0) goto done;
            if (image(self, &in, present_after, npresent_after, &img, cs, ce, cn) < 0) goto done;
        } else if (image(self, &in, present, npresent, &img, cs, ce, cn) < 0) {
            goto done;
        }
        int64_t ikey = 0, bkey = 0;
        int is_int = make_key(self, &img, cs, ce, cn, idx, &ikey, &kb);
        if (is_int < 0) goto done;
        if (update && self->key_mode != KEY_ROWINDEX) {
            /* a key change is a delete of the old key and an insert of the new one */
            int b_int = make_key(self, &before, bcs, bce, bcn, idx, &bkey, &kb2);
            if (b_int < 0) goto done;
            int same = b_int == is_int && (is_int ? bkey == ikey
                                                   : (kb2.len == kb.len &&
                                                      memcmp(kb2.p, kb.p, kb.len) == 0));
            if (!same) {
                if (put_meta(&meta, NULL, 0, &mid, idx) < 0 ||
                    write_event(self, &out, 3, scn, ts, b_int, bkey, &kb2, &meta, 0, before.p,
                                before.len) < 0 ||
                    put_meta(&meta, NULL, 0, &mid, idx + 1) < 0 ||
                    write_event(self, &out, 1, scn, ts, is_int, ikey, &kb, &meta, 0, img.p,
                                img.len) < 0)
                    goto done;
                rows += 2;
                continue;
            }
        }
        /* metadata: before (union), the constant middle, row (union long) */
        if (put_meta(&meta, update ? before.p : NULL, before.len, &mid, idx) < 0) goto done;
        if (write_event(self, &out, op, scn, ts, is_int, ikey, &kb, &meta, 0, img.p, img.len) < 0)
            goto done;
        rows++;
    }
    PyObject *data = PyBytes_FromStringAndSize((const char *)out.p, (Py_ssize_t)out.len);
    if (data) {
        result = Py_BuildValue("(NL)", data, rows);
    }
done:
    PyMem_Free(out.p);
    PyMem_Free(img.p);
    PyMem_Free(before.p);
    PyMem_Free(meta.p);
    PyMem_Free(kb.p);
    PyMem_Free(kb2.p);
    PyMem_Free(cs);
    PyMem_Free(cn);
    PyMem_Free(bcs);
    PyMem_Free(bcn);
    PyBuffer_Release(&body);
    PyBuffer_Release(&mid);
    return result;
}

#include "_snaptext.c"
#include "_binlogframes.c"

static PyObject *py_crc32(PyObject *mod, PyObject *args) {
    Py_buffer data;
    unsigned int start = 0;
    if (!PyArg_ParseTuple(args, "y*|I", &data, &start)) return NULL;
    uint32_t c = crc32_update(start, data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    (void)mod;
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef RowCodec_methods[] = {
    {"encode", (PyCFunction)RowCodec_encode, METH_VARARGS,
     "encode(body, event_type, scn, timestamp_ns, meta_mid, row_index, table) -> (bytes, rows)"},
    {"encode_text", (PyCFunction)RowCodec_encode_text, METH_VARARGS,
     "encode_text(rows, table) -> [(key, payload)] (snapshot result rows, see _snaptext.c)"},
    {"snapshot_events", (PyCFunction)RowCodec_snapshot_events, METH_VARARGS,
     "snapshot_events(items, scn, timestamp_ns) -> bytes (READ events, snapshot attribute)"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject RowCodecType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "databus.sources.mysql._rowcodec.RowCodec",
    .tp_basicsize = sizeof(RowCodec),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A compiled row codec for one table version (see fastpath.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)RowCodec_init,
    .tp_dealloc = (destructor)RowCodec_dealloc,
    .tp_methods = RowCodec_methods,
};

static PyMethodDef module_methods[] = {
    {"crc32", py_crc32, METH_VARARGS, "CRC-32 as zlib.crc32 (for tests)."},
    {"frames", py_frames, METH_VARARGS,
     "frames(buf, off, seq, checksum, header_type, limit) -> (events reversed, off, seq)"
     " (_binlogframes.c)"},
    {"rows_meta", py_rows_meta, METH_VARARGS,
     "rows_meta(head, pos, tail) -> bytes (tables.RowsMeta, _binlogframes.c)"},
    {"scan_rows", py_scan_rows, METH_VARARGS,
     "scan_rows(data, seq) -> (rows, consumed, seq): complete row packets (_snaptext.c)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_rowcodec",
                                       "Compiled binlog row codec.", -1, module_methods};

PyMODINIT_FUNC PyInit__rowcodec(void) {
    crc_init();
    if (PyType_Ready(&RowCodecType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&RowCodecType);
    if (PyModule_AddObject(m, "RowCodec", (PyObject *)&RowCodecType) < 0) {
        Py_DECREF(&RowCodecType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
