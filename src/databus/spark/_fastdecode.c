/*
 * Relay /stream bytes -> columns of the Spark change envelope, many events per call.
 *
 * This is the compiled half of databus.spark.fastread. decode() walks the
 * events of one response from an offset, verifies each one exactly as
 * databus.core.event.decode does (version, magic, lengths, both CRCs, key and
 * parts), applies read_bucket's window rules (EOP resets the index, the EOP
 * at or after end_scn ends the read, other control events are skipped) and
 * decodes every data event's metadata part and flat Avro row(s) into Arrow
 * buffers (validity bitmaps, values, offsets).
 *
 * It never guesses: any input it does not handle exactly like the Python path
 * (a damaged event, an unknown schema id, a value in another union branch
 * than its column's, invalid UTF-8, an out-of-range int, bad Avro) makes it
 * return None, and the caller decodes the same range with the Python path,
 * which produces the value or raises the proper typed error. Nothing is ever
 * read out of bounds: every read is checked against the event's end.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

/* Avro branch types; column kinds use the same codes (keep in step with fastread.py) */
enum { T_NULL = 0, T_BOOL, T_INT, T_LONG, T_FLOAT, T_DOUBLE, T_STRING, T_BYTES };

#define HEADER_LEN 45
#define MAX_COLS 1024
#define MAX_BRANCHES 16
#define SRC_EOP (-2)

typedef struct { char *p; Py_ssize_t len, cap; } Buf;

static int buf_reserve(Buf *b, Py_ssize_t extra) {
    if (b->len + extra <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra) cap *= 2;
    char *p = PyMem_Realloc(b->p, (size_t)cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    b->p = p; b->cap = cap;
    return 0;
}

static int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->p + b->len, src, (size_t)n);
    b->len += n;
    return 0;
}

static int buf_zero(Buf *b, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    memset(b->p + b->len, 0, (size_t)n);
    b->len += n;
    return 0;
}

static PyObject *buf_bytes(Buf *b) {
    return PyBytes_FromStringAndSize(b->p ? b->p : "", b->len);
}

/* one output column: validity bitmap, fixed-width values or offsets + data */
typedef struct { int kind; Buf valid, vals, data; } Col;

static int width_of(int kind) {
    switch (kind) {
    case T_INT: case T_FLOAT: return 4;
    case T_LONG: case T_DOUBLE: return 8;
    default: return 0; /* bool: bitmap in vals; string/bytes: int32 offsets in vals */
    }
}

/* room for row i (all buffers grow one row at a time, zero-filled) */
static int col_grow(Col *c, Py_ssize_t i) {
    if ((i & 7) == 0) {
        if (buf_zero(&c->valid, 1) < 0) return -1;
        if (c->kind == T_BOOL && buf_zero(&c->vals, 1) < 0) return -1;
    }
    int w = width_of(c->kind);
    if (w) return buf_zero(&c->vals, w);
    if (c->kind == T_STRING || c->kind == T_BYTES) {
        int32_t end = (int32_t)c->data.len;
        if (i == 0 && buf_put(&c->vals, &end, 4) < 0) return -1;
        return buf_put(&c->vals, &end, 4);
    }
    return 0;
}

static void set_bit(Buf *b, Py_ssize_t i) { ((uint8_t *)b->p)[i >> 3] |= (uint8_t)(1u << (i & 7)); }

/* var-length value of row i (after col_grow) */
static int col_setvar(Col *c, Py_ssize_t i, const uint8_t *s, Py_ssize_t n) {
    if (c->data.len + n > INT32_MAX) return 1;
    if (buf_put(&c->data, s, n) < 0) return -1;
    int32_t end = (int32_t)c->data.len;
    memcpy(c->vals.p + 4 * (i + 1), &end, 4);
    set_bit(&c->valid, i);
    return 0;
}

static void col_free(Col *c) { PyMem_Free(c->valid.p); PyMem_Free(c->vals.p); PyMem_Free(c->data.p); }

static PyObject *col_tuple(Col *c) {
    return Py_BuildValue("(NNN)", buf_bytes(&c->valid), buf_bytes(&c->vals), buf_bytes(&c->data));
}

/* ---------- reading primitives (0 = ok, 1 = not handled here) ---------- */

static uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

static int rd_long(const uint8_t **pp, const uint8_t *end, int64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (p >= end) return 1;
        uint8_t b = *p++;
        if (shift == 63 && (b & 0x7e)) return 1; /* beyond 64 bits */
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return 0;
        }
    }
    return 1;
}

/* strict UTF-8, as Python's decoder (no overlongs, surrogates or > U+10FFFF) */
static int utf8_ok(const uint8_t *s, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        int more; uint8_t lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) more = 1;
        else if (c == 0xE0) { more = 2; lo = 0xA0; }
        else if (c == 0xED) { more = 2; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) more = 2;
        else if (c == 0xF0) { more = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) more = 3;
        else if (c == 0xF4) { more = 3; hi = 0x8F; }
        else return 0;
        if (more > n - 1 - i) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (int k = 2; k <= more; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += more + 1;
    }
    return 1;
}

/* reads a string/bytes value: its span */
static int rd_span(const uint8_t **pp, const uint8_t *end, const uint8_t **s, Py_ssize_t *n) {
    int64_t len;
    if (rd_long(pp, end, &len) || len < 0 || len > end - *pp) return 1;
    *s = *pp; *n = (Py_ssize_t)len; *pp += len;
    return 0;
}

/* ---------- plans: one per table version ---------- */

typedef struct {
    int out;                     /* output column */
    int nbranch;                 /* 0 = not a union */
    uint8_t branch[MAX_BRANCHES];/* branch types (or the single type) */
} Field;

typedef struct {
    const char *digest; Py_ssize_t dlen;
    int slot;
    int nfields;
    Field *fields;
} Plan;

/* one Avro row into the row columns (row i); 0 ok, 1 not handled, -1 error. With
 * store = 0 the row is only checked (exactly the same checks), nothing is written. */
static int decode_row(const Plan *pl, const uint8_t *p, const uint8_t *end, Col *cols,
                      Py_ssize_t i, int store) {
    for (int f = 0; f < pl->nfields; f++) {
        const Field *fd = &pl->fields[f];
        int t = fd->branch[0];
        if (fd->nbranch) {
            int64_t b;
            if (rd_long(&p, end, &b) || b < 0 || b >= fd->nbranch) return 1;
            t = fd->branch[b];
        }
        Col *c = &cols[fd->out];
        if (t == T_NULL) continue;
        if (t != c->kind) return 1; /* another branch: the Python path converts or refuses */
        switch (t) {
        case T_BOOL:
            if (p >= end || *p > 1) return 1;
            if (*p && store) set_bit(&c->vals, i);
            p++;
            break;
        case T_INT: case T_LONG: {
            int64_t v;
            if (rd_long(&p, end, &v)) return 1;
            if (t == T_INT) {
                if (v < INT32_MIN || v > INT32_MAX) return 1;
                int32_t v32 = (int32_t)v;
                if (store) memcpy(c->vals.p + 4 * i, &v32, 4);
            } else if (store) {
                memcpy(c->vals.p + 8 * i, &v, 8);
            }
            break;
        }
        case T_FLOAT: /* Avro and Arrow are both little-endian IEEE */
            if (end - p < 4) return 1;
            if (store) memcpy(c->vals.p + 4 * i, p, 4);
            p += 4;
            break;
        case T_DOUBLE:
            if (end - p < 8) return 1;
            if (store) memcpy(c->vals.p + 8 * i, p, 8);
            p += 8;
            break;
        case T_STRING: case T_BYTES: {
            const uint8_t *s; Py_ssize_t n;
            if (rd_span(&p, end, &s, &n)) return 1;
            if (t == T_STRING && !utf8_ok(s, n)) return 1;
            if (!store) continue;
            int r = col_setvar(c, i, s, n);
            if (r) return r;
            continue; /* col_setvar set the validity bit */
        }
        default:
            return 1;
        }
        if (store) set_bit(&c->valid, i);
    }
    return 0; /* trailing bytes are ignored, as fastavro does */
}

static void free_plans(Plan *plans, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) PyMem_Free(plans[i].fields);
    PyMem_Free(plans);
}

/* plans: tuple of (digest bytes, slot int, ((out, union 0/1, branch-types bytes), ...)) */
static Plan *parse_plans(PyObject *seq, Py_ssize_t *n, int ncols) {
    if (!PyTuple_Check(seq)) { PyErr_SetString(PyExc_TypeError, "plans must be a tuple"); return NULL; }
    *n = PyTuple_GET_SIZE(seq);
    Plan *plans = PyMem_Calloc((size_t)(*n ? *n : 1), sizeof(Plan));
    if (!plans) { PyErr_NoMemory(); return NULL; }
    for (Py_ssize_t k = 0; k < *n; k++) {
        PyObject *fields;
        Plan *pl = &plans[k];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(seq, k), "y#iO!", &pl->digest, &pl->dlen,
                              &pl->slot, &PyTuple_Type, &fields))
            goto fail;
        pl->nfields = (int)PyTuple_GET_SIZE(fields);
        pl->fields = PyMem_Calloc((size_t)(pl->nfields ? pl->nfields : 1), sizeof(Field));
        if (!pl->fields) { PyErr_NoMemory(); goto fail; }
        for (int f = 0; f < pl->nfields; f++) {
            int out, uni; const char *br; Py_ssize_t nb;
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, f), "iiy#", &out, &uni, &br, &nb))
                goto fail;
            if (out < 0 || out >= ncols || nb < 1 || nb > MAX_BRANCHES || (!uni && nb != 1)) {
                PyErr_SetString(PyExc_ValueError, "bad plan field");
                goto fail;
            }
            for (Py_ssize_t b = 0; b < nb; b++)
                if ((uint8_t)br[b] > T_BYTES) { PyErr_SetString(PyExc_ValueError, "bad branch type"); goto fail; }
            pl->fields[f].out = out;
            pl->fields[f].nbranch = uni ? (int)nb : 0;
            memcpy(pl->fields[f].branch, br, (size_t)nb);
        }
    }
    return plans;
fail:
    free_plans(plans, *n);
    return NULL;
}

/* ---------- the envelope columns ---------- */

enum { C_SCN, C_INDEX, C_TS, C_ATTR, C_SLOT, C_KEY, C_FILE, C_POS, C_GTID, C_SERVER, C_ROW, NFIXED };
static const int fixed_kinds[NFIXED] = {T_LONG, T_INT, T_LONG, T_INT, T_INT, T_STRING, T_STRING,
                                        T_LONG, T_STRING, T_LONG, T_INT};

/* metadata record (METADATA_SCHEMA: before, txid, file, pos, gtid, server_id, row; all
 * ["null", x]) of row i; *before gets the before image's span (NULL when null) */
static int decode_meta(const uint8_t *p, const uint8_t *end, Col *fx, Py_ssize_t i,
                       const uint8_t **before, Py_ssize_t *before_n) {
    static const int types[7] = {T_BYTES, T_STRING, T_STRING, T_LONG, T_STRING, T_LONG, T_INT};
    static const int outs[7] = {-1, -1, C_FILE, C_POS, C_GTID, C_SERVER, C_ROW};
    *before = NULL;
    for (int f = 0; f < 7; f++) {
        int64_t b;
        if (rd_long(&p, end, &b) || (b != 0 && b != 1)) return 1;
        if (b == 0) continue;
        if (types[f] == T_STRING || types[f] == T_BYTES) {
            const uint8_t *s; Py_ssize_t n;
            if (rd_span(&p, end, &s, &n)) return 1;
            if (types[f] == T_STRING && !utf8_ok(s, n)) return 1;
            if (f == 0) { *before = s; *before_n = n; }
            if (outs[f] >= 0) {
                int r = col_setvar(&fx[outs[f]], i, s, n);
                if (r) return r;
            }
        } else {
            int64_t v;
            if (rd_long(&p, end, &v)) return 1;
            Col *c = &fx[outs[f]];
            if (types[f] == T_INT) {
                if (v < INT32_MIN || v > INT32_MAX) return 1;
                int32_t v32 = (int32_t)v;
                memcpy(c->vals.p + 4 * i, &v32, 4);
            } else {
                memcpy(c->vals.p + 8 * i, &v, 8);
            }
            set_bit(&c->valid, i);
        }
    }
    return 0;
}

/* the key as text: decimal, UTF-8, or 0x + hex */
static int put_key(Col *c, Py_ssize_t i, int is_bytes, int64_t ikey, const uint8_t *k, Py_ssize_t kn) {
    char tmp[32];
    if (!is_bytes) {
        int n = snprintf(tmp, sizeof tmp, "%lld", (long long)ikey);
        return col_setvar(c, i, (const uint8_t *)tmp, n);
    }
    if (utf8_ok(k, kn)) return col_setvar(c, i, k, kn);
    static const char hex[] = "0123456789abcdef";
    if (buf_reserve(&c->data, 2 + 2 * kn) < 0) return -1;
    Buf *d = &c->data;
    d->p[d->len++] = '0'; d->p[d->len++] = 'x';
    for (Py_ssize_t j = 0; j < kn; j++) {
        d->p[d->len++] = hex[k[j] >> 4];
        d->p[d->len++] = hex[k[j] & 15];
    }
    if (d->len > INT32_MAX) return 1;
    int32_t end = (int32_t)d->len;
    memcpy(c->vals.p + 4 * (i + 1), &end, 4);
    set_bit(&c->valid, i);
    return 0;
}

/* reads a part (int32 length, int16 version, uint8 digest length, digest, data) */
static int rd_part(const uint8_t **pp, const uint8_t *end, const uint8_t **dg, Py_ssize_t *dgn,
                   const uint8_t **data, Py_ssize_t *n) {
    const uint8_t *p = *pp;
    if (end - p < 7) return 1;
    int32_t dlen = (int32_t)be32(p);
    uint8_t dglen = p[6];
    p += 7;
    if (dlen < 0 || (Py_ssize_t)dglen + dlen > end - p) return 1;
    *dg = p; *dgn = dglen; p += dglen;
    *data = p; *n = dlen; p += dlen;
    *pp = p;
    return 0;
}

static PyObject *decode(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t off, max_rows;
    long long end_scn;
    int index, ncols;
    PyObject *plan_seq;
    const char *kinds;
    Py_ssize_t nkinds;
    int flat = 0;
    if (!PyArg_ParseTuple(args, "y*nnLiOy#|p", &view, &off, &max_rows, &end_scn, &index,
                          &plan_seq, &kinds, &nkinds, &flat))
        return NULL;
    PyObject *result = NULL;
    ncols = (int)nkinds;
    Py_ssize_t nplans = 0;
    Plan *plans = NULL;
    Col fx[NFIXED];
    Col *rows = NULL; /* before columns then after columns (flat: only the first set is
                       * exported: the after image, else the before image) */
    Buf bvalid = {0}, avalid = {0}; /* struct validity of before, after */
    memset(fx, 0, sizeof fx);
    if (ncols > MAX_COLS || max_rows < 0 || off < 0) {
        PyErr_SetString(PyExc_ValueError, "bad arguments");
        goto done;
    }
    for (int k = 0; k < ncols; k++)
        if ((uint8_t)kinds[k] < T_BOOL || (uint8_t)kinds[k] > T_BYTES) {
            PyErr_SetString(PyExc_ValueError, "bad column kind");
            goto done;
        }
    plans = parse_plans(plan_seq, &nplans, ncols);
    if (!plans) goto done;
    for (int k = 0; k < NFIXED; k++) fx[k].kind = fixed_kinds[k];
    rows = PyMem_Calloc((size_t)(2 * ncols + 1), sizeof(Col));
    if (!rows) { PyErr_NoMemory(); goto done; }
    for (int k = 0; k < ncols; k++) rows[k].kind = rows[ncols + k].kind = (uint8_t)kinds[k];
    int nrowcols = flat ? ncols : 2 * ncols; /* the columns filled */
    PyObject *eops = PyList_New(0);
    if (!eops) goto done;

    const uint8_t *buf = view.buf;
    Py_ssize_t n = view.len, nrows = 0, tail = 0;
    long long tail_scn = -1;
    int finished = 0, handled = 1;
    while (off < n && !finished) {
        const uint8_t *e = buf + off;
        if (n - off < HEADER_LEN) { handled = 0; break; }
        uint32_t total = be32(e + 17);
        if (e[0] != 2 || be32(e + 1) != 0xCAFEDEEDu || be32(e + 5) != HEADER_LEN) { handled = 0; break; }
        uLong crc = crc32(crc32(0L, e, 9), e + 13, HEADER_LEN - 13);
        if ((uint32_t)crc != be32(e + 9)) { handled = 0; break; }
        if (total < HEADER_LEN + 8 + 7 || (Py_ssize_t)total > n - off) { handled = 0; break; }
        if ((uint32_t)crc32(0L, e + HEADER_LEN, total - HEADER_LEN) != be32(e + 13)) { handled = 0; break; }
        const uint8_t *end = e + total, *p = e + HEADER_LEN;
        unsigned attrs = ((unsigned)e[21] << 8) | e[22];
        int64_t ts = (int64_t)be64(e + 23);
        int32_t src = (int32_t)be32(e + 31);
        long long scn = (long long)(int64_t)be64(e + 37);
        /* the body, as core.event.decode checks it */
        int key_bytes = (attrs & 0x0008) != 0;
        int64_t ikey = 0;
        const uint8_t *k = NULL, *mdg, *mdata = NULL, *dg, *data;
        Py_ssize_t kn = 0, mdgn, mn = 0, dgn, dn;
        if (key_bytes) {
            int32_t klen = (int32_t)be32(p);
            if (klen < 0 || (Py_ssize_t)klen > end - p - 4) { handled = 0; break; }
            k = p + 4; kn = klen; p += 4 + klen;
        } else {
            ikey = (int64_t)be64(p);
            p += 8;
        }
        int has_meta = (attrs & 0x0010) != 0;
        if (has_meta && rd_part(&p, end, &mdg, &mdgn, &mdata, &mn)) { handled = 0; break; }
        if (rd_part(&p, end, &dg, &dgn, &data, &dn) || p != end) { handled = 0; break; }
        if (src < 0) {
            off += total;
            if (src == SRC_EOP) {
                PyObject *v = PyLong_FromLongLong(scn);
                if (!v || PyList_Append(eops, v) < 0) { Py_XDECREF(v); Py_DECREF(eops); goto done; }
                Py_DECREF(v);
                index = 0; tail = 0; tail_scn = -1;
                if (scn >= end_scn) finished = 1;
            }
            continue;
        }
        if (nrows >= max_rows) break;
        const Plan *pl = NULL;
        for (Py_ssize_t q = 0; q < nplans; q++)
            if (plans[q].dlen == dgn && memcmp(plans[q].digest, dg, (size_t)dgn) == 0) { pl = &plans[q]; break; }
        if (!pl) { handled = 0; break; }
        Py_ssize_t i = nrows;
        int r = 0;
        for (int c = 0; c < NFIXED && !r; c++) r = col_grow(&fx[c], i);
        for (int c = 0; c < nrowcols && !r; c++) r = col_grow(&rows[c], i);
        if (!r && (i & 7) == 0) r = buf_zero(&bvalid, 1) || buf_zero(&avalid, 1) ? -1 : 0;
        if (r < 0) { Py_DECREF(eops); goto done; }
        int64_t ts_ms = ts / 1000000;
        if (ts % 1000000 != 0 && ts < 0) ts_ms -= 1; /* floor, as Python's // */
        int32_t ix = index, attr = (int32_t)attrs, slot = pl->slot;
        memcpy(fx[C_SCN].vals.p + 8 * i, &scn, 8);
        memcpy(fx[C_INDEX].vals.p + 4 * i, &ix, 4);
        memcpy(fx[C_TS].vals.p + 8 * i, &ts_ms, 8);
        memcpy(fx[C_ATTR].vals.p + 4 * i, &attr, 4);
        memcpy(fx[C_SLOT].vals.p + 4 * i, &slot, 4);
        for (int c = 0; c < C_KEY; c++) set_bit(&fx[c].valid, i);
        r = put_key(&fx[C_KEY], i, key_bytes, ikey, k, kn);
        const uint8_t *bimg = NULL;
        Py_ssize_t bn = 0;
        if (!r && has_meta) r = decode_meta(mdata, mdata + mn, fx, i, &bimg, &bn);
        int is_delete = (attrs & 7) == 3;
        if (flat) {
            /* one row: the after image, else the before image (changes()' coalesce); a
             * before image behind an after image is checked as the full decode checks it */
            if (!r && dn > 0) r = decode_row(pl, data, data + dn, rows, i, 1);
            if (!r && !is_delete && bimg) r = decode_row(pl, bimg, bimg + bn, rows, i, dn == 0);
        } else {
            if (!r && dn > 0) {
                /* the payload: the before image of a delete, else the after image */
                r = decode_row(pl, data, data + dn, is_delete ? rows : rows + ncols, i, 1);
                if (!r) set_bit(is_delete ? &bvalid : &avalid, i);
            }
            if (!r && !is_delete && bimg) {
                r = decode_row(pl, bimg, bimg + bn, rows, i, 1);
                if (!r) set_bit(&bvalid, i);
            }
        }
        if (r < 0) { Py_DECREF(eops); goto done; }
        if (r) { handled = 0; break; }
        nrows++; index++; tail++; tail_scn = scn;
        off += total;
    }
    if (!handled) {
        Py_DECREF(eops);
        result = Py_NewRef(Py_None);
        goto done;
    }
    int nafter = flat ? 0 : ncols;
    PyObject *fixed = PyTuple_New(NFIXED), *before = PyTuple_New(ncols), *after = PyTuple_New(nafter);
    if (fixed && before && after) {
        for (int c = 0; c < NFIXED; c++) PyTuple_SET_ITEM(fixed, c, col_tuple(&fx[c]));
        for (int c = 0; c < ncols; c++) PyTuple_SET_ITEM(before, c, col_tuple(&rows[c]));
        for (int c = 0; c < nafter; c++) PyTuple_SET_ITEM(after, c, col_tuple(&rows[ncols + c]));
        result = Py_BuildValue("(innNLinNNNNN)", finished, off, nrows, eops, tail_scn, index,
                               (Py_ssize_t)tail, fixed, before, after, buf_bytes(&bvalid),
                               buf_bytes(&avalid));
    } else {
        Py_XDECREF(fixed); Py_XDECREF(before); Py_XDECREF(after); Py_DECREF(eops);
    }
done:
    PyMem_Free(bvalid.p);
    PyMem_Free(avalid.p);
    for (int c = 0; c < NFIXED; c++) col_free(&fx[c]);
    if (rows) {
        for (int c = 0; c < 2 * ncols; c++) col_free(&rows[c]);
        PyMem_Free(rows);
    }
    if (plans) free_plans(plans, nplans);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS,
     "decode(buf, off, max_rows, end_scn, index, plans, kinds, flat=False) -> columns, or None "
     "when the Python path must decode this range. flat: the row columns come back as "
     "'before' (after image, else before image) and 'after' is empty."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_fastdecode",
                                       "Relay events -> Arrow envelope buffers.", -1, methods};

PyMODINIT_FUNC PyInit__fastdecode(void) { return PyModule_Create(&moduledef); }
