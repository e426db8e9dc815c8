/*
 * The binlog dump's packets -> events, header parsed and checked. Included by
 * _rowcodec.c (it shares _cenc.h's CRC-32).
 *
 * frames(buf, off, seq, checksum, header_type, limit) -> (events, off, seq): the
 * whole event packets of buf from off on, at most limit of them (the caller keeps
 * few objects alive at once: fewer for the garbage collector to walk), as (header,
 * body) pairs in REVERSE order (the caller pops them from the end), the offset
 * after the last one and the next packet number. header_type is events.EventHeader (a
 * NamedTuple: a tuple subclass without a dict, filled here like a tuple);
 * body is a memoryview of the event after its 19-byte header, CRC removed,
 * as events.parse_header returns it.
 *
 * Contract: for each packet it takes, the result equals what
 * BinlogStream.read + events.parse_header give (the tests compare both on a
 * real server's stream). It stops, taking nothing more, at the first packet
 * that is not a whole, plain, valid event packet: a partial one, a packet of
 * 16 MiB or more, a sequence number not expected, an EOF or error packet, an
 * event whose size or CRC is wrong, or one too short for its header. The
 * Python path then reads that packet and raises or joins as it always did;
 * so this only ever saves work, never decides an error.
 */

static inline uint32_t fr_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static PyObject *fr_header(PyTypeObject *type, const unsigned char *e) {
    PyObject *h = type->tp_alloc(type, 6);
    if (!h) return NULL;
    unsigned long vals[6] = {fr_u32(e), e[4], fr_u32(e + 5), fr_u32(e + 9), fr_u32(e + 13),
                             (unsigned long)e[17] | (unsigned long)e[18] << 8};
    for (int i = 0; i < 6; i++) {
        PyObject *v = PyLong_FromUnsignedLong(vals[i]);
        if (!v) {
            Py_DECREF(h);
            return NULL;
        }
        PyTuple_SET_ITEM(h, i, v);
    }
    return h;
}

static PyObject *py_frames(PyObject *mod, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t off;
    int seq, checksum;
    Py_ssize_t limit;
    PyObject *header_type;
    (void)mod;
    if (!PyArg_ParseTuple(args, "y*nipOn", &buf, &off, &seq, &checksum, &header_type, &limit))
        return NULL;
    if (!PyType_Check(header_type) ||
        !PyType_IsSubtype((PyTypeObject *)header_type, &PyTuple_Type) || off < 0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_TypeError, "frames: a tuple type and an offset >= 0");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (!out) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const unsigned char *p = buf.buf;
    Py_ssize_t n = buf.len;
    while (off + 4 <= n && PyList_GET_SIZE(out) < limit) {
        Py_ssize_t len = (Py_ssize_t)(p[off] | p[off + 1] << 8 | p[off + 2] << 16);
        if (len >= 0xFFFFFF || p[off + 3] != seq || off + 4 + len > n || len < 1 + 19 ||
            p[off + 4] != 0)
            break;
        const unsigned char *e = p + off + 5;
        Py_ssize_t elen = len - 1, end = elen;
        if ((Py_ssize_t)fr_u32(e + 9) != elen) break;
        int has_crc = e[4] == 15 ? e[elen - 5] == 1 : checksum; /* FORMAT_DESCRIPTION */
        if (has_crc) {
            end -= 4;
            if (end < 19 || crc32_update(0, e, (size_t)end) != fr_u32(e + end)) break;
        }
        PyObject *h = fr_header((PyTypeObject *)header_type, e);
        if (!h) goto fail;
        PyObject *bytes = PyBytes_FromStringAndSize((const char *)e + 19, end - 19);
        PyObject *body = bytes ? PyMemoryView_FromObject(bytes) : NULL;
        Py_XDECREF(bytes);
        PyObject *pair = body ? PyTuple_Pack(2, h, body) : NULL;
        Py_DECREF(h);
        Py_XDECREF(body);
        if (!pair) goto fail;
        int bad = PyList_Append(out, pair);
        Py_DECREF(pair);
        if (bad) goto fail;
        off += 4 + len;
        seq = (seq + 1) & 0xFF;
    }
    PyBuffer_Release(&buf);
    if (PyList_Reverse(out) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return Py_BuildValue("(Nni)", out, off, seq);
fail:
    PyBuffer_Release(&buf);
    Py_DECREF(out);
    return NULL;
}

/*
 * rows_meta(head, pos, tail) -> head + the Avro of the union branch "long" holding
 * pos + tail: tables.RowsMeta's result for one rows event (its parts kept per
 * transaction), the same bytes as tables.meta_middle gives.
 */
static PyObject *py_rows_meta(PyObject *mod, PyObject *args) {
    const char *head, *tail;
    Py_ssize_t hn, tn;
    long long pos;
    (void)mod;
    if (!PyArg_ParseTuple(args, "y#Ly#", &head, &hn, &pos, &tail, &tn)) return NULL;
    unsigned char mid[11];
    int m = 0;
    mid[m++] = 2; /* the union's branch 1: not null */
    uint64_t z = ((uint64_t)pos << 1) ^ (uint64_t)(pos >> 63);
    while (z > 0x7F) {
        mid[m++] = (unsigned char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    mid[m++] = (unsigned char)z;
    PyObject *out = PyBytes_FromStringAndSize(NULL, hn + m + tn);
    if (!out) return NULL;
    char *o = PyBytes_AS_STRING(out);
    memcpy(o, head, (size_t)hn);
    memcpy(o + hn, mid, (size_t)m);
    memcpy(o + hn + m, tail, (size_t)tn);
    return out;
}
