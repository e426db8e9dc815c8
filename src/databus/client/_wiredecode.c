/*
 * The client's compiled decoder: relay /stream bodies -> events, Avro rows -> Python values.
 *
 * This is the compiled half of databus.client.wiredecode (read its docstring for the
 * contract; the Python half there is the fallback with the same output).
 *
 * scan(body, verify, Event) walks every event of a body in one call: version, magic,
 * lengths and (verify) both CRCs, the key and the parts, exactly as
 * databus.core.event.decode checks them, and builds the Event objects directly into
 * their slots (the dataclass __init__ costs about 1 us an event, more than the rest of
 * the scan). It works in two phases: the walk (every check, every CRC) records where
 * each event's fields are in a C array without touching a Python object, so for
 * bodies of 64 KiB and more it runs without the GIL; then the objects are built with
 * the GIL held. scan_table(body, verify) stops after the walk and returns int64
 * columns (offset, source, attributes, payload offset and length) and the runs of
 * one schema, no object per event; events_at() builds the Events of chosen offsets
 * later, and RowDecoder.rows_at/columns_at decode payloads in place from those spans.
 * RowDecoder decodes flat Avro records (null, boolean, int, long, float, double,
 * string, bytes, unions of them; logical types through the Python converter handed
 * in) into dicts keyed by column name, into lists of dicts, or into one list per
 * column without building a dict per row.
 *
 * Measured reason (bench/client_throughput.py, bench/RESULTS.md): the Python path
 * spent half of the client's time in core.event.decode (struct unpacking, CRC
 * slices, the Event dataclass) and a fifth in fastavro's per-row reader set-up; both
 * together cap the client at about a quarter of a bare fastavro loop. Then, with
 * this scan, it was the bootstrap client's largest cost (34% of a 200k-row snapshot,
 * ~0.37 us an event: half the CRCs, half the Event objects) and it held the GIL, so
 * the prefetch thread and the delivering thread did not overlap: hence the walk
 * without the GIL, and scan_table for batch consumers (0.17 us an event with both
 * CRCs; a 10k-row snapshot page to columns 0.25 us a row instead of 0.44).
 *
 * It never guesses: any input it does not handle exactly like the Python path (a
 * damaged or truncated event, a varint beyond 64 bits, a boolean byte other than 0/1,
 * an int outside int32, invalid UTF-8, a union index out of range, a converter that
 * raises) makes the call return None, and the caller decodes the same input with the
 * Python path, which produces the value or raises the proper typed error. Nothing is
 * read out of bounds: every read is checked against the event's (or row's) end.
 *
 * Shares its wire walk with databus/spark/_fastdecode.c (which writes Arrow buffers
 * instead of Python objects); merging the two behind one walk with two sinks is the
 * next step (see wiredecode.py).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

/* Avro branch types (the same codes as spark/_fastdecode.c's T_*) */
enum { A_NULL = 0, A_BOOL, A_INT, A_LONG, A_FLOAT, A_DOUBLE, A_STRING, A_BYTES };

#define HEADER_LEN 45
#define MIN_TOTAL (HEADER_LEN + 8 + 7)
#define MAX_BRANCHES 16
#define ATTR_KEY_BYTES 0x0008
#define ATTR_HAS_METADATA 0x0010

static uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}
static uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }
static int16_t be16s(const uint8_t *p) { return (int16_t)(((unsigned)p[0] << 8) | p[1]); }

/* ---------------------------------------------------------------- events */

/* Event's fields, in its dataclass order */
enum { F_SCN, F_SRC, F_KEY, F_ATTR, F_TS, F_PART, F_SID, F_SVER, F_PAYLOAD, F_MSID, F_META, NF };
static const char *const field_names[NF] = {
    "scn", "src_id", "key", "attributes", "timestamp_ns", "partition", "schema_id",
    "schema_version", "payload", "metadata_schema_id", "metadata"};

static PyTypeObject *event_type = NULL; /* the class the offsets below belong to */
static Py_ssize_t slot_off[NF];
static int slots_direct = 0; /* 1: fill the slots; 0: call the class */

/* Find where the (slots, frozen) dataclass keeps each field; when the layout is not
 * the expected one, events are built by calling the class instead (same result). */
static int learn_event_type(PyObject *type) {
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "event_type must be a class");
        return -1;
    }
    Py_XDECREF(event_type);
    event_type = (PyTypeObject *)Py_NewRef(type);
    slots_direct = 1;
    for (int f = 0; f < NF; f++) {
        PyObject *d = PyObject_GetAttrString(type, field_names[f]);
        if (!d) return -1;
        if (!Py_IS_TYPE(d, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX)
            slots_direct = 0;
        else
            slot_off[f] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
    }
    return 0;
}

/* steals the references in vals */
static PyObject *make_event(PyObject **vals) {
    for (int f = 0; f < NF; f++)
        if (!vals[f]) goto fail;
    if (slots_direct) {
        PyObject *obj = event_type->tp_alloc(event_type, 0);
        if (!obj) goto fail;
        for (int f = 0; f < NF; f++) *(PyObject **)((char *)obj + slot_off[f]) = vals[f];
        /* Its fields are ints, bytes and None: it can be in no reference cycle, so the
         * cyclic GC need not track it (as CPython untracks tuples of atomic values).
         * Tracked, the tens of thousands of events of one body made every collection
         * they triggered walk all of them: 1 us an event on a 4 MiB body instead of
         * 0.4. The slots are never set again (a frozen dataclass). */
        if (PyObject_GC_IsTracked(obj)) PyObject_GC_UnTrack(obj);
        return obj;
    }
    PyObject *obj = PyObject_Vectorcall((PyObject *)event_type, vals, NF, NULL);
    for (int f = 0; f < NF; f++) Py_DECREF(vals[f]);
    return obj;
fail:
    for (int f = 0; f < NF; f++) Py_XDECREF(vals[f]);
    return NULL;
}

/* a part: int32 length, int16 schema version, uint8 digest length, digest, data */
static int rd_part(const uint8_t **pp, const uint8_t *end, int16_t *ver, const uint8_t **dg,
                   Py_ssize_t *dgn, const uint8_t **data, Py_ssize_t *n) {
    const uint8_t *p = *pp;
    if (end - p < 7) return 1;
    int32_t dlen = (int32_t)be32(p);
    *ver = be16s(p + 4);
    uint8_t dglen = p[6];
    p += 7;
    if (dlen < 0 || (Py_ssize_t)dglen + dlen > end - p) return 1;
    *dg = p; *dgn = dglen; p += dglen;
    *data = p; *n = dlen; p += dlen;
    *pp = p;
    return 0;
}

/* Where one checked event's fields are: filled without the GIL, no Python object. */
typedef struct {
    const uint8_t *e;            /* the event's first byte */
    const uint8_t *k;            /* key bytes, or NULL: an int64 key after the header */
    const uint8_t *mdg, *mdata;  /* metadata part; mdata NULL: none */
    const uint8_t *dg, *data;    /* payload part */
    Py_ssize_t kn, mdgn, mn, dgn, dn;
    uint32_t total;
    unsigned attrs;
    int16_t ver;
} Span;

/* The event at e (avail bytes from e to the body's end): 0 ok, 1 not handled here
 * (damaged, truncated, malformed: the Python path raises). Touches no Python object,
 * so it runs without the GIL. */
static int walk_one(const uint8_t *e, Py_ssize_t avail, int verify, Span *s) {
    if (avail < HEADER_LEN) return 1;
    if (e[0] != 2 || be32(e + 1) != 0xCAFEDEEDu || be32(e + 5) != HEADER_LEN) return 1;
    uint32_t total = be32(e + 17);
    if (total < MIN_TOTAL || (Py_ssize_t)total > avail) return 1;
    if (verify) {
        uLong crc = crc32(crc32(0L, e, 9), e + 13, HEADER_LEN - 13);
        if ((uint32_t)crc != be32(e + 9)) return 1;
        if ((uint32_t)crc32(0L, e + HEADER_LEN, total - HEADER_LEN) != be32(e + 13)) return 1;
    }
    const uint8_t *end = e + total, *p = e + HEADER_LEN;
    int16_t mver;
    s->e = e;
    s->total = total;
    s->attrs = ((unsigned)e[21] << 8) | e[22];
    s->k = NULL; s->kn = 0;
    s->mdg = s->mdata = NULL; s->mdgn = s->mn = 0;
    if (s->attrs & ATTR_KEY_BYTES) {
        int32_t klen = (int32_t)be32(p);
        if (klen < 0 || (Py_ssize_t)klen > end - p - 4) return 1;
        s->k = p + 4; s->kn = klen; p += 4 + klen;
    } else {
        p += 8;
    }
    if ((s->attrs & ATTR_HAS_METADATA)
        && rd_part(&p, end, &mver, &s->mdg, &s->mdgn, &s->mdata, &s->mn))
        return 1;
    if (rd_part(&p, end, &s->ver, &s->dg, &s->dgn, &s->data, &s->dn) || p != end) return 1;
    return 0;
}

/* Every event of buf[0, n): *out (PyMem_Raw memory, the caller frees it) and *count.
 * 0 ok, 1 not handled here, -1 out of memory. No GIL needed. */
static int walk(const uint8_t *buf, Py_ssize_t n, int verify, Span **out, Py_ssize_t *count) {
    Py_ssize_t cap = 0, c = 0, off = 0;
    Span *spans = NULL;
    int r = 0;
    while (off < n) {
        if (c == cap) {
            Py_ssize_t ncap = cap ? cap * 2 : 1024;
            Span *grown = PyMem_RawRealloc(spans, (size_t)ncap * sizeof(Span));
            if (!grown) { r = -1; break; }
            spans = grown;
            cap = ncap;
        }
        if (walk_one(buf + off, n - off, verify, &spans[c])) { r = 1; break; }
        off += spans[c++].total;
    }
    if (r) {
        PyMem_RawFree(spans);
        spans = NULL;
        c = 0;
    }
    *out = spans;
    *count = c;
    return r;
}

/* Bodies from this size on are walked without the GIL (a small body is walked faster
 * than the GIL is handed over and back). */
#define NOGIL_MIN (64 * 1024)

static int walk_body(const Py_buffer *view, int verify, Span **out, Py_ssize_t *count) {
    int r;
    if (view->len >= NOGIL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        r = walk(view->buf, view->len, verify, out, count);
        Py_END_ALLOW_THREADS
    } else {
        r = walk(view->buf, view->len, verify, out, count);
    }
    if (r < 0) PyErr_NoMemory();
    return r;
}

#define NDIGESTS 8
typedef struct { PyObject *obj[NDIGESTS]; int n, next; } DigestCache;

/* one bytes object per distinct digest of a body: fewer allocations, and the
 * dispatcher's schema lookups hit the identity check */
static PyObject *digest_obj(DigestCache *dc, const uint8_t *s, Py_ssize_t n) {
    for (int i = 0; i < dc->n; i++) {
        PyObject *o = dc->obj[i];
        if (PyBytes_GET_SIZE(o) == n && memcmp(PyBytes_AS_STRING(o), s, (size_t)n) == 0)
            return Py_NewRef(o);
    }
    PyObject *o = PyBytes_FromStringAndSize((const char *)s, n);
    if (!o) return NULL;
    if (dc->n < NDIGESTS) {
        dc->obj[dc->n++] = Py_NewRef(o);
    } else {
        Py_SETREF(dc->obj[dc->next], Py_NewRef(o));
        dc->next = (dc->next + 1) % NDIGESTS;
    }
    return o;
}

static void digest_clear(DigestCache *dc) {
    for (int i = 0; i < dc->n; i++) Py_DECREF(dc->obj[i]);
    dc->n = 0;
}

/* the Event of a walked span (a new reference, or NULL with an error set) */
static PyObject *span_event(const Span *s, DigestCache *dc) {
    const uint8_t *e = s->e;
    PyObject *vals[NF] = {0};
    vals[F_SCN] = PyLong_FromLongLong((long long)(int64_t)be64(e + 37));
    vals[F_SRC] = PyLong_FromLong((long)(int32_t)be32(e + 31));
    vals[F_KEY] = s->k ? PyBytes_FromStringAndSize((const char *)s->k, s->kn)
                       : PyLong_FromLongLong((long long)(int64_t)be64(e + HEADER_LEN));
    vals[F_ATTR] = PyLong_FromLong((long)s->attrs);
    vals[F_TS] = PyLong_FromLongLong((long long)(int64_t)be64(e + 23));
    vals[F_PART] = PyLong_FromLong((long)be16s(e + 35));
    vals[F_SID] = digest_obj(dc, s->dg, s->dgn);
    vals[F_SVER] = PyLong_FromLong((long)s->ver);
    vals[F_PAYLOAD] = PyBytes_FromStringAndSize((const char *)s->data, s->dn);
    if (s->mdata) {
        vals[F_MSID] = digest_obj(dc, s->mdg, s->mdgn);
        vals[F_META] = PyBytes_FromStringAndSize((const char *)s->mdata, s->mn);
    } else {
        vals[F_MSID] = PyBytes_FromStringAndSize("", 0);
        vals[F_META] = Py_NewRef(Py_None);
    }
    return make_event(vals);
}

/* a list of the Events of spans[0, n) */
static PyObject *span_events(const Span *spans, Py_ssize_t n) {
    DigestCache dc = {{0}, 0, 0};
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out && i < n; i++) {
        PyObject *obj = span_event(&spans[i], &dc);
        if (!obj) Py_CLEAR(out);  /* unset items are NULL, which list dealloc skips */
        else PyList_SET_ITEM(out, i, obj);
    }
    digest_clear(&dc);
    return out;
}

/* scan(body, verify, Event) -> [Event] or None: every byte is checked (phase one,
 * without the GIL for large bodies) before any object is made (phase two) */
static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer view;
    int verify;
    PyObject *etype, *out = NULL;
    if (!PyArg_ParseTuple(args, "y*pO", &view, &verify, &etype)) return NULL;
    Span *spans = NULL;
    Py_ssize_t n = 0;
    if ((PyTypeObject *)etype != event_type && learn_event_type(etype) < 0) goto done;
    int r = walk_body(&view, verify, &spans, &n);
    if (r < 0) goto done;
    out = r ? Py_NewRef(Py_None) : span_events(spans, n);
done:
    PyMem_RawFree(spans);
    PyBuffer_Release(&view);
    return out;
}

/* Table columns, int64 each, column-major (see wiredecode.Scanned) */
enum { C_OFF, C_SRC, C_ATTR, C_POFF, C_PLEN, NCOLS };

/* whether events a and b belong to one run: the same schema digest, or both without
 * one and of the same source (the dispatcher's view per schema id / per source) */
static int same_run(const Span *a, const Span *b) {
    if (a->dgn != b->dgn || memcmp(a->dg, b->dg, (size_t)a->dgn) != 0) return 0;
    return a->dgn || be32(a->e + 31) == be32(b->e + 31);
}

/* scan_table(body, verify) -> (table bytes, [(start, end) of each run]) or None */
static PyObject *scan_table(PyObject *self, PyObject *args) {
    Py_buffer view;
    int verify;
    PyObject *out = NULL, *table = NULL, *runs = NULL;
    if (!PyArg_ParseTuple(args, "y*p", &view, &verify)) return NULL;
    Span *spans = NULL;
    Py_ssize_t n = 0;
    int r = walk_body(&view, verify, &spans, &n);
    if (r < 0) goto done;
    if (r) { out = Py_NewRef(Py_None); goto done; }
    if (n > PY_SSIZE_T_MAX / (Py_ssize_t)(NCOLS * sizeof(int64_t))) { PyErr_NoMemory(); goto done; }
    table = PyBytes_FromStringAndSize(NULL, n * NCOLS * (Py_ssize_t)sizeof(int64_t));
    runs = PyList_New(0);
    if (!table || !runs) goto done;
    int64_t *col = (int64_t *)PyBytes_AS_STRING(table);
    const uint8_t *buf = view.buf;
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const Span *s = &spans[i];
        col[C_OFF * n + i] = s->e - buf;
        col[C_SRC * n + i] = (int32_t)be32(s->e + 31);
        col[C_ATTR * n + i] = s->attrs;
        col[C_POFF * n + i] = s->data - buf;
        col[C_PLEN * n + i] = s->dn;
        if (i + 1 == n || !same_run(s, &spans[i + 1])) {
            PyObject *run = Py_BuildValue("(nn)", start, i + 1);
            if (!run || PyList_Append(runs, run) < 0) { Py_XDECREF(run); goto done; }
            Py_DECREF(run);
            start = i + 1;
        }
    }
    out = PyTuple_Pack(2, table, runs);
done:
    Py_XDECREF(table);
    Py_XDECREF(runs);
    PyMem_RawFree(spans);
    PyBuffer_Release(&view);
    return out;
}

/* events_at(body, offsets (int64 buffer), Event) -> [Event] or None: the events
 * starting at those offsets of a body scan_table checked (lengths checked again, not
 * the CRCs) */
static PyObject *events_at(PyObject *self, PyObject *args) {
    Py_buffer view, offs;
    PyObject *etype, *out = NULL;
    if (!PyArg_ParseTuple(args, "y*y*O", &view, &offs, &etype)) return NULL;
    Py_ssize_t n = offs.len / (Py_ssize_t)sizeof(int64_t);
    Span *spans = NULL;
    if ((PyTypeObject *)etype != event_type && learn_event_type(etype) < 0) goto done;
    spans = PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(Span));
    if (!spans) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t off;
        memcpy(&off, (const char *)offs.buf + i * (Py_ssize_t)sizeof(int64_t), sizeof off);
        if (off < 0 || off >= view.len
            || walk_one((const uint8_t *)view.buf + off, view.len - (Py_ssize_t)off, 0,
                        &spans[i])) {
            out = Py_NewRef(Py_None);
            goto done;
        }
    }
    out = span_events(spans, n);
done:
    PyMem_RawFree(spans);
    PyBuffer_Release(&offs);
    PyBuffer_Release(&view);
    return out;
}

/* ---------------------------------------------------------------- rows */

static int rd_long(const uint8_t **pp, const uint8_t *end, int64_t *out) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int shift = 0; shift < 70; shift += 7) {
        if (p >= end) return 1;
        uint8_t b = *p++;
        if (shift == 63 && (b & 0x7e)) return 1; /* beyond 64 bits: fastavro's call */
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *pp = p;
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return 0;
        }
    }
    return 1;
}

typedef struct {
    PyObject *name;                   /* the column name (str) */
    int nbranch;                      /* 0 = not a union */
    uint8_t branch[MAX_BRANCHES];     /* branch types (or the single type) */
    PyObject *conv[MAX_BRANCHES];     /* logical-type converter per branch, or NULL */
} RField;

typedef struct {
    PyObject_HEAD
    int nfields;
    RField *fields;
    PyObject *names; /* tuple of the column names */
} RowDecoder;

/* one value: 0 ok (*out a new reference), 1 not handled here, -1 error set */
static int rd_value(const RField *fd, const uint8_t **pp, const uint8_t *end, PyObject **out) {
    const uint8_t *p = *pp;
    int t = fd->branch[0];
    PyObject *conv = fd->conv[0];
    if (fd->nbranch) {
        int64_t b;
        if (rd_long(&p, end, &b) || b < 0 || b >= fd->nbranch) return 1;
        t = fd->branch[b];
        conv = fd->conv[b];
    }
    PyObject *v = NULL;
    switch (t) {
    case A_NULL:
        v = Py_NewRef(Py_None);
        break;
    case A_BOOL:
        if (p >= end || *p > 1) return 1;
        v = Py_NewRef(*p ? Py_True : Py_False);
        p++;
        break;
    case A_INT: case A_LONG: {
        int64_t x;
        if (rd_long(&p, end, &x)) return 1;
        if (t == A_INT && (x < INT32_MIN || x > INT32_MAX)) return 1;
        v = PyLong_FromLongLong((long long)x);
        break;
    }
    case A_FLOAT: {
        if (end - p < 4) return 1;
        float f;
        memcpy(&f, p, 4); /* Avro is little-endian IEEE, as x86 and ARM */
        p += 4;
        v = PyFloat_FromDouble((double)f);
        break;
    }
    case A_DOUBLE: {
        if (end - p < 8) return 1;
        double d;
        memcpy(&d, p, 8);
        p += 8;
        v = PyFloat_FromDouble(d);
        break;
    }
    case A_STRING: case A_BYTES: {
        int64_t len;
        if (rd_long(&p, end, &len) || len < 0 || len > end - p) return 1;
        if (t == A_BYTES) {
            v = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)len);
        } else {
            v = PyUnicode_DecodeUTF8((const char *)p, (Py_ssize_t)len, NULL);
            if (!v) {
                if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return -1;
                PyErr_Clear();
                return 1;
            }
        }
        p += len;
        break;
    }
    default:
        return 1;
    }
    if (!v) return -1;
    if (conv && t != A_NULL) {
        PyObject *c = PyObject_CallOneArg(conv, v);
        Py_DECREF(v);
        if (!c) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) return -1;
            PyErr_Clear(); /* the Python path raises it again, as the typed error */
            return 1;
        }
        v = c;
    }
    *pp = p;
    *out = v;
    return 0;
}

/* the record's values into vals[nfields] (new references; none left on failure) */
static int rd_record(const RowDecoder *rd, const uint8_t *p, const uint8_t *end, PyObject **vals) {
    for (int f = 0; f < rd->nfields; f++) {
        int r = rd_value(&rd->fields[f], &p, end, &vals[f]);
        if (r) {
            for (int g = 0; g < f; g++) Py_DECREF(vals[g]);
            return r;
        }
    }
    return 0; /* trailing bytes are ignored, as fastavro does */
}

static PyObject *record_dict(const RowDecoder *rd, PyObject **vals) {
    PyObject *d = _PyDict_NewPresized(rd->nfields);
    for (int f = 0; f < rd->nfields; f++) {
        if (d && PyDict_SetItem(d, rd->fields[f].name, vals[f]) < 0) Py_CLEAR(d);
        Py_DECREF(vals[f]);
    }
    return d;
}

/* the bytes of one item of a rows()/columns() sequence */
static int item_span(PyObject *item, Py_buffer *view, const uint8_t **p, Py_ssize_t *n) {
    if (PyBytes_CheckExact(item)) {
        view->obj = NULL;
        *p = (const uint8_t *)PyBytes_AS_STRING(item);
        *n = PyBytes_GET_SIZE(item);
        return 0;
    }
    if (PyObject_GetBuffer(item, view, PyBUF_SIMPLE) < 0) return -1;
    *p = view->buf;
    *n = view->len;
    return 0;
}

#define STACK_FIELDS 64

static PyObject *rowdec_row(RowDecoder *self, PyObject *arg) {
    Py_buffer view;
    const uint8_t *p;
    Py_ssize_t n;
    PyObject *stack[STACK_FIELDS], **vals = stack;
    if (item_span(arg, &view, &p, &n) < 0) return NULL;
    PyObject *out = NULL;
    if (self->nfields > STACK_FIELDS) {
        vals = PyMem_Malloc(sizeof(PyObject *) * (size_t)self->nfields);
        if (!vals) { PyErr_NoMemory(); goto done; }
    }
    int r = rd_record(self, p, p + n, vals);
    if (r == 0) out = record_dict(self, vals);
    else if (r == 1) out = Py_NewRef(Py_None);
done:
    if (vals != stack) PyMem_Free(vals);
    if (view.obj) PyBuffer_Release(&view);
    return out;
}

/* Rows i in [0, n): each item of items (bytes or buffers), or, when items is NULL,
 * base[offs[i], offs[i] + lens[i]) of one checked body (read in place). columns: a tuple
 * of lists (one per field), else a list of dicts; None when the Python path must decode. */
static PyObject *decode_many(RowDecoder *self, Py_ssize_t n, PyObject **items,
                             const Py_buffer *base, const int64_t *offs, const int64_t *lens,
                             int columns) {
    PyObject *stack[STACK_FIELDS], **vals = stack;
    PyObject *out = NULL, *result = NULL;
    int nf = self->nfields;
    if (nf > STACK_FIELDS) {
        vals = PyMem_Malloc(sizeof(PyObject *) * (size_t)nf);
        if (!vals) { PyErr_NoMemory(); goto done; }
    }
    if (columns) {
        out = PyTuple_New(nf);
        if (!out) goto done;
        for (int f = 0; f < nf; f++) {
            PyObject *col = PyList_New(n);
            if (!col) goto done;
            PyTuple_SET_ITEM(out, f, col);
        }
    } else {
        out = PyList_New(n);
        if (!out) goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer view;
        const uint8_t *p;
        Py_ssize_t len;
        int r;
        if (items) {
            if (item_span(items[i], &view, &p, &len) < 0) goto done;
            r = rd_record(self, p, p + len, vals);
            if (view.obj) PyBuffer_Release(&view);
        } else {
            int64_t o, l;
            memcpy(&o, offs + i, sizeof o);
            memcpy(&l, lens + i, sizeof l);
            if (o < 0 || l < 0 || o > base->len || l > base->len - o) {
                PyErr_SetString(PyExc_ValueError, "payload span outside the body");
                goto done;
            }
            p = (const uint8_t *)base->buf + o;
            r = rd_record(self, p, p + l, vals);
        }
        if (r < 0) goto done;
        if (r == 1) { result = Py_NewRef(Py_None); goto done; }
        if (columns) {
            for (int f = 0; f < nf; f++)
                PyList_SET_ITEM(PyTuple_GET_ITEM(out, f), i, vals[f]);
        } else {
            PyObject *d = record_dict(self, vals);
            if (!d) goto done;
            PyList_SET_ITEM(out, i, d);
        }
    }
    result = Py_NewRef(out);
done:
    Py_XDECREF(out); /* unset list items are NULL, which list dealloc skips */
    if (vals != stack) PyMem_Free(vals);
    return result;
}

/* rows(payloads) -> list of dicts; columns(payloads) -> tuple of lists (one per field) */
static PyObject *rowdec_many(RowDecoder *self, PyObject *arg, int columns) {
    PyObject *seq = PySequence_Fast(arg, "payloads must be a sequence");
    if (!seq) return NULL;
    PyObject *out = decode_many(self, PySequence_Fast_GET_SIZE(seq), PySequence_Fast_ITEMS(seq),
                                NULL, NULL, NULL, columns);
    Py_DECREF(seq);
    return out;
}

static PyObject *rowdec_rows(RowDecoder *self, PyObject *arg) { return rowdec_many(self, arg, 0); }
static PyObject *rowdec_columns(RowDecoder *self, PyObject *arg) { return rowdec_many(self, arg, 1); }

/* rows_at / columns_at(body, offsets, lengths): the payloads at those int64 spans */
static PyObject *rowdec_many_at(RowDecoder *self, PyObject *args, int columns) {
    Py_buffer body, offs, lens;
    if (!PyArg_ParseTuple(args, "y*y*y*", &body, &offs, &lens)) return NULL;
    PyObject *out = NULL;
    if (offs.len != lens.len || offs.len % (Py_ssize_t)sizeof(int64_t))
        PyErr_SetString(PyExc_ValueError, "offsets and lengths must be int64 arrays of one size");
    else
        out = decode_many(self, offs.len / (Py_ssize_t)sizeof(int64_t), NULL, &body, offs.buf,
                          lens.buf, columns);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&offs);
    PyBuffer_Release(&body);
    return out;
}

static PyObject *rowdec_rows_at(RowDecoder *self, PyObject *args) {
    return rowdec_many_at(self, args, 0);
}
static PyObject *rowdec_columns_at(RowDecoder *self, PyObject *args) {
    return rowdec_many_at(self, args, 1);
}

static void rowdec_dealloc(RowDecoder *self) {
    for (int f = 0; f < self->nfields; f++) {
        Py_XDECREF(self->fields[f].name);
        for (int b = 0; b < MAX_BRANCHES; b++) Py_XDECREF(self->fields[f].conv[b]);
    }
    PyMem_Free(self->fields);
    Py_XDECREF(self->names);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* RowDecoder(fields): fields = ((name str, union 0/1, branch-types bytes,
 * converters tuple (callable or None per branch)), ...) */
static int rowdec_init(RowDecoder *self, PyObject *args, PyObject *kwds) {
    PyObject *fields;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &fields)) return -1;
    if (self->fields) {
        PyErr_SetString(PyExc_TypeError, "RowDecoder is initialised once");
        return -1;
    }
    Py_ssize_t nf = PyTuple_GET_SIZE(fields);
    if (nf > INT_MAX / 2) { PyErr_SetString(PyExc_ValueError, "too many fields"); return -1; }
    self->fields = PyMem_Calloc((size_t)(nf ? nf : 1), sizeof(RField));
    self->names = PyTuple_New(nf);
    if (!self->fields || !self->names) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t f = 0; f < nf; f++) {
        PyObject *name, *convs;
        int uni;
        const char *br;
        Py_ssize_t nb;
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(fields, f), "Upy#O!", &name, &uni, &br, &nb,
                              &PyTuple_Type, &convs))
            return -1;
        if (nb < 1 || nb > MAX_BRANCHES || (!uni && nb != 1) || PyTuple_GET_SIZE(convs) != nb) {
            PyErr_SetString(PyExc_ValueError, "bad field plan");
            return -1;
        }
        RField *fd = &self->fields[f];
        for (Py_ssize_t b = 0; b < nb; b++) {
            if ((uint8_t)br[b] > A_BYTES) { PyErr_SetString(PyExc_ValueError, "bad branch type"); return -1; }
            PyObject *c = PyTuple_GET_ITEM(convs, b);
            if (c != Py_None) {
                if (!PyCallable_Check(c)) { PyErr_SetString(PyExc_TypeError, "converter not callable"); return -1; }
                fd->conv[b] = Py_NewRef(c);
            }
        }
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name);
        fd->name = name;
        PyTuple_SET_ITEM(self->names, f, Py_NewRef(name));
        fd->nbranch = uni ? (int)nb : 0;
        memcpy(fd->branch, br, (size_t)nb);
        self->nfields = (int)(f + 1);
    }
    return 0;
}

static PyObject *rowdec_names(RowDecoder *self, void *closure) { return Py_NewRef(self->names); }

static PyMethodDef rowdec_methods[] = {
    {"row", (PyCFunction)rowdec_row, METH_O,
     "row(data) -> dict keyed by column name, or None when the Python path must decode it"},
    {"rows", (PyCFunction)rowdec_rows, METH_O,
     "rows(payloads) -> list of dicts, or None when the Python path must decode them"},
    {"columns", (PyCFunction)rowdec_columns, METH_O,
     "columns(payloads) -> tuple of lists, one per field in schema order, or None"},
    {"rows_at", (PyCFunction)rowdec_rows_at, METH_VARARGS,
     "rows_at(body, offsets, lengths) -> rows() of the payloads at those int64 spans"},
    {"columns_at", (PyCFunction)rowdec_columns_at, METH_VARARGS,
     "columns_at(body, offsets, lengths) -> columns() of the payloads at those int64 spans"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef rowdec_getset[] = {
    {"names", (getter)rowdec_names, NULL, "the column names, in schema order", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject RowDecoderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "databus.client._wiredecode.RowDecoder",
    .tp_basicsize = sizeof(RowDecoder),
    .tp_dealloc = (destructor)rowdec_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A compiled decoder of one flat Avro record schema.",
    .tp_methods = rowdec_methods,
    .tp_getset = rowdec_getset,
    .tp_init = (initproc)rowdec_init,
    .tp_new = PyType_GenericNew,
};

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(body, verify, event_type) -> list of events, or None when the Python path must "
     "decode this body (it raises the typed error)"},
    {"scan_table", scan_table, METH_VARARGS,
     "scan_table(body, verify) -> (int64 table bytes, [(start, end) of each run]), or None"},
    {"events_at", events_at, METH_VARARGS,
     "events_at(body, offsets, event_type) -> the events at those offsets, or None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_wiredecode",
                                       "Relay /stream bodies -> events and rows.", -1, methods};

PyMODINIT_FUNC PyInit__wiredecode(void) {
    if (PyType_Ready(&RowDecoderType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m) return NULL;
    if (PyModule_AddObjectRef(m, "RowDecoder", (PyObject *)&RowDecoderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
