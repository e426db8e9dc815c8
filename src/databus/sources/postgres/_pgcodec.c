/*
 * pgoutput change messages -> encoded databus events: the compiled half of
 * databus.sources.postgres.fastpath.
 *
 * A Codec describes one table version (the Avro kind of each column, the key,
 * the source id and schema digest). A Decoder holds the relation map of one
 * replication session (relation oid -> Codec, or None for a table not
 * captured) and the rows of the transaction being decoded. Decoder.change()
 * takes one Insert, Update or Delete message, reads its tuple data and writes
 * the row's Avro record and key into the transaction's pending rows, with no
 * Python object per value; Decoder.commit() writes every pending row as a
 * complete DbusEvent v2 (header, both CRCs, key, metadata part, payload part)
 * once the commit's SCN is known.
 *
 * The output must be byte-identical to the pure-Python path (pgoutput.py,
 * types.py, source.py, core/event.py); tests compare both on the type matrix.
 * What this file does not do is handed back to Python (change() returns -1):
 * an update with unchanged TOASTed values (fetched or carried in Python), an
 * unknown relation (an error in Python). Input that does not parse raises
 * ValueError; the caller decodes the message again in Python for the precise
 * error. Nothing is ever read out of bounds.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* Avro kinds of columns (keep in step with fastpath.py); K_SKIP: a column the table
 * version leaves out (include/exclude_columns): read past, never written, never a key */
enum { K_STRING = 0, K_LONG = 1, K_BOOL = 2, K_DOUBLE = 3, K_BYTEA = 4, K_SKIP = 5 };
/* key modes */
enum { KEY_INT = 0, KEY_ROWINDEX = 1, KEY_JSON = 2 };
/* ops, as databus.core.event.Op */
enum { OP_INSERT = 1, OP_UPDATE = 2, OP_DELETE = 3, OP_TRUNCATE = 5 };

#include "../../core/_cenc.h" /* CRC-32, Buf, Avro writers, the event and its schema */

/* ---------- Codec: one table version ---------- */
typedef struct {
    PyObject_HEAD
    unsigned char *kinds;
    int ncols;
    int *key_cols;
    int nkey;
    int key_mode;
    EvSchema schema;
} Codec;

static void Codec_dealloc(Codec *self) {
    PyMem_Free(self->kinds);
    PyMem_Free(self->key_cols);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Codec_init(Codec *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"kinds", "key_cols", "key_mode", "src_id", "schema_id",
                             "schema_version", NULL};
    Py_buffer kinds, sid;
    PyObject *keys;
    int key_mode, src_id, version;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*O!iiy*i", kwlist, &kinds, &PyTuple_Type,
                                     &keys, &key_mode, &src_id, &sid, &version))
        return -1;
    int ok = 0;
    if (ev_schema_set(&self->schema, src_id, version, &sid) < 0) goto done;
    PyMem_Free(self->kinds);
    PyMem_Free(self->key_cols);
    self->ncols = (int)kinds.len;
    self->kinds = PyMem_Malloc((size_t)kinds.len + 1);
    self->nkey = (int)PyTuple_GET_SIZE(keys);
    self->key_cols = PyMem_Calloc((size_t)self->nkey + 1, sizeof(int));
    if (!self->kinds || !self->key_cols) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(self->kinds, kinds.buf, (size_t)kinds.len);
    for (int i = 0; i < self->ncols; i++)
        if (self->kinds[i] > K_SKIP) {
            PyErr_Format(PyExc_ValueError, "unknown column kind %d", self->kinds[i]);
            goto done;
        }
    for (int k = 0; k < self->nkey; k++) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(keys, k));
        if (v == -1 && PyErr_Occurred()) goto done;
        if (v < 0 || v >= self->ncols || self->kinds[v] == K_SKIP) {
            PyErr_SetString(PyExc_ValueError, "key column out of range or left out");
            goto done;
        }
        self->key_cols[k] = (int)v;
    }
    if (key_mode < KEY_INT || key_mode > KEY_JSON ||
        (key_mode == KEY_INT && (self->nkey != 1 || self->kinds[self->key_cols[0]] != K_LONG)) ||
        (key_mode == KEY_JSON && self->nkey == 0)) {
        PyErr_SetString(PyExc_ValueError, "key mode does not fit the key columns");
        goto done;
    }
    self->key_mode = key_mode;
    ok = 1;
done:
    PyBuffer_Release(&kinds);
    PyBuffer_Release(&sid);
    return ok ? 0 : -1;
}

static PyTypeObject CodecType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "databus.sources.postgres._pgcodec.Codec",
    .tp_basicsize = sizeof(Codec),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Codec(kinds, key_cols, key_mode, src_id, schema_id, schema_version): one table"
              " version (see fastpath.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Codec_init,
    .tp_dealloc = (destructor)Codec_dealloc,
};

/* ---------- tuple data -> Avro record and key ---------- */
#define MAX_KEY 32

typedef struct {
    int null;
    int64_t ival;           /* K_LONG, K_BOOL */
    double dval;            /* K_DOUBLE */
    const unsigned char *s; /* K_STRING: the text; K_BYTEA: the text (\x...) */
    size_t n;
} KeyVal;

typedef struct {
    int is_int;
    int64_t ival;
    Buf bytes;
} Key;

static int bad(const char *what) {
    PyErr_SetString(PyExc_ValueError, what);
    return -1;
}

static int parse_long(const unsigned char *s, size_t n, int64_t *out) {
    size_t i = 0;
    int neg = 0;
    if (n && (s[0] == '-' || s[0] == '+')) {
        neg = s[0] == '-';
        i = 1;
    }
    if (i == n || n - i > 19) return bad("integer value out of form");
    uint64_t v = 0;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return bad("integer value out of form");
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if ((!neg && v > (uint64_t)INT64_MAX) || (neg && v > (uint64_t)INT64_MAX + 1))
        return bad("integer value out of range");
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

static int parse_double(const unsigned char *s, size_t n, double *out) {
    char tmp[128];
    if (n == 0 || n >= sizeof tmp) return bad("double value out of form");
    memcpy(tmp, s, n);
    tmp[n] = 0;
    char *end = NULL;
    double d = PyOS_string_to_double(tmp, &end, NULL);
    if (d == -1.0 && PyErr_Occurred()) return -1;
    if (end != tmp + n) return bad("double value out of form");
    *out = d;
    return 0;
}

static int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int put_bytea(Buf *b, const unsigned char *s, size_t n) {
    if (n < 2 || s[0] != '\\' || s[1] != 'x' || (n - 2) % 2) return bad("bytea not in hex form");
    size_t m = (n - 2) / 2;
    if (put_long(b, (int64_t)m) < 0 || buf_reserve(b, m) < 0) return -1;
    unsigned char *p = b->p + b->len;
    for (size_t i = 0; i < m; i++) {
        int hi = hexval(s[2 + 2 * i]), lo = hexval(s[3 + 2 * i]);
        if (hi < 0 || lo < 0) return bad("bytea not in hex form");
        p[i] = (unsigned char)(hi << 4 | lo);
    }
    b->len += m;
    return 0;
}

/* TupleData at *pos -> Avro record in rec; key column values in kv (by key position).
 * Columns of kind K_SKIP are read past and leave nothing in rec (an unchanged TOASTed
 * value there included: it is not needed).
 * Returns 1 when a value is an unchanged TOASTed one ('u'), 0 when done, -1 on error. */
static int tuple(Codec *c, const unsigned char *p, Py_ssize_t end, Py_ssize_t *pos, Buf *rec,
                 KeyVal *kv) {
    Py_ssize_t i = *pos;
    if (i + 2 > end) return bad("pgoutput tuple truncated");
    int n = (p[i] << 8) | p[i + 1];
    i += 2;
    if (n != c->ncols) return bad("pgoutput tuple does not fit its relation");
    int unchanged = 0;
    for (int col = 0; col < n; col++) {
        if (i >= end) return bad("pgoutput tuple truncated");
        unsigned char kind = p[i++];
        int skip = c->kinds[col] == K_SKIP;
        int keypos = -1;
        for (int k = 0; k < c->nkey; k++)
            if (c->key_cols[k] == col) keypos = k;
        if (kind == 'n') {
            if (!skip && buf_byte(rec, 0) < 0) return -1;
            if (keypos >= 0) kv[keypos].null = 1;
            continue;
        }
        if (kind == 'u') {
            if (!skip) unchanged = 1;
            if (keypos >= 0) kv[keypos].null = 1;
            continue;
        }
        if (kind != 't') return bad("pgoutput tuple column of an unknown kind");
        if (i + 4 > end) return bad("pgoutput tuple truncated");
        uint32_t size = (uint32_t)p[i] << 24 | (uint32_t)p[i + 1] << 16 |
                        (uint32_t)p[i + 2] << 8 | (uint32_t)p[i + 3];
        i += 4;
        if ((Py_ssize_t)size > end - i) return bad("pgoutput value runs past the message");
        const unsigned char *s = p + i;
        i += size;
        if (skip) continue;
        if (buf_byte(rec, 2) < 0) return -1;
        KeyVal *v = keypos >= 0 ? &kv[keypos] : NULL;
        if (v) {
            v->null = 0;
            v->s = s;
            v->n = size;
        }
        switch (c->kinds[col]) {
        case K_STRING:
            if (put_bytes(rec, s, size) < 0) return -1;
            break;
        case K_LONG: {
            int64_t x;
            if (parse_long(s, size, &x) < 0 || put_long(rec, x) < 0) return -1;
            if (v) v->ival = x;
            break;
        }
        case K_BOOL: {
            int t = size == 1 && s[0] == 't';
            if (buf_byte(rec, t ? 1 : 0) < 0) return -1;
            if (v) v->ival = t;
            break;
        }
        case K_DOUBLE: {
            double d;
            if (parse_double(s, size, &d) < 0 || buf_reserve(rec, 8) < 0) return -1;
            memcpy(rec->p + rec->len, &d, 8); /* little-endian hosts (x86, arm64) */
            rec->len += 8;
            if (v) v->dval = d;
            break;
        }
        case K_BYTEA:
            if (put_bytea(rec, s, size) < 0) return -1;
            break;
        }
    }
    *pos = i;
    return unchanged;
}

/* the key, as TableVersion.key(values, row_index) makes it */
static int make_key(Codec *c, KeyVal *kv, int64_t row_index, Key *key) {
    key->bytes.len = 0;
    if (c->key_mode == KEY_ROWINDEX) {
        key->is_int = 1;
        key->ival = row_index;
        return 0;
    }
    if (c->key_mode == KEY_INT && !kv[0].null) {
        key->is_int = 1;
        key->ival = kv[0].ival;
        return 0;
    }
    key->is_int = 0;
    Buf *b = &key->bytes;
    if (buf_byte(b, '[') < 0) return -1;
    for (int k = 0; k < c->nkey; k++) {
        KeyVal *v = &kv[k];
        if (k && buf_byte(b, ',') < 0) return -1;
        if (v->null) {
            if (buf_put(b, "null", 4) < 0) return -1;
            continue;
        }
        char num[64];
        switch (c->kinds[c->key_cols[k]]) {
        case K_STRING:
            if (json_string(b, v->s, v->n) < 0) return -1;
            break;
        case K_LONG: {
            int len = snprintf(num, sizeof num, "%lld", (long long)v->ival);
            if (buf_put(b, num, (size_t)len) < 0) return -1;
            break;
        }
        case K_BOOL:
            if (buf_put(b, v->ival ? "true" : "false", v->ival ? 4 : 5) < 0) return -1;
            break;
        case K_DOUBLE: { /* repr(float), as a JSON string */
            char *r = PyOS_double_to_string(v->dval, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
            if (!r) return -1;
            int rc = json_string(b, (const unsigned char *)r, strlen(r));
            PyMem_Free(r);
            if (rc < 0) return -1;
            break;
        }
        case K_BYTEA: { /* {"hex": "..."}: the text after \x, lower-cased */
            if (buf_put(b, "{\"hex\":\"", 8) < 0 || buf_reserve(b, v->n) < 0) return -1;
            for (size_t i = 2; i < v->n; i++) {
                unsigned char ch = v->s[i];
                b->p[b->len++] = (unsigned char)(ch >= 'A' && ch <= 'F' ? ch + 32 : ch);
            }
            if (buf_put(b, "\"}", 2) < 0) return -1;
            break;
        }
        }
    }
    return buf_byte(b, ']');
}

static int same_key(Key *a, Key *b) {
    if (a->is_int != b->is_int) return 0;
    if (a->is_int) return a->ival == b->ival;
    return a->bytes.len == b->bytes.len && !memcmp(a->bytes.p, b->bytes.p, a->bytes.len);
}

/* ---------- Decoder: a session's relations and a transaction's rows ---------- */
typedef struct {
    PyObject_HEAD
    PyObject *rels;  /* dict: relation oid -> Codec or None */
    PyObject *held;  /* list: the codecs of pending rows (kept alive) */
    PyObject *last;  /* the last codec appended to held (borrowed) */
    Buf rows;        /* pending rows, see put_row */
    Py_ssize_t count;
    EvDigest meta_id;
    Buf rec, old, meta; /* scratch */
    Key k1, k2;
} Decoder;

static void Decoder_dealloc(Decoder *self) {
    Py_XDECREF(self->rels);
    Py_XDECREF(self->held);
    buf_free(&self->rows);
    buf_free(&self->rec);
    buf_free(&self->old);
    buf_free(&self->meta);
    buf_free(&self->k1.bytes);
    buf_free(&self->k2.bytes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Decoder_init(Decoder *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"meta_id", NULL};
    Py_buffer mid;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "y*", kwlist, &mid)) return -1;
    int bad = ev_digest_set(&self->meta_id, &mid, "metadata");
    PyBuffer_Release(&mid);
    if (bad < 0) return -1;
    Py_XSETREF(self->rels, PyDict_New());
    Py_XSETREF(self->held, PyList_New(0));
    self->last = NULL;
    self->rows.len = 0;
    self->count = 0;
    return self->rels && self->held ? 0 : -1;
}

/* a pending row: Codec*, op, is_int_key, key (int64 | u32 len + bytes), u32 payload length +
 * payload, i32 before length (-1: none) + before; native byte order (never leaves here) */
static int put_row(Decoder *d, Codec *c, int op, Key *key, const unsigned char *payload,
                   size_t plen, const unsigned char *before, Py_ssize_t blen) {
    if ((PyObject *)c != d->last) {
        if (PyList_Append(d->held, (PyObject *)c) < 0) return -1;
        d->last = (PyObject *)c;
    }
    Buf *b = &d->rows;
    unsigned char h[2] = {(unsigned char)op, (unsigned char)key->is_int};
    uint32_t n32;
    int32_t b32 = (int32_t)(before ? blen : -1);
    if (buf_put(b, &c, sizeof c) < 0 || buf_put(b, h, 2) < 0) return -1;
    if (key->is_int) {
        if (buf_put(b, &key->ival, 8) < 0) return -1;
    } else {
        n32 = (uint32_t)key->bytes.len;
        if (buf_put(b, &n32, 4) < 0 || buf_put(b, key->bytes.p, key->bytes.len) < 0) return -1;
    }
    n32 = (uint32_t)plen;
    if (buf_put(b, &n32, 4) < 0 || buf_put(b, payload, plen) < 0 || buf_put(b, &b32, 4) < 0)
        return -1;
    if (before && buf_put(b, before, (size_t)blen) < 0) return -1;
    d->count++;
    return 0;
}

/* change(payload, skip) -> 1 (decoded), 0 (a table not captured), -1 (Python's to decode)
 * payload: an Insert, Update or Delete message; skip: bytes after the type byte before the
 * relation oid (4: the transaction id of a streamed change, protocol 2) */
static PyObject *Decoder_change(Decoder *self, PyObject *args) {
    Py_buffer in;
    Py_ssize_t skip;
    if (!PyArg_ParseTuple(args, "y*n", &in, &skip)) return NULL;
    const unsigned char *p = in.buf;
    Py_ssize_t end = in.len, pos = 1 + skip;
    long result = -1;
    PyObject *out = NULL;
    if (skip < 0 || end < pos + 5) {
        bad("pgoutput change message truncated");
        goto done;
    }
    uint32_t oid = (uint32_t)p[pos] << 24 | (uint32_t)p[pos + 1] << 16 |
                   (uint32_t)p[pos + 2] << 8 | (uint32_t)p[pos + 3];
    pos += 4;
    PyObject *key = PyLong_FromUnsignedLong(oid);
    if (!key) goto done;
    PyObject *found = PyDict_GetItemWithError(self->rels, key); /* borrowed */
    Py_DECREF(key);
    if (!found) {
        if (PyErr_Occurred()) goto done;
        goto result; /* unknown relation: Python raises the error */
    }
    if (found == Py_None) {
        result = 0;
        goto result;
    }
    Codec *c = (Codec *)found;
    KeyVal kv_old[MAX_KEY], kv_new[MAX_KEY];
    if (c->nkey > MAX_KEY) goto result;
    memset(kv_old, 0, sizeof kv_old);
    memset(kv_new, 0, sizeof kv_new);
    int64_t index = self->count;
    unsigned char t = p[0], kind = p[pos++];
    self->rec.len = self->old.len = 0;
    int r;
    if (t == 'I' || t == 'D') {
        if ((t == 'I' && kind != 'N') || (t == 'D' && kind != 'K' && kind != 'O')) {
            bad("pgoutput change without its tuple");
            goto done;
        }
        r = tuple(c, p, end, &pos, &self->rec, kv_new);
        if (r < 0) goto done;
        if (r > 0) goto result;
        if (make_key(c, kv_new, index, &self->k1) < 0 ||
            put_row(self, c, t == 'I' ? OP_INSERT : OP_DELETE, &self->k1, self->rec.p,
                    self->rec.len, NULL, 0) < 0)
            goto done;
        result = 1;
        goto result;
    }
    if (t != 'U') {
        bad("not an Insert, Update or Delete message");
        goto done;
    }
    int has_old = 0, full = 0;
    if (kind == 'K' || kind == 'O') {
        has_old = 1;
        full = kind == 'O';
        r = tuple(c, p, end, &pos, &self->old, kv_old);
        if (r < 0) goto done;
        if (r > 0) goto result;
        if (pos >= end) {
            bad("pgoutput Update without its new tuple");
            goto done;
        }
        kind = p[pos++];
    }
    if (kind != 'N') {
        bad("pgoutput Update without its new tuple");
        goto done;
    }
    r = tuple(c, p, end, &pos, &self->rec, kv_new);
    if (r < 0) goto done;
    if (r > 0) goto result; /* unchanged TOASTed values: fetched or carried in Python */
    if (make_key(c, kv_new, index, &self->k1) < 0) goto done;
    if (has_old && c->key_mode != KEY_ROWINDEX) {
        if (make_key(c, kv_old, index, &self->k2) < 0) goto done;
        if (!same_key(&self->k1, &self->k2)) {
            if (put_row(self, c, OP_DELETE, &self->k2, self->old.p, self->old.len, NULL, 0) < 0 ||
                put_row(self, c, OP_INSERT, &self->k1, self->rec.p, self->rec.len, NULL, 0) < 0)
                goto done;
            result = 1;
            goto result;
        }
    }
    if (put_row(self, c, OP_UPDATE, &self->k1, self->rec.p, self->rec.len,
                full ? self->old.p : NULL, (Py_ssize_t)self->old.len) < 0)
        goto done;
    result = 1;
result:
    out = PyLong_FromLong(result);
done:
    PyBuffer_Release(&in);
    return out;
}

/* add(codec, op, key, payload, before): a row decoded in Python, in its place */
static PyObject *Decoder_add(Decoder *self, PyObject *args) {
    PyObject *codec, *key, *before;
    int op;
    Py_buffer payload;
    if (!PyArg_ParseTuple(args, "O!iOy*O", &CodecType, &codec, &op, &key, &payload, &before))
        return NULL;
    PyObject *out = NULL;
    Key k;
    memset(&k, 0, sizeof k);
    if (PyLong_Check(key)) {
        k.is_int = 1;
        k.ival = PyLong_AsLongLong(key);
        if (k.ival == -1 && PyErr_Occurred()) goto done;
    } else if (PyBytes_Check(key)) {
        if (buf_put(&k.bytes, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key)) < 0)
            goto done;
    } else {
        PyErr_SetString(PyExc_TypeError, "a key is int or bytes");
        goto done;
    }
    if (before != Py_None && !PyBytes_Check(before)) {
        PyErr_SetString(PyExc_TypeError, "a before image is bytes or None");
        goto done;
    }
    if (put_row(self, (Codec *)codec, op, &k, payload.buf, (size_t)payload.len,
                before == Py_None ? NULL : (const unsigned char *)PyBytes_AS_STRING(before),
                before == Py_None ? 0 : PyBytes_GET_SIZE(before)) < 0)
        goto done;
    out = Py_NewRef(Py_None);
done:
    buf_free(&k.bytes);
    PyBuffer_Release(&payload);
    return out;
}

/* commit(scn, timestamp_ns, txid, origin) -> (events: bytes, count): every pending row as an
 * event of window scn, metadata as source.py writes it; the pending rows are cleared */
static PyObject *Decoder_commit(Decoder *self, PyObject *args) {
    long long scn, ts;
    Py_buffer txid, origin;
    origin.buf = NULL;
    PyObject *origin_obj;
    if (!PyArg_ParseTuple(args, "LLy*O", &scn, &ts, &txid, &origin_obj)) return NULL;
    PyObject *result = NULL;
    Buf out = {0}, *meta = &self->meta;
    if (origin_obj != Py_None && PyObject_GetBuffer(origin_obj, &origin, PyBUF_SIMPLE) < 0)
        goto done;
    const unsigned char *r = self->rows.p, *rend = self->rows.p + self->rows.len;
    for (Py_ssize_t row = 0; row < self->count; row++) {
        Codec *c;
        memcpy(&c, r, sizeof c);
        r += sizeof c;
        int op = r[0], is_int = r[1];
        r += 2;
        int64_t ikey = 0;
        uint32_t klen = 0, plen;
        const unsigned char *kp = NULL;
        if (is_int) {
            memcpy(&ikey, r, 8);
            r += 8;
        } else {
            memcpy(&klen, r, 4);
            kp = r + 4;
            r += 4 + klen;
        }
        memcpy(&plen, r, 4);
        const unsigned char *payload = r + 4;
        r += 4 + plen;
        int32_t blen;
        memcpy(&blen, r, 4);
        r += 4;
        const unsigned char *before = blen >= 0 ? r : NULL;
        if (blen > 0) r += blen;
        if (r > rend) {
            PyErr_SetString(PyExc_SystemError, "pending rows damaged");
            goto done;
        }
        int with_meta = op != OP_TRUNCATE;
        if (with_meta) {
            meta->len = 0;
            if (before) {
                if (buf_byte(meta, 2) < 0 || put_bytes(meta, before, (size_t)blen) < 0) goto done;
            } else if (buf_byte(meta, 0) < 0) {
                goto done;
            }
            /* txid (union string), file (null), pos (union long), gtid, server_id (null),
             * row (union long) */
            if (buf_byte(meta, 2) < 0 || put_bytes(meta, txid.buf, (size_t)txid.len) < 0 ||
                buf_byte(meta, 0) < 0 || buf_byte(meta, 2) < 0 || put_long(meta, scn) < 0)
                goto done;
            if (origin.buf) {
                if (buf_byte(meta, 2) < 0 ||
                    put_bytes(meta, origin.buf, (size_t)origin.len) < 0)
                    goto done;
            } else if (buf_byte(meta, 0) < 0) {
                goto done;
            }
            if (buf_byte(meta, 0) < 0 || buf_byte(meta, 2) < 0 || put_long(meta, row) < 0)
                goto done;
        }
        size_t start;
        uint16_t attrs = (uint16_t)((op & 7) | (with_meta ? EV_ATTR_HAS_METADATA : 0));
        if (ev_start(&out, &start, is_int, ikey, kp, klen, &attrs) < 0) goto done;
        if (with_meta &&
            ev_part(&out, 0, self->meta_id.b, self->meta_id.len, meta->p, meta->len) < 0)
            goto done;
        if (ev_part(&out, c->schema.version, c->schema.id.b, c->schema.id.len, payload, plen)
            < 0)
            goto done;
        ev_finish(&out, start, attrs, ts, c->schema.src_id, scn);
    }
    result = Py_BuildValue("(y#n)", out.p ? (const char *)out.p : "", (Py_ssize_t)out.len,
                           self->count);
    if (result) {
        self->rows.len = 0;
        self->count = 0;
        self->last = NULL;
        if (PyList_SetSlice(self->held, 0, PyList_GET_SIZE(self->held), NULL) < 0)
            Py_CLEAR(result);
    }
done:
    buf_free(&out);
    PyBuffer_Release(&txid);
    if (origin.buf) PyBuffer_Release(&origin);
    return result;
}

static PyObject *Decoder_clear(Decoder *self, PyObject *unused) {
    (void)unused;
    self->rows.len = 0;
    self->count = 0;
    self->last = NULL;
    if (PyList_SetSlice(self->held, 0, PyList_GET_SIZE(self->held), NULL) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Decoder_relate(Decoder *self, PyObject *args) {
    PyObject *oid, *codec;
    if (!PyArg_ParseTuple(args, "O!O", &PyLong_Type, &oid, &codec)) return NULL;
    if (codec != Py_None && !PyObject_TypeCheck(codec, &CodecType)) {
        PyErr_SetString(PyExc_TypeError, "a relation's codec is a Codec or None");
        return NULL;
    }
    if (PyDict_SetItem(self->rels, oid, codec) < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *Decoder_forget(Decoder *self, PyObject *args) {
    PyObject *oid;
    if (!PyArg_ParseTuple(args, "O!", &PyLong_Type, &oid)) return NULL;
    if (PyDict_DelItem(self->rels, oid) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError)) return NULL;
        PyErr_Clear();
    }
    Py_RETURN_NONE;
}

static PyObject *Decoder_pending(Decoder *self, void *unused) {
    (void)unused;
    return PyLong_FromSsize_t(self->count);
}

static PyMethodDef Decoder_methods[] = {
    {"change", (PyCFunction)Decoder_change, METH_VARARGS,
     "change(payload, skip) -> 1 decoded, 0 table not captured, -1 for Python to decode"},
    {"add", (PyCFunction)Decoder_add, METH_VARARGS,
     "add(codec, op, key, payload, before): a row decoded in Python, in its place"},
    {"commit", (PyCFunction)Decoder_commit, METH_VARARGS,
     "commit(scn, timestamp_ns, txid, origin) -> (events, count); clears the rows"},
    {"clear", (PyCFunction)Decoder_clear, METH_NOARGS, "drop the pending rows"},
    {"relate", (PyCFunction)Decoder_relate, METH_VARARGS,
     "relate(oid, codec): the codec of a relation (None: not captured)"},
    {"forget", (PyCFunction)Decoder_forget, METH_VARARGS,
     "forget(oid): a relation Python decodes itself"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Decoder_getset[] = {
    {"pending", (getter)Decoder_pending, NULL, "rows waiting for the commit", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject DecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "databus.sources.postgres._pgcodec.Decoder",
    .tp_basicsize = sizeof(Decoder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Decoder(meta_id): a session's relations and a transaction's rows.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Decoder_init,
    .tp_dealloc = (destructor)Decoder_dealloc,
    .tp_methods = Decoder_methods,
    .tp_getset = Decoder_getset,
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_pgcodec",
                                       "Compiled pgoutput row codec.", -1, NULL};

PyMODINIT_FUNC PyInit__pgcodec(void) {
    crc_init();
    if (PyType_Ready(&CodecType) < 0 || PyType_Ready(&DecoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    Py_INCREF(&CodecType);
    Py_INCREF(&DecoderType);
    if (PyModule_AddObject(m, "Codec", (PyObject *)&CodecType) < 0 ||
        PyModule_AddObject(m, "Decoder", (PyObject *)&DecoderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
