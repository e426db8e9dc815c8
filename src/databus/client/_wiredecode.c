/*
 * The one compiled decoder of the relay's wire format: /stream bodies (and bootstrap
 * pages) -> events, Avro rows -> Python values, or -> Arrow envelope buffers.
 *
 * One walk (walk_one: every check of databus.core.event.decode, both CRCs) with two
 * sinks: Python objects (scan, scan_table, events_at, RowDecoder) for the client, the
 * bootstrap client and the replicate sink, the compiled half of
 * databus.client.wiredecode (read its docstring for the contract; the Python half
 * there is the fallback with the same output); and Arrow buffers (envelope_columns,
 * at the end of this file) for the Spark source and snapshot reader, the compiled
 * half of databus.spark.fastread (whose Python path is the fallback).
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
 * Avro branch type codes (A_*) are the same numbers in both sinks and in the Python
 * callers (wiredecode._CODES, fastread._AVRO_CODES / _ARROW_CODES).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h> /* CRC-32 checks: zlib's crc32 */

#include "../core/_cenc.h" /* the event layout, big-endian readers, Buf */

/* Avro branch types; the Arrow sink's column kinds use the same codes (keep in step
 * with wiredecode.py's _CODES and fastread.py's _AVRO_CODES / _ARROW_CODES) */
enum { A_NULL = 0, A_BOOL, A_INT, A_LONG, A_FLOAT, A_DOUBLE, A_STRING, A_BYTES };

#define MIN_TOTAL (EV_HEADER_LEN + 8 + 7)
#define MAX_BRANCHES 16

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
    int32_t dlen = (int32_t)get_be32(p);
    *ver = get_be16s(p + 4);
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
    if (avail < EV_HEADER_LEN) return 1;
    if (e[0] != 2 || get_be32(e + 1) != 0xCAFEDEEDu || get_be32(e + 5) != EV_HEADER_LEN) return 1;
    uint32_t total = get_be32(e + 17);
    if (total < MIN_TOTAL || (Py_ssize_t)total > avail) return 1;
    if (verify) {
        uLong crc = crc32(crc32(0L, e, 9), e + 13, EV_HEADER_LEN - 13);
        if ((uint32_t)crc != get_be32(e + 9)) return 1;
        if ((uint32_t)crc32(0L, e + EV_HEADER_LEN, total - EV_HEADER_LEN) != get_be32(e + 13)) return 1;
    }
    const uint8_t *end = e + total, *p = e + EV_HEADER_LEN;
    int16_t mver;
    s->e = e;
    s->total = total;
    s->attrs = ((unsigned)e[21] << 8) | e[22];
    s->k = NULL; s->kn = 0;
    s->mdg = s->mdata = NULL; s->mdgn = s->mn = 0;
    if (s->attrs & EV_ATTR_KEY_BYTES) {
        int32_t klen = (int32_t)get_be32(p);
        if (klen < 0 || (Py_ssize_t)klen > end - p - 4) return 1;
        s->k = p + 4; s->kn = klen; p += 4 + klen;
    } else {
        p += 8;
    }
    if ((s->attrs & EV_ATTR_HAS_METADATA)
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
    vals[F_SCN] = PyLong_FromLongLong((long long)(int64_t)get_be64(e + 37));
    vals[F_SRC] = PyLong_FromLong((long)(int32_t)get_be32(e + 31));
    vals[F_KEY] = s->k ? PyBytes_FromStringAndSize((const char *)s->k, s->kn)
                       : PyLong_FromLongLong((long long)(int64_t)get_be64(e + EV_HEADER_LEN));
    vals[F_ATTR] = PyLong_FromLong((long)s->attrs);
    vals[F_TS] = PyLong_FromLongLong((long long)(int64_t)get_be64(e + 23));
    vals[F_PART] = PyLong_FromLong((long)get_be16s(e + 35));
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
    return a->dgn || get_be32(a->e + 31) == get_be32(b->e + 31);
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
        col[C_SRC * n + i] = (int32_t)get_be32(s->e + 31);
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

/* ---------------------------------------------------------------- the Arrow sink */

/*
 * envelope_columns(): the compiled half of databus.spark.fastread (the Spark source
 * and snapshot reader). The same walk as scan() (walk_one: version, magic, lengths,
 * both CRCs, key and parts), then, instead of Event objects, the Spark change
 * envelope's Arrow buffers (validity bitmaps, values, offsets): the header fields,
 * the key as text, the metadata part and the flat Avro row(s), many events per call.
 * It also applies read_bucket's window rules (an EOP resets the index, the EOP at or
 * after end_scn ends the read, other control events are skipped). As everywhere in
 * this module, any input it does not handle exactly like the Python path makes it
 * return None and the caller decodes that range with the Python path.
 *
 * Measured reason (bench/RESULTS.md, Spark streaming source): per-event Python
 * (core.event.decode, fastavro, one pa.array per column) capped the source at about
 * 45k changes/s; decoding into Arrow buffers here made the Python reader a small
 * part of a micro-batch, and the snapshot reader 8x faster (bench.spark_snapshot).
 */

#define MAX_COLS 1024
#define SRC_EOP (-2)

/* Buf, buf_reserve, buf_put: core/_cenc.h */

static int buf_zero(Buf *b, Py_ssize_t n) {
    if (buf_reserve(b, (size_t)n) < 0) return -1;
    memset(b->p + b->len, 0, (size_t)n);
    b->len += (size_t)n;
    return 0;
}

static PyObject *buf_bytes(Buf *b) {
    return PyBytes_FromStringAndSize(b->p ? (const char *)b->p : "", (Py_ssize_t)b->len);
}

/* one output column: validity bitmap, fixed-width values or offsets + data */
typedef struct { int kind; Buf valid, vals, data; } Col;

static int width_of(int kind) {
    switch (kind) {
    case A_INT: case A_FLOAT: return 4;
    case A_LONG: case A_DOUBLE: return 8;
    default: return 0; /* bool: bitmap in vals; string/bytes: int32 offsets in vals */
    }
}

/* room for row i (all buffers grow one row at a time, zero-filled) */
static int col_grow(Col *c, Py_ssize_t i) {
    if ((i & 7) == 0) {
        if (buf_zero(&c->valid, 1) < 0) return -1;
        if (c->kind == A_BOOL && buf_zero(&c->vals, 1) < 0) return -1;
    }
    int w = width_of(c->kind);
    if (w) return buf_zero(&c->vals, w);
    if (c->kind == A_STRING || c->kind == A_BYTES) {
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
} CField;

typedef struct {
    const char *digest; Py_ssize_t dlen;
    int slot;
    int nfields;
    CField *fields;
} CPlan;

/* one Avro row into the row columns (row i); 0 ok, 1 not handled, -1 error. With
 * store = 0 the row is only checked (exactly the same checks), nothing is written. */
static int decode_row(const CPlan *pl, const uint8_t *p, const uint8_t *end, Col *cols,
                      Py_ssize_t i, int store) {
    for (int f = 0; f < pl->nfields; f++) {
        const CField *fd = &pl->fields[f];
        int t = fd->branch[0];
        if (fd->nbranch) {
            int64_t b;
            if (rd_long(&p, end, &b) || b < 0 || b >= fd->nbranch) return 1;
            t = fd->branch[b];
        }
        Col *c = &cols[fd->out];
        if (t == A_NULL) continue;
        if (t != c->kind) return 1; /* another branch: the Python path converts or refuses */
        switch (t) {
        case A_BOOL:
            if (p >= end || *p > 1) return 1;
            if (*p && store) set_bit(&c->vals, i);
            p++;
            break;
        case A_INT: case A_LONG: {
            int64_t v;
            if (rd_long(&p, end, &v)) return 1;
            if (t == A_INT) {
                if (v < INT32_MIN || v > INT32_MAX) return 1;
                int32_t v32 = (int32_t)v;
                if (store) memcpy(c->vals.p + 4 * i, &v32, 4);
            } else if (store) {
                memcpy(c->vals.p + 8 * i, &v, 8);
            }
            break;
        }
        case A_FLOAT: /* Avro and Arrow are both little-endian IEEE */
            if (end - p < 4) return 1;
            if (store) memcpy(c->vals.p + 4 * i, p, 4);
            p += 4;
            break;
        case A_DOUBLE:
            if (end - p < 8) return 1;
            if (store) memcpy(c->vals.p + 8 * i, p, 8);
            p += 8;
            break;
        case A_STRING: case A_BYTES: {
            const uint8_t *s; Py_ssize_t n;
            if (rd_span(&p, end, &s, &n)) return 1;
            if (t == A_STRING && !utf8_ok(s, n)) return 1;
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

static void free_plans(CPlan *plans, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) PyMem_Free(plans[i].fields);
    PyMem_Free(plans);
}

/* plans: tuple of (digest bytes, slot int, ((out, union 0/1, branch-types bytes), ...)) */
static CPlan *parse_plans(PyObject *seq, Py_ssize_t *n, int ncols) {
    if (!PyTuple_Check(seq)) { PyErr_SetString(PyExc_TypeError, "plans must be a tuple"); return NULL; }
    *n = PyTuple_GET_SIZE(seq);
    CPlan *plans = PyMem_Calloc((size_t)(*n ? *n : 1), sizeof(CPlan));
    if (!plans) { PyErr_NoMemory(); return NULL; }
    for (Py_ssize_t k = 0; k < *n; k++) {
        PyObject *fields;
        CPlan *pl = &plans[k];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(seq, k), "y#iO!", &pl->digest, &pl->dlen,
                              &pl->slot, &PyTuple_Type, &fields))
            goto fail;
        pl->nfields = (int)PyTuple_GET_SIZE(fields);
        pl->fields = PyMem_Calloc((size_t)(pl->nfields ? pl->nfields : 1), sizeof(CField));
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
                if ((uint8_t)br[b] > A_BYTES) { PyErr_SetString(PyExc_ValueError, "bad branch type"); goto fail; }
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

enum { E_SCN, E_INDEX, E_TS, E_ATTR, E_SLOT, E_KEY, E_FILE, E_POS, E_GTID, E_SERVER, E_ROW, NFIXED };
static const int fixed_kinds[NFIXED] = {A_LONG, A_INT, A_LONG, A_INT, A_INT, A_STRING, A_STRING,
                                        A_LONG, A_STRING, A_LONG, A_INT};

/* metadata record (METADATA_SCHEMA: before, txid, file, pos, gtid, server_id, row; all
 * ["null", x]) of row i; *before gets the before image's span (NULL when null) */
static int decode_meta(const uint8_t *p, const uint8_t *end, Col *fx, Py_ssize_t i,
                       const uint8_t **before, Py_ssize_t *before_n) {
    static const int types[7] = {A_BYTES, A_STRING, A_STRING, A_LONG, A_STRING, A_LONG, A_INT};
    static const int outs[7] = {-1, -1, E_FILE, E_POS, E_GTID, E_SERVER, E_ROW};
    *before = NULL;
    for (int f = 0; f < 7; f++) {
        int64_t b;
        if (rd_long(&p, end, &b) || (b != 0 && b != 1)) return 1;
        if (b == 0) continue;
        if (types[f] == A_STRING || types[f] == A_BYTES) {
            const uint8_t *s; Py_ssize_t n;
            if (rd_span(&p, end, &s, &n)) return 1;
            if (types[f] == A_STRING && !utf8_ok(s, n)) return 1;
            if (f == 0) { *before = s; *before_n = n; }
            if (outs[f] >= 0) {
                int r = col_setvar(&fx[outs[f]], i, s, n);
                if (r) return r;
            }
        } else {
            int64_t v;
            if (rd_long(&p, end, &v)) return 1;
            Col *c = &fx[outs[f]];
            if (types[f] == A_INT) {
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


static PyObject *envelope_columns(PyObject *self, PyObject *args) {
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
    CPlan *plans = NULL;
    Col fx[NFIXED];
    Col *rows = NULL; /* before columns then after columns (flat: only the first set is
                       * exported: the after image, else the before image) */
    Buf bvalid = {0}, avalid = {0}; /* struct validity of before, after */
    memset(fx, 0, sizeof fx);
    if (ncols > MAX_COLS || max_rows < 0 || off < 0 || off > view.len) {
        PyErr_SetString(PyExc_ValueError, "bad arguments");
        goto done;
    }
    for (int k = 0; k < ncols; k++)
        if ((uint8_t)kinds[k] < A_BOOL || (uint8_t)kinds[k] > A_BYTES) {
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
        Span s;
        if (walk_one(buf + off, n - off, 1, &s)) { handled = 0; break; }
        const uint8_t *e = s.e;
        unsigned attrs = s.attrs;
        int64_t ts = (int64_t)get_be64(e + 23);
        int32_t src = (int32_t)get_be32(e + 31);
        long long scn = (long long)(int64_t)get_be64(e + 37);
        if (src < 0) {
            off += s.total;
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
        const CPlan *pl = NULL;
        for (Py_ssize_t q = 0; q < nplans; q++)
            if (plans[q].dlen == s.dgn && memcmp(plans[q].digest, s.dg, (size_t)s.dgn) == 0) {
                pl = &plans[q];
                break;
            }
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
        memcpy(fx[E_SCN].vals.p + 8 * i, &scn, 8);
        memcpy(fx[E_INDEX].vals.p + 4 * i, &ix, 4);
        memcpy(fx[E_TS].vals.p + 8 * i, &ts_ms, 8);
        memcpy(fx[E_ATTR].vals.p + 4 * i, &attr, 4);
        memcpy(fx[E_SLOT].vals.p + 4 * i, &slot, 4);
        for (int c = 0; c < E_KEY; c++) set_bit(&fx[c].valid, i);
        int key_bytes = (attrs & EV_ATTR_KEY_BYTES) != 0;
        r = put_key(&fx[E_KEY], i, key_bytes, key_bytes ? 0 : (int64_t)get_be64(e + EV_HEADER_LEN),
                    s.k, s.kn);
        const uint8_t *bimg = NULL, *data = s.data;
        Py_ssize_t bn = 0, dn = s.dn;
        if (!r && (attrs & EV_ATTR_HAS_METADATA)) r = decode_meta(s.mdata, s.mdata + s.mn, fx, i, &bimg, &bn);
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
        off += s.total;
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

/* ------------------------------------------------ binlog events as MySQL packets */

/* frame_binlog(events, seq[, out]) -> (framed, consumed, count, next_seq, bad): the MySQL
 * packets of a binlog dump for the whole binlog events at the start of ``events``
 * (consecutive v4 events, the first at offset 0), the compiled half of
 * databus.binlog.dump.frame_events (its docstring is the contract; the Python half
 * there is the fallback with the same output). Each event is one packet payload, an
 * OK byte (0x00) and the event, split into 0xFFFFFF-byte packets when that long (an
 * empty packet after a piece of exactly 0xFFFFFF bytes), each packet with its 3-byte
 * length and the sequence number (``seq``, mod 256, counting on). It stops before an
 * event that does not end inside ``events`` (``consumed`` is where that one starts)
 * and at an event whose length field is below the 19-byte header (``bad`` is its
 * offset, else -1; what came before is framed). With ``out`` (a writable buffer) the
 * packets are written at its start and ``framed`` is their length (ValueError when they
 * do not fit): a dump reuses one buffer instead of a fresh one per chunk, whose
 * allocation and page faults were ~8% of the dumper's CPU (perf, four clients).
 *
 * Not in this module's decoding of the relay's wire format, but here because the binlog
 * service reads relays as a client and may import only the client package's
 * extension (tests/unit/test_imports.py) and the project keeps one extension per layer.
 * Measured reason (bench/binlog_service.py, bench/RESULTS.md): the dumper's Python loop
 * (scan a file chunk, frame each event) cost ~0.45 us an event of server CPU, 0.45 s
 * for four mariadb-binlog clients reading 226k events each, where mariadbd spends 0.11 s;
 * with four clients on two cores that CPU is taken from the clients and the service
 * served 0.81x MariaDB's events/s. */
#define BL_HEADER 19
#define BL_MAXPKT 0xFFFFFF

static PyObject *frame_binlog(PyObject *self, PyObject *args) {
    Py_buffer view, into = {0};
    int seq;
    PyObject *out_obj = Py_None;
    if (!PyArg_ParseTuple(args, "y*i|O", &view, &seq, &out_obj)) return NULL;
    if (out_obj != Py_None && PyObject_GetBuffer(out_obj, &into, PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *b = (const uint8_t *)view.buf;
    Py_ssize_t n = view.len, i = 0, count = 0, bad = -1, size = 0;
    /* pass one: where the whole events end and how many bytes their packets take */
    while (i + BL_HEADER <= n) {
        uint32_t len = (uint32_t)b[i + 9] | ((uint32_t)b[i + 10] << 8) |
                       ((uint32_t)b[i + 11] << 16) | ((uint32_t)b[i + 12] << 24);
        if (len < BL_HEADER) { bad = i; break; }
        if ((Py_ssize_t)len > n - i) break;
        Py_ssize_t payload = (Py_ssize_t)len + 1;
        size += payload + 4 * (payload / BL_MAXPKT + 1);
        i += len;
        count++;
    }
    Py_ssize_t consumed = i;
    PyObject *framed = NULL;
    uint8_t *o;
    if (into.obj) {
        if (into.len < size) {
            PyErr_Format(PyExc_ValueError, "frame_binlog: out holds %zd bytes, the packets "
                         "take %zd", into.len, size);
            PyBuffer_Release(&into);
            PyBuffer_Release(&view);
            return NULL;
        }
        o = (uint8_t *)into.buf;
    } else {
        framed = PyBytes_FromStringAndSize(NULL, size);
        if (!framed) { PyBuffer_Release(&view); return NULL; }
        o = (uint8_t *)PyBytes_AS_STRING(framed);
    }
    unsigned s = (unsigned)seq & 0xFF;
    /* pass two: the copy (without the GIL for large chunks: the converter's thread) */
    PyThreadState *ts = size >= (1 << 16) ? PyEval_SaveThread() : NULL;
    for (i = 0; i < consumed;) {
        uint32_t len = (uint32_t)b[i + 9] | ((uint32_t)b[i + 10] << 8) |
                       ((uint32_t)b[i + 11] << 16) | ((uint32_t)b[i + 12] << 24);
        Py_ssize_t payload = (Py_ssize_t)len + 1, done = 0;
        for (;;) {
            Py_ssize_t piece = payload - done < BL_MAXPKT ? payload - done : BL_MAXPKT;
            o[0] = (uint8_t)piece; o[1] = (uint8_t)(piece >> 8); o[2] = (uint8_t)(piece >> 16);
            o[3] = (uint8_t)s;
            s = (s + 1) & 0xFF;
            o += 4;
            /* the payload is the OK byte then the event: payload byte k is event byte k-1 */
            Py_ssize_t k = done;
            if (k == 0 && piece > 0) { *o++ = 0; k = 1; }
            memcpy(o, b + i + k - 1, (size_t)(done + piece - k));
            o += done + piece - k;
            done += piece;
            if (piece < BL_MAXPKT) break;
        }
        i += len;
    }
    if (ts) PyEval_RestoreThread(ts);
    PyBuffer_Release(&view);
    if (into.obj) {
        PyBuffer_Release(&into);
        return Py_BuildValue("(nnnIn)", size, consumed, count, s, bad);
    }
    return Py_BuildValue("(NnnIn)", framed, consumed, count, s, bad);
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(body, verify, event_type) -> list of events, or None when the Python path must "
     "decode this body (it raises the typed error)"},
    {"scan_table", scan_table, METH_VARARGS,
     "scan_table(body, verify) -> (int64 table bytes, [(start, end) of each run]), or None"},
    {"events_at", events_at, METH_VARARGS,
     "events_at(body, offsets, event_type) -> the events at those offsets, or None"},
    {"envelope_columns", envelope_columns, METH_VARARGS,
     "envelope_columns(buf, off, max_rows, end_scn, index, plans, kinds, flat=False) -> "
     "columns, or None when the Python path must decode this range. flat: the row columns "
     "come back as 'before' (after image, else before image) and 'after' is empty."},
    {"frame_binlog", frame_binlog, METH_VARARGS,
     "frame_binlog(events, seq[, out]) -> (framed, consumed, count, next_seq, bad): binlog "
     "events as the MySQL packets of a dump (see databus.binlog.dump.frame_events); with out, "
     "written into it and framed is their length"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_wiredecode",
                                       "Relay /stream bodies -> events, rows, or Arrow envelope buffers.", -1, methods};

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
