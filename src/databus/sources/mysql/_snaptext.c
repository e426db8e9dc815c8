/*
 * Snapshot chunk rows (MySQL text-protocol result rows) -> Avro payloads and
 * finished snapshot events. Included by _rowcodec.c: it runs the same per-column
 * program as the binlog codec (RowCodec), but reads each value as the text a
 * SELECT returns (chunks.select_list: FLOAT cast to DOUBLE, session in UTC).
 *
 * Contract: for a result whose columns match the program (fastpath.py checks
 * the result's field types and character sets first), the payload and event
 * key of each row are byte-identical to the Python path (pymysql's converters,
 * chunks.to_binlog_values, Shape.row, fastavro) and the events to
 * core/event.py's encode(op=READ, extra_attributes=ATTR_SNAPSHOT); the tests
 * compare both on the type matrix. A row that does not parse raises
 * ValueError (the caller turns it into a typed error); nothing is read out of
 * bounds.
 */

static int text_fail(In *in, int col, const char *what) {
    PyErr_Format(PyExc_ValueError, "result row of %s: column %d: %s", in->table, col, what);
    return -1;
}

/* Unsigned decimal digits s[0..n) into *v; 0 on success. At most 20 digits. */
static int text_digits(const unsigned char *s, size_t n, uint64_t *v) {
    if (n == 0 || n > 20) return -1;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (x > (UINT64_MAX - d) / 10) return -1;
        x = x * 10 + d;
    }
    *v = x;
    return 0;
}

/* Fixed-width field of digits: s[0..w) */
static int fixed(const unsigned char *s, int w, int *out) {
    int x = 0;
    for (int i = 0; i < w; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        x = x * 10 + (s[i] - '0');
    }
    *out = x;
    return 0;
}

/* ".ffffff" (1 to 6 digits) at s[0..n) -> microseconds; n == 0: none. */
static int fraction(const unsigned char *s, size_t n, int64_t *micros) {
    *micros = 0;
    if (n == 0) return 0;
    if (s[0] != '.' || n < 2 || n > 7) return -1;
    int64_t f = 0;
    for (size_t i = 1; i < 7; i++) {
        int d = 0;
        if (i < n) {
            if (s[i] < '0' || s[i] > '9') return -1;
            d = s[i] - '0';
        }
        f = f * 10 + d;
    }
    *micros = f;
    return 0;
}

static int days_in_month(int y, int m) {
    static const int dim[13] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)) return 29;
    return dim[m];
}

/* "YYYY-MM-DD" at s: 1 valid (days in *days), 0 a date Python's datetime refuses
 * (zero dates and dates with a zero or impossible part: NULL), -1 unparsable. */
static int text_date(const unsigned char *s, size_t n, int64_t *days) {
    int y, m, d;
    if (n < 10 || s[4] != '-' || s[7] != '-' || fixed(s, 4, &y) < 0 || fixed(s + 5, 2, &m) < 0 ||
        fixed(s + 8, 2, &d) < 0)
        return -1;
    if (y < 1 || m < 1 || m > 12 || d < 1 || d > days_in_month(y, m)) return 0;
    *days = days_from_civil(y, m, d);
    return 1;
}

/* "YYYY-MM-DD HH:MM:SS[.ffffff]": as text_date, *micros since the epoch. */
static int text_datetime(const unsigned char *s, size_t n, int64_t *micros) {
    int64_t days, frac;
    int hh, mi, ss;
    if (n < 19 || s[10] != ' ' || s[13] != ':' || s[16] != ':') return -1;
    int r = text_date(s, 10, &days);
    if (r < 0 || fixed(s + 11, 2, &hh) < 0 || fixed(s + 14, 2, &mi) < 0 ||
        fixed(s + 17, 2, &ss) < 0 || fraction(s + 19, n - 19, &frac) < 0)
        return -1;
    if (r == 0 || hh > 23 || mi > 59 || ss > 59) return 0;
    *micros = (days * 86400 + hh * 3600 + mi * 60 + ss) * 1000000 + frac;
    return 1;
}

/* "[-]H{1,3}:MM:SS[.ffffff]" -> signed microseconds */
static int text_time(const unsigned char *s, size_t n, int64_t *micros) {
    int neg = n > 0 && s[0] == '-';
    size_t p = neg ? 1 : 0, h0 = p;
    while (p < n && s[p] >= '0' && s[p] <= '9') p++;
    size_t hl = p - h0;
    int mi, ss;
    int64_t frac;
    uint64_t hh;
    if (hl < 1 || hl > 3 || text_digits(s + h0, hl, &hh) < 0 || p + 6 > n || s[p] != ':' ||
        s[p + 3] != ':' || fixed(s + p + 1, 2, &mi) < 0 || fixed(s + p + 4, 2, &ss) < 0 ||
        fraction(s + p + 6, n - p - 6, &frac) < 0)
        return -1;
    int64_t v = ((int64_t)hh * 3600 + mi * 60 + ss) * 1000000 + frac;
    *micros = neg ? -v : v;
    return 0;
}

/* DECIMAL text "[-]digits[.digits]" -> Avro decimal bytes at the given scale */
static int text_decimal(In *in, Buf *b, const unsigned char *s, size_t n, int scale, int col) {
    size_t p = 0;
    int negative = 0;
    if (p < n && s[p] == '-') { negative = 1; p++; }
    uint32_t x[LIMBS] = {0};
    int digits = 0, frac = -1, nonzero = 0, any = 0;
    uint32_t chunk = 0;
    int chunk_len = 0;
    for (; p < n; p++) {
        unsigned char c = s[p];
        if (c == '.' && frac < 0) { frac = 0; continue; }
        if (c < '0' || c > '9') return text_fail(in, col, "bad DECIMAL text");
        any = 1;
        if (++digits > 80) return text_fail(in, col, "DECIMAL too long");
        if (frac >= 0) frac++;
        nonzero |= c != '0';
        chunk = chunk * 10 + (uint32_t)(c - '0');
        if (++chunk_len == 9) { big_muladd(x, POW10[9], chunk); chunk = 0; chunk_len = 0; }
    }
    if (!any) return text_fail(in, col, "bad DECIMAL text");
    if (chunk_len) big_muladd(x, POW10[chunk_len], chunk);
    if (frac < 0) frac = 0;
    if (frac > scale) return text_fail(in, col, "DECIMAL has more digits than its scale");
    if (digits + scale - frac > 80) return text_fail(in, col, "DECIMAL too long");
    for (int k = frac; k < scale; k++) big_muladd(x, 10, 0);
    return put_big(b, x, negative && nonzero);
}

/* One non-NULL value as text (s, n) -> union branch and Avro value. */
static int text_value(RowCodec *rc, int i, In *in, const unsigned char *s, size_t n, Buf *b) {
    Col *c = &rc->cols[i];
    switch (c->op) {
    case OP_INT8: case OP_INT16: case OP_INT24: case OP_INT32: case OP_INT64:
    case OP_UINT8: case OP_UINT16: case OP_UINT24: case OP_UINT32: case OP_YEAR: {
        int neg = n > 0 && s[0] == '-';
        uint64_t v;
        if (text_digits(s + neg, n - (size_t)neg, &v) < 0 || v > ((uint64_t)1 << 63) ||
            (!neg && v == ((uint64_t)1 << 63)))
            return text_fail(in, i, "bad integer text");
        return buf_byte(b, 2) < 0 ? -1 : put_long(b, neg ? (int64_t)(0 - v) : (int64_t)v);
    }
    case OP_UINT64_DEC: {
        uint64_t v;
        if (text_digits(s, n, &v) < 0) return text_fail(in, i, "bad integer text");
        uint32_t x[LIMBS] = {0};
        x[0] = (uint32_t)v;
        x[1] = (uint32_t)(v >> 32);
        return buf_byte(b, 2) < 0 ? -1 : put_big(b, x, 0);
    }
    case OP_FLOAT: case OP_DOUBLE: {
        char tmp[64];
        if (n == 0 || n >= sizeof tmp) return text_fail(in, i, "bad floating-point text");
        memcpy(tmp, s, n);
        tmp[n] = 0;
        char *end = NULL;
        double d = PyOS_string_to_double(tmp, &end, NULL);
        if (d == -1.0 && PyErr_Occurred()) return -1;
        if (end != tmp + n) return text_fail(in, i, "bad floating-point text");
        unsigned char raw[8];
        int size = c->op == OP_FLOAT ? 4 : 8;
        if ((size == 4 ? PyFloat_Pack4(d, (char *)raw, 1) : PyFloat_Pack8(d, (char *)raw, 1)) < 0)
            return -1;
        return buf_byte(b, 2) < 0 ? -1 : buf_put(b, raw, (size_t)size);
    }
    case OP_DECIMAL:
        return buf_byte(b, 2) < 0 ? -1 : text_decimal(in, b, s, n, c->b, i);
    case OP_BIT_LONG: case OP_BIT_DEC: {
        if (n > 8) return text_fail(in, i, "BIT value longer than 8 bytes");
        uint64_t v = be(s, (int)n);
        if (buf_byte(b, 2) < 0) return -1;
        if (c->op == OP_BIT_LONG) return put_long(b, (int64_t)v);
        uint32_t x[LIMBS] = {0};
        x[0] = (uint32_t)v;
        x[1] = (uint32_t)(v >> 32);
        return put_big(b, x, 0);
    }
    case OP_DATE: case OP_DATETIME2: case OP_TIMESTAMP2: {
        int64_t v = 0;
        int r = c->op == OP_DATE ? text_date(s, n, &v) : text_datetime(s, n, &v);
        if (r < 0 || (c->op == OP_DATE && n != 10)) return text_fail(in, i, "bad date text");
        if (r == 0) return buf_byte(b, 0); /* zero or impossible date: NULL */
        return buf_byte(b, 2) < 0 ? -1 : put_long(b, v);
    }
    case OP_TIME2: {
        int64_t v;
        if (text_time(s, n, &v) < 0) return text_fail(in, i, "bad TIME text");
        return buf_byte(b, 2) < 0 ? -1 : put_long(b, v);
    }
    case OP_VARSTR: case OP_CHAR: case OP_BLOB: case OP_ENUM: case OP_SET: {
        /* text columns arrive in the connection's utf8mb4, whatever their charset */
        int text = c->op == OP_ENUM || c->op == OP_SET || c->conv != CONV_COPY;
        if (text && !utf8_valid(s, n)) return text_fail(in, i, "not valid UTF-8");
        return buf_byte(b, 2) < 0 ? -1 : put_bytes(b, s, n);
    }
    case OP_BINARY_PAD: /* a SELECT returns BINARY(n) padded already */
        return buf_byte(b, 2) < 0 ? -1 : put_bytes(b, s, n);
    default:
        return text_fail(in, i, "opcode without a text form");
    }
}

/* One result row packet -> Avro record in b, with the key spans as image(). */
static int text_image(RowCodec *rc, In *in, Buf *b, Py_ssize_t *col_start, Py_ssize_t *col_end,
                      int *col_null) {
    for (int i = 0; i < rc->ncols; i++) {
        if (need(in, 1, i) < 0) return -1;
        unsigned char first = in->p[in->pos++];
        uint64_t n;
        col_start[i] = (Py_ssize_t)b->len;
        if (first == 0xFB) { /* NULL */
            if (buf_byte(b, 0) < 0) return -1;
        } else {
            if (first < 0xFB) n = first;
            else if (first == 0xFF) return text_fail(in, i, "bad length prefix");
            else {
                int w = first == 0xFC ? 2 : (first == 0xFD ? 3 : 8);
                if (need(in, w, i) < 0) return -1;
                n = le(in->p + in->pos, w);
                in->pos += w;
            }
            if (n > (uint64_t)(in->end - in->pos)) return need(in, in->end - in->pos + 1, i);
            const unsigned char *s = in->p + in->pos;
            in->pos += (Py_ssize_t)n;
            if (text_value(rc, i, in, s, (size_t)n, b) < 0) return -1;
        }
        col_null[i] = b->p[col_start[i]] == 0;
        col_end[i] = (Py_ssize_t)b->len;
        if (rc->cols[i].skip) b->len = (size_t)col_start[i];
    }
    if (in->pos != in->end) return text_fail(in, rc->ncols, "bytes after the last column");
    return 0;
}

/*
 * encode_text(rows, table, tail) -> list of (key, payload, tail)
 * rows: a sequence of result row packets (bytes), one per row, columns in the
 * program's order. key: int or bytes as Shape.key; payload: the Avro record;
 * tail: the given object, as is (the caller's third item).
 */
static PyObject *RowCodec_encode_text(RowCodec *self, PyObject *args) {
    PyObject *rows, *tail;
    const char *table;
    if (!PyArg_ParseTuple(args, "OsO", &rows, &table, &tail)) return NULL;
    PyObject *seq = PySequence_Fast(rows, "rows must be a sequence of bytes");
    if (!seq) return NULL;
    Py_ssize_t nrows = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = PyList_New(nrows);
    Buf img = {0}, kb = {0};
    Py_ssize_t *cs = PyMem_Calloc((size_t)self->ncols * 2 + 2, sizeof(Py_ssize_t));
    int *cn = PyMem_Calloc((size_t)self->ncols + 1, sizeof(int));
    if (!result || !cs || !cn) {
        if (result) PyErr_NoMemory();
        goto fail;
    }
    Py_ssize_t *ce = cs + self->ncols + 1;
    for (Py_ssize_t r = 0; r < nrows; r++) {
        PyObject *row = PySequence_Fast_GET_ITEM(seq, r);
        if (!PyBytes_Check(row)) {
            PyErr_SetString(PyExc_TypeError, "result rows must be bytes");
            goto fail;
        }
        In in = {(const unsigned char *)PyBytes_AS_STRING(row), 0, PyBytes_GET_SIZE(row), table};
        img.len = 0;
        if (text_image(self, &in, &img, cs, ce, cn) < 0) goto fail;
        int64_t ikey = 0;
        int is_int = make_key(self, &img, cs, ce, cn, 0, &ikey, &kb);
        if (is_int < 0) goto fail;
        PyObject *key = is_int ? PyLong_FromLongLong(ikey)
                               : PyBytes_FromStringAndSize((const char *)kb.p, (Py_ssize_t)kb.len);
        PyObject *payload = PyBytes_FromStringAndSize((const char *)img.p, (Py_ssize_t)img.len);
        PyObject *pair = key && payload ? PyTuple_Pack(3, key, payload, tail) : NULL;
        Py_XDECREF(key);
        Py_XDECREF(payload);
        if (!pair) goto fail;
        PyList_SET_ITEM(result, r, pair);
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    Py_DECREF(seq);
    PyMem_Free(img.p);
    PyMem_Free(kb.p);
    PyMem_Free(cs);
    PyMem_Free(cn);
    return result;
}

/*
 * snapshot_events(items, scn, timestamp_ns) -> bytes
 * items: a sequence of (key, payload) (int or bytes key, Avro payload bytes);
 * the events are op READ with the snapshot attribute and no metadata part.
 */
static PyObject *RowCodec_snapshot_events(RowCodec *self, PyObject *args) {
    PyObject *items;
    long long scn, ts;
    if (!PyArg_ParseTuple(args, "OLL", &items, &scn, &ts)) return NULL;
    PyObject *seq = PySequence_Fast(items, "items must be a sequence of (key, payload)");
    if (!seq) return NULL;
    Buf out = {0}, kb = {0};
    PyObject *result = NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, r);
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2 ||
            !PyBytes_Check(PyTuple_GET_ITEM(item, 1))) {
            PyErr_SetString(PyExc_TypeError, "items are (key, payload bytes)");
            goto done;
        }
        PyObject *key = PyTuple_GET_ITEM(item, 0), *payload = PyTuple_GET_ITEM(item, 1);
        int64_t ikey = 0;
        int is_int = PyLong_Check(key);
        if (is_int) {
            ikey = PyLong_AsLongLong(key);
            if (ikey == -1 && PyErr_Occurred()) goto done;
        } else if (PyBytes_Check(key)) {
            kb.len = 0;
            if (buf_put(&kb, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key)) < 0) goto done;
        } else {
            PyErr_SetString(PyExc_TypeError, "keys are int or bytes");
            goto done;
        }
        if (write_event(self, &out, 4, scn, ts, is_int, ikey, &kb, NULL, EV_ATTR_SNAPSHOT,
                        (const unsigned char *)PyBytes_AS_STRING(payload),
                        (size_t)PyBytes_GET_SIZE(payload)) < 0)
            goto done;
    }
    result = PyBytes_FromStringAndSize((const char *)out.p, (Py_ssize_t)out.len);
done:
    Py_DECREF(seq);
    PyMem_Free(out.p);
    PyMem_Free(kb.p);
    return result;
}

/*
 * scan_rows(data, seq) -> (rows, consumed, seq)
 * Splits the complete row packets at the start of data (bytes a result's
 * socket has buffered) off: each packet is a 3-byte length, a sequence number
 * that must be seq (then seq + 1, modulo 256) and the row. Stops before an
 * incomplete packet, a packet of 16 MB or more (split packets), a packet
 * with a wrong sequence number, and one whose first byte is 0xFE or 0xFF
 * (EOF, error, or a row pymysql must read): the caller reads that one with
 * pymysql. consumed: the bytes of the packets returned.
 */
static PyObject *py_scan_rows(PyObject *mod, PyObject *args) {
    Py_buffer data;
    int seq;
    (void)mod;
    if (!PyArg_ParseTuple(args, "y*i", &data, &seq)) return NULL;
    const unsigned char *p = data.buf;
    Py_ssize_t pos = 0, end = data.len;
    PyObject *rows = PyList_New(0);
    if (!rows) goto done;
    while (end - pos >= 4) {
        Py_ssize_t n = (Py_ssize_t)le(p + pos, 3);
        if (n >= 0xFFFFFF || p[pos + 3] != (seq & 0xFF) || end - pos - 4 < n) break;
        if (n == 0 || p[pos + 4] == 0xFE || p[pos + 4] == 0xFF) break;
        PyObject *row = PyBytes_FromStringAndSize((const char *)p + pos + 4, n);
        if (!row || PyList_Append(rows, row) < 0) {
            Py_XDECREF(row);
            Py_CLEAR(rows);
            goto done;
        }
        Py_DECREF(row);
        pos += 4 + n;
        seq = (seq + 1) & 0xFF;
    }
done:
    PyBuffer_Release(&data);
    return rows ? Py_BuildValue("(Nni)", rows, pos, seq) : NULL;
}
