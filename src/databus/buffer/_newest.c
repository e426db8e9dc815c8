/*
 * newest(data): a read's selected data reduced to each key's last event.
 *
 * #included by _select.c (one extension). `data` is what a selected read copies
 * out: whole windows of events, each ending with its EOP. Every data event whose
 * (source id, key) has a later event in `data` is left out; control events (EOPs)
 * and truncates are kept in place, as is each key's last event, so the windows'
 * structure and the order of what is kept are those of `data`. Returns
 * (reduced bytes, data events kept). databus.buffer.select.newest_python is its
 * twin and keeps exactly the same events.
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
    int ab = (a[22] & 8) != 0;
    if (ab != ((b[22] & 8) != 0)) return 0;
    if (!ab) return memcmp(a + HEADER_LEN, b + HEADER_LEN, 8) == 0;
    uint32_t la = be32(a + HEADER_LEN);
    return la == be32(b + HEADER_LEN) && memcmp(a + HEADER_LEN + 4, b + HEADER_LEN + 4, la) == 0;
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
        unsigned attrs = ((unsigned)e[21] << 8) | e[22];
        starts[i] = off;
        slot_of[i] = -1;  /* kept whatever follows: a control event or a truncate */
        if (src >= 0 && (attrs & 7) != 5) {
            uint64_t h;
            if (attrs & 8) {
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
    Py_ssize_t size = 0, kept = 0;
    for (Py_ssize_t i = 0; i < count; i++)
        if (slot_of[i] < 0 || (Py_ssize_t)tab[slot_of[i]].last == i + 1)
            size += starts[i + 1] - starts[i];
    out = PyBytes_FromStringAndSize(NULL, size);
    if (!out) goto done;
    uint8_t *w = (uint8_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < count; i++) {
        if (slot_of[i] < 0 || (Py_ssize_t)tab[slot_of[i]].last == i + 1) {
            Py_ssize_t len = starts[i + 1] - starts[i];
            memcpy(w, m + starts[i], (size_t)len);
            w += len;
            kept += (int32_t)be32(m + starts[i] + OFF_SRC_ID) >= 0;
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
