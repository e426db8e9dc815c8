/*
 * The relay buffer's per-event selection of one window, compiled.
 *
 * This is the compiled half of databus.buffer.select. select() walks the
 * events of the window starting at an offset of the buffer up to its EOP and
 * keeps those a read selects (source ids, then the server-side filter: MOD
 * buckets or key ranges, keys of bytes hashed by CRC-32), exactly as
 * databus.buffer.reads.collect does in Python. It returns the kept events as spans
 * of adjacent events, so a window kept whole is one span; the first `skip`
 * selected events (already delivered: an in-window checkpoint) are left out.
 *
 * select_windows() is the selected read's half: the same selection of the
 * windows from an offset, their kept events and EOPs copied into one bytes
 * object, so a read makes no Python object per span (nor per window). With the tables of a source interleaved in the
 * windows and MOD buckets, nearly every kept event is its own span: with a
 * tuple, a memoryview slice and a join step per span, a Spark read of 1M
 * changes (3 tables, 2 buckets, 173 MB) cost the relay ~1.4 s of CPU, 0.8 s
 * of it in those per-span steps (py-spy, 2026-11-26).
 *
 * walk_windows() is the unselected read's half: it walks whole windows from
 * an offset (their event headers, to find each EOP) and returns where they
 * end, so a read without a selection makes one Python call for all the
 * windows of an answer instead of a Python step per event. Measured
 * (bench/relay_fanout.py, ~190-byte events, 10 per window): the Python walk
 * cost 0.9 ms of the relay's 1.75 ms of CPU per 1 MiB answer, against
 * 0.3 ms for a bare server sending the same bytes; this walk costs ~0.01 ms.
 *
 * scan_windows() is a persisted buffer's recovery (databus.buffer.persist): every
 * event's header and body CRCs and the window structure checked, as its Python
 * twin there does. A relay serves nothing until its buffer is recovered, and the
 * Python walk cost ~4.4 us per event: a 64 MiB buffer of 150-byte events took
 * 1.7-2.2 s, a 2 GiB one about a minute (the restarts of the 30-minute soak took
 * 14-33 s); compiled, 0.18-0.3 s for 64 MiB (bench/buffer_recovery.py).
 *
 * The buffer holds only events the relay wrote and checked, but every read
 * is still bounds-checked: a length that leaves the buffer makes it raise
 * ValueError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define HEADER_LEN 45
#define OFF_TOTAL_LEN 17
#define OFF_SRC_ID 31
#define OFF_SCN 37
#define SRC_EOP (-2)
#define OFF_ATTRS 21         /* two bytes, big-endian (databus.core.event ATTR_*) */
#define ATTR_OPCODE_MASK 0x0007
#define ATTR_KEY_BYTES 0x0008
#define OP_TRUNCATE 5
#define PREFETCH_AHEAD 2048 /* bytes the walk asks the cache for ahead of itself */
#define MAX_RANGES 1024

typedef struct {
    int32_t src;
    int mod;             /* 1: MOD buckets, 0: key ranges */
    int64_t buckets;
    Py_ssize_t nranges;
    int64_t (*ranges)[2];
} Filter;

static uint32_t be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* does a filter keep this key? (int key, or bytes key hashed by CRC-32) */
static int keeps(const Filter *f, int64_t value) {
    if (f->mod) {
        /* abs() without overflow for INT64_MIN, as Python's abs() */
        uint64_t mag = value < 0 ? (uint64_t)(-(value + 1)) + 1u : (uint64_t)value;
        value = (int64_t)(mag % (uint64_t)f->buckets);
    }
    for (Py_ssize_t r = 0; r < f->nranges; r++)
        if (f->ranges[r][0] <= value && value < f->ranges[r][1]) return 1;
    return 0;
}

static void free_filters(Filter *fs, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) PyMem_Free(fs[i].ranges);
    PyMem_Free(fs);
}

/* filters: tuple of (src id, is_mod, num_buckets, ((start, end), ...)) */
static Filter *parse_filters(PyObject *seq, Py_ssize_t *n) {
    if (!PyTuple_Check(seq)) { PyErr_SetString(PyExc_TypeError, "filters must be a tuple"); return NULL; }
    *n = PyTuple_GET_SIZE(seq);
    Filter *fs = PyMem_Calloc((size_t)(*n ? *n : 1), sizeof(Filter));
    if (!fs) { PyErr_NoMemory(); return NULL; }
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *ranges;
        long long buckets;
        Filter *f = &fs[i];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(seq, i), "iiLO!", &f->src, &f->mod, &buckets,
                              &PyTuple_Type, &ranges))
            goto fail;
        f->buckets = buckets;
        f->nranges = PyTuple_GET_SIZE(ranges);
        if ((f->mod && buckets <= 0) || f->nranges > MAX_RANGES) {
            PyErr_SetString(PyExc_ValueError, "bad filter");
            goto fail;
        }
        f->ranges = PyMem_Calloc((size_t)(f->nranges ? f->nranges : 1), sizeof *f->ranges);
        if (!f->ranges) { PyErr_NoMemory(); goto fail; }
        for (Py_ssize_t r = 0; r < f->nranges; r++) {
            long long a, b;
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(ranges, r), "LL", &a, &b)) goto fail;
            f->ranges[r][0] = a; f->ranges[r][1] = b;
        }
    }
    return fs;
fail:
    free_filters(fs, *n);
    return NULL;
}

/* the selected events of one window, as spans of adjacent events (a C array) */
typedef struct {
    Py_ssize_t start, end, count;
} CSpan;

typedef struct {
    CSpan *spans;
    Py_ssize_t n, cap;
    Py_ssize_t eop;    /* offset of the window's EOP */
    Py_ssize_t total;  /* data events of the window */
    Py_ssize_t kept;   /* selected events in the spans (skipped ones left out) */
    Py_ssize_t size;   /* bytes of the spans */
} WindowSel;

/* a read's parsed sources and filters */
typedef struct {
    int32_t *src_ids;  /* NULL: any source */
    Py_ssize_t nsrcs;
    Filter *fs;
    Py_ssize_t nfilters;
} Sel;

static void free_sel(Sel *s) {
    PyMem_Free(s->src_ids);
    if (s->fs) free_filters(s->fs, s->nfilters);
}

static int parse_sel(PyObject *srcs, PyObject *filt_seq, Sel *s) {
    memset(s, 0, sizeof *s);
    s->fs = parse_filters(filt_seq, &s->nfilters);
    if (!s->fs) return -1;
    if (srcs == Py_None) return 0;
    if (!PyTuple_Check(srcs)) {
        PyErr_SetString(PyExc_TypeError, "sources must be a tuple or None");
        return -1;
    }
    s->nsrcs = PyTuple_GET_SIZE(srcs);
    s->src_ids = PyMem_Calloc((size_t)(s->nsrcs ? s->nsrcs : 1), sizeof *s->src_ids);
    if (!s->src_ids) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < s->nsrcs; i++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(srcs, i));
        if (v == -1 && PyErr_Occurred()) return -1;
        /* an id no int32 source id can equal matches nothing */
        s->src_ids[i] = (v < INT32_MIN || v > INT32_MAX) ? SRC_EOP : (int32_t)v;
    }
    return 0;
}

/* walk the window at `off`: its kept spans are appended to w->spans after those already
   there, its counts (total, kept, size, eop) replace w's (no Python object made).
   Returns 0, or an error kind with its offset in *err_off: 1 an event leaves the
   buffer, 2 a bad event length, 3 a bad key length, 4 out of memory. */
static int walk_selected(const uint8_t *mem, Py_ssize_t n, Py_ssize_t off, const Sel *s,
                         Py_ssize_t skip, WindowSel *w, Py_ssize_t *err_off) {
    Py_ssize_t selected = 0, span_end = -1;
    /* as in walk_windows: ask the cache for the header chain ahead of the walk */
    Py_ssize_t ahead = off;
    w->total = w->kept = w->size = 0;
    for (;;) {
        if (off < 0 || n - off < HEADER_LEN + 8) { *err_off = off; return 1; }
        for (; ahead < off + PREFETCH_AHEAD && ahead < n; ahead += 64)
            __builtin_prefetch(mem + ahead);
        const uint8_t *e = mem + off;
        int32_t length = (int32_t)be32(e + OFF_TOTAL_LEN);
        int32_t src = (int32_t)be32(e + OFF_SRC_ID);
        if (length < HEADER_LEN + 8 || length > n - off) { *err_off = off; return 2; }
        if (src == SRC_EOP) break;
        w->total++;
        int keep = s->src_ids == NULL;
        for (Py_ssize_t i = 0; i < s->nsrcs && !keep; i++) keep = s->src_ids[i] == src;
        if (keep) {
            for (Py_ssize_t i = 0; i < s->nfilters; i++) {
                if (s->fs[i].src != src) continue;
                unsigned attrs = ((unsigned)e[OFF_ATTRS] << 8) | e[OFF_ATTRS + 1];
                const uint8_t *k = e + HEADER_LEN;
                int64_t value;
                if (attrs & ATTR_KEY_BYTES) {
                    int32_t klen = (int32_t)be32(k);
                    if (klen < 0 || klen > length - HEADER_LEN - 4) { *err_off = off; return 3; }
                    value = (int64_t)(uint32_t)crc32(0L, k + 4, (uInt)klen);
                } else {
                    uint64_t v = ((uint64_t)be32(k) << 32) | be32(k + 4);
                    value = (int64_t)v;
                }
                keep = keeps(&s->fs[i], value);
                break;
            }
        }
        if (keep && ++selected <= skip) keep = 0; /* delivered before (in-window checkpoint) */
        if (keep) {
            if (span_end != off) {
                if (w->n == w->cap) {
                    Py_ssize_t cap = w->cap ? 2 * w->cap : 64;
                    CSpan *grown = PyMem_RawRealloc(w->spans, (size_t)cap * sizeof *grown);
                    if (!grown) { *err_off = off; return 4; }
                    w->spans = grown;
                    w->cap = cap;
                }
                w->spans[w->n++] = (CSpan){off, off, 0};
            }
            CSpan *last = &w->spans[w->n - 1];
            span_end = last->end = off + length;
            last->count++;
            w->kept++;
            w->size += length;
        }
        off += length;
    }
    w->eop = off;
    return 0;
}

static PyObject *walk_error(int kind, Py_ssize_t off) {
    if (kind == 1) PyErr_Format(PyExc_ValueError, "event at offset %zd leaves the buffer", off);
    else if (kind == 2) PyErr_Format(PyExc_ValueError, "bad event length at offset %zd", off);
    else if (kind == 3) PyErr_Format(PyExc_ValueError, "bad key length at offset %zd", off);
    else PyErr_NoMemory();
    return NULL;
}

static PyObject *select_window(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t off, skip = 0, err_off = 0;
    PyObject *srcs, *filt_seq;
    if (!PyArg_ParseTuple(args, "y*nOO|n", &view, &off, &srcs, &filt_seq, &skip)) return NULL;
    PyObject *result = NULL, *spans = NULL;
    WindowSel w = {0};
    Sel s;
    if (parse_sel(srcs, filt_seq, &s) < 0) goto done;
    int err = walk_selected(view.buf, view.len, off, &s, skip, &w, &err_off);
    if (err) { walk_error(err, err_off); goto done; }
    spans = PyList_New(w.n);
    if (!spans) goto done;
    for (Py_ssize_t i = 0; i < w.n; i++) {
        PyObject *t = Py_BuildValue("(nnn)", w.spans[i].start, w.spans[i].end, w.spans[i].count);
        if (!t) goto done;
        PyList_SET_ITEM(spans, i, t);
    }
    result = Py_BuildValue("(Onn)", spans, w.eop, w.total);
done:
    Py_XDECREF(spans);
    PyMem_RawFree(w.spans);
    free_sel(&s);
    PyBuffer_Release(&view);
    return result;
}

static uint64_t be64(const uint8_t *p) { return ((uint64_t)be32(p) << 32) | be32(p + 4); }

/* select_windows(mem, off, stop, sources, filters, skip, max_bytes, max_scn): see methods[] */
static PyObject *select_windows(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t off, stop, skip, max_bytes, err_off = 0;
    long long max_scn;
    PyObject *srcs, *filt_seq;
    if (!PyArg_ParseTuple(args, "y*nnOOnnL", &view, &off, &stop, &srcs, &filt_seq, &skip,
                          &max_bytes, &max_scn))
        return NULL;
    PyObject *result = NULL, *data = NULL;
    WindowSel w = {0};
    Sel s;
    const uint8_t *mem = view.buf;
    Py_ssize_t n = view.len < stop ? view.len : stop;
    Py_ssize_t used = 0, windows = 0, kept = 0;
    long long last_scn = -1;
    if (parse_sel(srcs, filt_seq, &s) < 0) goto done;
    while (off < n) {
        if (off < 0 || n - off < HEADER_LEN + 8) { walk_error(1, off); goto done; }
        long long scn = (long long)be64(mem + off + OFF_SCN);
        if (scn > max_scn) break;
        Py_ssize_t mark = w.n;
        int err = walk_selected(mem, n, off, &s, skip, &w, &err_off);
        if (err) { walk_error(err, err_off); goto done; }
        /* the EOP: walk_selected checked its header is in the buffer */
        Py_ssize_t eop_len = (Py_ssize_t)be32(mem + w.eop + OFF_TOTAL_LEN);
        if (w.size + eop_len > max_bytes - used) {  /* the window does not fit: not taken */
            w.n = mark;
            break;
        }
        if (w.n == w.cap) {
            Py_ssize_t cap = w.cap ? 2 * w.cap : 64;
            CSpan *grown = PyMem_RawRealloc(w.spans, (size_t)cap * sizeof *grown);
            if (!grown) { PyErr_NoMemory(); goto done; }
            w.spans = grown;
            w.cap = cap;
        }
        w.spans[w.n++] = (CSpan){w.eop, w.eop + eop_len, 0};
        used += w.size + eop_len;
        windows++;
        kept += w.kept;
        last_scn = scn;
        skip = 0;
        off = w.eop + eop_len;
    }
    if (!windows) {
        result = Py_BuildValue("(OnnnL)", Py_None, off, (Py_ssize_t)0, (Py_ssize_t)0, last_scn);
        goto done;
    }
    data = PyBytes_FromStringAndSize(NULL, used);
    if (!data) goto done;
    char *out = PyBytes_AS_STRING(data);
    for (Py_ssize_t i = 0; i < w.n; i++) {
        memcpy(out, mem + w.spans[i].start, (size_t)(w.spans[i].end - w.spans[i].start));
        out += w.spans[i].end - w.spans[i].start;
    }
    result = Py_BuildValue("(OnnnL)", data, off, windows, kept, last_scn);
done:
    Py_XDECREF(data);
    PyMem_RawFree(w.spans);
    free_sel(&s);
    PyBuffer_Release(&view);
    return result;
}


/* walk_windows(mem, off, stop, max_bytes, max_scn, max_windows): see methods[] */
static PyObject *walk_windows(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t off, stop, max_bytes, max_windows;
    long long max_scn;
    if (!PyArg_ParseTuple(args, "y*nnnLn", &view, &off, &stop, &max_bytes, &max_scn,
                          &max_windows))
        return NULL;
    const uint8_t *mem = view.buf;
    Py_ssize_t n = view.len < stop ? view.len : stop;
    Py_ssize_t used = 0, windows = 0, events = 0;
    long long last_scn = -1;
    Py_ssize_t p = off;
    /* each header's address depends on the length read before it: without
       prefetching, a walk of memory not in cache waits for one miss per event */
    Py_ssize_t ahead = off;
    while (windows < max_windows && off < n) {
        if (off < 0 || n - off < HEADER_LEN + 8) goto leaves;
        long long scn = (long long)be64(mem + off + OFF_SCN);
        if (scn > max_scn) break;
        Py_ssize_t count = 0;
        p = off;
        for (;;) {
            if (n - p < HEADER_LEN + 8) goto leaves;
            for (; ahead < p + PREFETCH_AHEAD && ahead < n; ahead += 64)
                __builtin_prefetch(mem + ahead);
            int32_t length = (int32_t)be32(mem + p + OFF_TOTAL_LEN);
            if (length < HEADER_LEN + 8 || length > n - p) goto bad_length;
            int32_t src = (int32_t)be32(mem + p + OFF_SRC_ID);
            p += length;
            if (src == SRC_EOP) break;
            count++;
        }
        if (p - off > max_bytes - used) break; /* the next window does not fit */
        used += p - off;
        windows++;
        events += count;
        last_scn = scn;
        off = p;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nnnL)", off, windows, events, last_scn);
leaves:
    PyErr_Format(PyExc_ValueError, "event at offset %zd leaves the buffer", p);
    PyBuffer_Release(&view);
    return NULL;
bad_length:
    PyErr_Format(PyExc_ValueError, "bad event length at offset %zd", p);
    PyBuffer_Release(&view);
    return NULL;
}

/* the shortest event: header, key (8) and the partition head (7) */
#define MIN_EVENT (HEADER_LEN + 8 + 7)
#define EVENT_VERSION 2
#define EVENT_MAGIC 0xCAFEDEEDu

/* why the event at `p` (inside [0, n)) is not a valid event (NULL: it is; *length set) */
static const char *check_event_at(const uint8_t *mem, Py_ssize_t n, Py_ssize_t p,
                                  int32_t *length, char *why, size_t why_len) {
    if (n - p < HEADER_LEN) {
        snprintf(why, why_len, "truncated header at offset %zd", p);
        return why;
    }
    const uint8_t *h = mem + p;
    if (h[0] != EVENT_VERSION || be32(h + 1) != EVENT_MAGIC || be32(h + 5) != HEADER_LEN) {
        snprintf(why, why_len, "not a v%d event at offset %zd (version=%u, magic=%#x)",
                 EVENT_VERSION, p, h[0], be32(h + 1));
        return why;
    }
    uLong crc = crc32(crc32(0L, h, 9), h + 13, HEADER_LEN - 13);
    if ((uint32_t)crc != be32(h + 9)) {
        snprintf(why, why_len, "header CRC mismatch at offset %zd", p);
        return why;
    }
    int32_t total = (int32_t)be32(h + OFF_TOTAL_LEN);
    if (total < MIN_EVENT || total > n - p) {
        snprintf(why, why_len, "bad total length %d at offset %zd", total, p);
        return why;
    }
    crc = crc32(0L, h + HEADER_LEN, (uInt)(total - HEADER_LEN));
    if ((uint32_t)crc != be32(h + 13)) {
        snprintf(why, why_len, "body CRC mismatch at offset %zd", p);
        return why;
    }
    *length = total;
    return NULL;
}

/* scan_windows(mem, start, stop, last_scn): see methods[] */
static PyObject *scan_windows(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    Py_ssize_t off, stop;
    long long last_scn;
    if (!PyArg_ParseTuple(args, "y*nnL", &view, &off, &stop, &last_scn)) return NULL;
    const uint8_t *mem = view.buf;
    Py_ssize_t n = view.len < stop ? view.len : stop;
    PyObject *windows = PyList_New(0);
    if (windows == NULL) goto fail;
    char why[160];
    const char *bad = NULL;
    while (off < n) {
        Py_ssize_t win_start = off, p = off, count = 0;
        long long scn = 0;
        int first = 1;
        for (;;) {
            int32_t length = 0;
            if (p >= n) {
                snprintf(why, sizeof why, "truncated header at offset %zd", p);
                bad = why;
                break;
            }
            bad = check_event_at(mem, n, p, &length, why, sizeof why);
            if (bad != NULL) break;
            long long e_scn = (long long)be64(mem + p + OFF_SCN);
            if (first) {
                scn = e_scn;
                first = 0;
                if (scn <= last_scn) {
                    snprintf(why, sizeof why, "scn %lld not above %lld", scn, last_scn);
                    bad = why;
                    break;
                }
            } else if (e_scn != scn) {
                snprintf(why, sizeof why, "scn %lld inside window %lld", e_scn, scn);
                bad = why;
                break;
            }
            int32_t src = (int32_t)be32(mem + p + OFF_SRC_ID);
            p += length;
            if (src == SRC_EOP) break;
            count++;
        }
        if (bad != NULL) {
            off = win_start;
            break;
        }
        PyObject *item = Py_BuildValue("(Lnn)", scn, win_start, count);
        if (item == NULL || PyList_Append(windows, item) < 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        last_scn = scn;
        off = p;
    }
    PyBuffer_Release(&view);
    if (bad == NULL) return Py_BuildValue("(Nns)", windows, off, NULL);
    return Py_BuildValue("(Nns)", windows, off, bad);
fail:
    Py_XDECREF(windows);
    PyBuffer_Release(&view);
    return NULL;
}

#include "_newest.c" /* newest(): a read reduced to each key's last event */

static PyMethodDef methods[] = {
    {"scan_windows", scan_windows, METH_VARARGS,
     "scan_windows(mem, start, stop, last_scn) -> ([(scn, offset, data events), ...], end, "
     "error): the valid windows from `start` up to `stop`, each event's header and body CRCs "
     "checked, SCNs rising above last_scn, one SCN per window; `error` (None when every "
     "window up to `stop` is valid) says why the window at `end` is not"},
    {"walk_windows", walk_windows, METH_VARARGS,
     "walk_windows(mem, off, stop, max_bytes, max_scn, max_windows) -> (end, windows, data "
     "events, last scn): the whole windows from `off`, none reaching past `stop`, each with an "
     "SCN <= max_scn, together at most max_bytes, at most max_windows of them; `end` is where "
     "the last ends (`off` and -1 for none)"},
    {"select_windows", select_windows, METH_VARARGS,
     "select_windows(mem, off, stop, sources, filters, skip, max_bytes, max_scn) -> (data, "
     "end, windows, kept, last scn): the whole windows from `off`, none reaching past `stop`, "
     "each with an SCN <= max_scn, selected as select_window selects them (the first "
     "window without its first `skip` selected events), taken while their kept events and "
     "EOPs fit in max_bytes together, copied into `data` (bytes; None when no window was "
     "taken); `end` is where the last taken window ends (`off` for none), `kept` the data "
     "events in `data`"},
    {"newest", newest, METH_VARARGS,
     "newest(data) -> (bytes, kept): each key's last event of a read's data (_newest.c)"},
    {"select_window", select_window, METH_VARARGS,
     "select_window(mem, off, sources, filters, skip=0) -> ([(start, end, count), ...], eop "
     "offset, data events of the window); the first `skip` selected events are left out"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_select",
                                       "Relay buffer window selection.", -1, methods,
                                       NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__select(void) { return PyModule_Create(&moduledef); }
