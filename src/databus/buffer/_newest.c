/*
 * newest(data): a read's selected data reduced to each key's last event.
 *
 * #included by _select.c (one extension). `data` is what a selected read copies
 * out: whole windows of events, each ending with its EOP. Every data event whose
 * (source id, key) has a later event in `data` is left out; control events (EOPs)
 * and truncates are kept in place, as is each key's last event, so the windows'
 * structure and the order of what is kept are those of `data`. Before a kept data
 * event that follows left-out ones of its window goes a "dropped" control event
 * (source id -51, key = how many), so a reader counting a window's data events
 * keeps each one's index. Returns (reduced bytes, data events kept).
 * databus.buffer.select.newest_python is its twin and keeps exactly the same events.
 *
 * Why compiled: a relay-side reduction exists to spare the reader's CPU and the
 * transfer; a Spark partition's read of the 1M-change benchmark is ~167,000
 * events, which a Python loop over event headers walks in ~0.2 s of the relay's
 * CPU, more than the reduction saves (bench/results/spark_lakehouse.md).
 */

/* a slot of the key table: its key's last event (1 + index; 0: empty) and the key's hash,
 * 8 bytes so the table stays in cache; keys are compared in the events themselves */
typedef struct {
    uint32_t last;
    uint32_t hash;
} NewestSlot;

static uint64_t newest_mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* the same (source id, key) at a and b? both are data events checked by the caller */
static int newest_same(const uint8_t *a, const uint8_t *b) {
    if (memcmp(a + OFF_SRC_ID, b + OFF_SRC_ID, 4) != 0) return 0;
    int ab = (a[OFF_ATTRS + 1] & ATTR_KEY_BYTES) != 0;
    if (ab != ((b[OFF_ATTRS + 1] & ATTR_KEY_BYTES) != 0)) return 0;
    if (!ab) return memcmp(a + HEADER_LEN, b + HEADER_LEN, 8) == 0;
    uint32_t la = be32(a + HEADER_LEN);
    return la == be32(b + HEADER_LEN) && memcmp(a + HEADER_LEN + 4, b + HEADER_LEN + 4, la) == 0;
}

#define NEWEST_DROPPED_LEN MIN_EVENT /* an int key and an empty payload part */
#define SRC_DROPPED (-51)

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24); p[1] = (uint8_t)(v >> 16); p[2] = (uint8_t)(v >> 8); p[3] = (uint8_t)v;
}

/* the "dropped" control event at w, as databus.core.event.encode makes it: version 2,
 * no attributes, time 0, source -51, partition 0, sequence scn; key `dropped`, an empty
 * payload part; both CRCs */
static void newest_dropped(uint8_t *w, uint64_t scn, Py_ssize_t dropped) {
    memset(w, 0, NEWEST_DROPPED_LEN);
    w[0] = EVENT_VERSION;
    put32(w + 1, EVENT_MAGIC);
    put32(w + 5, HEADER_LEN);
    put32(w + OFF_TOTAL_LEN, NEWEST_DROPPED_LEN);
    put32(w + OFF_SRC_ID, (uint32_t)SRC_DROPPED);
    put32(w + OFF_SCN, (uint32_t)(scn >> 32));
    put32(w + OFF_SCN + 4, (uint32_t)scn);
    put32(w + HEADER_LEN, (uint32_t)((uint64_t)dropped >> 32));
    put32(w + HEADER_LEN + 4, (uint32_t)dropped);
    put32(w + 13, (uint32_t)crc32(0L, w + HEADER_LEN, 15));
    uLong h = crc32(0L, w, 9);
    put32(w + 9, (uint32_t)crc32(h, w + 13, HEADER_LEN - 13));
}

static PyObject *newest(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*", &b)) return NULL;
    const uint8_t *m = b.buf;
    Py_ssize_t n = b.len, count = 0, off = 0;
    PyObject *out = NULL;
    Py_ssize_t *starts = NULL, *slot_of = NULL;
    NewestSlot *tab = NULL;
    while (off < n) {  /* count, and check that every event lies inside data */
        if (n - off < HEADER_LEN) goto bad;
        Py_ssize_t len = (Py_ssize_t)be32(m + off + OFF_TOTAL_LEN);
        if (len < HEADER_LEN || len > n - off) goto bad;
        off += len;
        count++;
    }
    if (count >= (Py_ssize_t)UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "newest: too many events");
        goto done;
    }
    size_t cap = 16;
    while (cap < 2 * (size_t)count) cap <<= 1;
    starts = PyMem_Malloc(((size_t)count + 1) * sizeof *starts);
    slot_of = PyMem_Malloc(((size_t)count + 1) * sizeof *slot_of);
    tab = PyMem_Calloc(cap, sizeof *tab);
    if (!starts || !slot_of || !tab) { PyErr_NoMemory(); goto done; }
    off = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t len = (Py_ssize_t)be32(m + off + OFF_TOTAL_LEN);
        const uint8_t *e = m + off;
        int32_t src = (int32_t)be32(e + OFF_SRC_ID);
        unsigned attrs = ((unsigned)e[OFF_ATTRS] << 8) | e[OFF_ATTRS + 1];
        starts[i] = off;
        slot_of[i] = -1;  /* kept whatever follows: a control event or a truncate */
        if (src >= 0 && (attrs & ATTR_OPCODE_MASK) != OP_TRUNCATE) {
            uint64_t h;
            if (attrs & ATTR_KEY_BYTES) {
                if (len < HEADER_LEN + 4) goto bad;
                Py_ssize_t klen = (Py_ssize_t)(int32_t)be32(e + HEADER_LEN);
                if (klen < 0 || klen > len - HEADER_LEN - 4) goto bad;
                h = crc32(0L, e + HEADER_LEN + 4, (uInt)klen) ^ 0x9e3779b97f4a7c15ULL;
            } else {
                if (len < HEADER_LEN + 8) goto bad;
                h = be64(e + HEADER_LEN);
            }
            h = newest_mix(h ^ ((uint64_t)(uint32_t)src << 32));
            uint32_t h32 = (uint32_t)(h >> 32);
            size_t j = (size_t)h & (cap - 1);
            while (tab[j].last
                   && !(tab[j].hash == h32 && newest_same(m + starts[tab[j].last - 1], e)))
                j = (j + 1) & (cap - 1);
            tab[j].last = (uint32_t)(i + 1);
            tab[j].hash = h32;
            slot_of[i] = (Py_ssize_t)j;
        }
        off += len;
    }
    starts[count] = n;
    Py_ssize_t size = 0, kept = 0, dropped = 0;
    for (int pass = 0; pass < 2; pass++) {  /* the size, then the copy */
        uint8_t *w = pass ? (uint8_t *)PyBytes_AS_STRING(out) : NULL;
        dropped = 0;
        for (Py_ssize_t i = 0; i < count; i++) {
            const uint8_t *e = m + starts[i];
            Py_ssize_t len = starts[i + 1] - starts[i];
            if (slot_of[i] >= 0 && (Py_ssize_t)tab[slot_of[i]].last != i + 1) {
                dropped++;
                continue;
            }
            int32_t src = (int32_t)be32(e + OFF_SRC_ID);
            if (src == SRC_EOP) dropped = 0;  /* a window's index starts again */
            if (src >= 0 && dropped) {
                if (pass) {
                    newest_dropped(w, be64(e + OFF_SCN), dropped);
                    w += NEWEST_DROPPED_LEN;
                } else {
                    size += NEWEST_DROPPED_LEN;
                }
                dropped = 0;
            }
            if (pass) {
                memcpy(w, e, (size_t)len);
                w += len;
                kept += src >= 0;
            } else {
                size += len;
            }
        }
        if (!pass) {
            out = PyBytes_FromStringAndSize(NULL, size);
            if (!out) goto done;
        }
    }
    PyObject *res = Py_BuildValue("(Nn)", out, kept);
    out = NULL;
    PyMem_Free(starts);
    PyMem_Free(slot_of);
    PyMem_Free(tab);
    PyBuffer_Release(&b);
    return res;
bad:
    PyErr_SetString(PyExc_ValueError, "newest: an event leaves the data");
done:
    Py_XDECREF(out);
    PyMem_Free(starts);
    PyMem_Free(slot_of);
    PyMem_Free(tab);
    PyBuffer_Release(&b);
    return NULL;
}
