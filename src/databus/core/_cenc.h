/*
 * What the compiled event codecs share (sources/mysql/_rowcodec.c,
 * sources/postgres/_pgcodec.c and client/_wiredecode.c #include it): CRC-32 as
 * zlib.crc32, a growable byte buffer, the Avro and big-endian integer writers and
 * readers, JSON strings as json.dumps(ensure_ascii=False) writes them, and the event
 * layout (DbusEvent V2: databus.core.event) with its writer. One copy, so the bytes
 * the sources write, and what the client reads, cannot drift apart.
 *
 * Everything here is static (inline): a file that includes it and leaves a part unused
 * gets no code for it.
 */
#ifndef DATABUS_CENC_H
#define DATABUS_CENC_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---------- CRC-32 (IEEE, as zlib.crc32), slicing by 8 ---------- */
#if defined(__GNUC__)
#define CENC_UNUSED __attribute__((unused))
#else
#define CENC_UNUSED
#endif

static uint32_t crc_tab[8][256] CENC_UNUSED;

static inline void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xFF];
}

static inline uint32_t crc32_update(uint32_t crc, const unsigned char *p, size_t n) {
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                             (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        crc = crc_tab[7][lo & 0xFF] ^ crc_tab[6][(lo >> 8) & 0xFF] ^
              crc_tab[5][(lo >> 16) & 0xFF] ^ crc_tab[4][lo >> 24] ^
              crc_tab[3][hi & 0xFF] ^ crc_tab[2][(hi >> 8) & 0xFF] ^
              crc_tab[1][(hi >> 16) & 0xFF] ^ crc_tab[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_tab[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/* ---------- growable buffer ---------- */
typedef struct {
    unsigned char *p;
    size_t len, cap;
} Buf;

static inline int buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    unsigned char *np = PyMem_Realloc(b->p, cap);
    if (!np) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = np;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, size_t n) {
    if (buf_reserve(b, n) < 0) return -1;
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static inline int buf_byte(Buf *b, unsigned char c) {
    if (buf_reserve(b, 1) < 0) return -1;
    b->p[b->len++] = c;
    return 0;
}

static inline void buf_free(Buf *b) {
    PyMem_Free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* Avro long: zig-zag varint */
static inline int put_long(Buf *b, int64_t v) {
    uint64_t n = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    if (buf_reserve(b, 10) < 0) return -1;
    unsigned char *p = b->p + b->len;
    while (n > 0x7F) {
        *p++ = (unsigned char)((n & 0x7F) | 0x80);
        n >>= 7;
    }
    *p++ = (unsigned char)n;
    b->len = (size_t)(p - b->p);
    return 0;
}

static inline int put_bytes(Buf *b, const unsigned char *src, size_t n) {
    if (put_long(b, (int64_t)n) < 0) return -1;
    return buf_put(b, src, n);
}

static inline void put_be32_at(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

static inline void put_be64_at(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (56 - 8 * i));
}

static inline uint32_t get_be32(const unsigned char *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static inline uint64_t get_be64(const unsigned char *p) {
    return ((uint64_t)get_be32(p) << 32) | get_be32(p + 4);
}

static inline int16_t get_be16s(const unsigned char *p) {
    return (int16_t)(((unsigned)p[0] << 8) | p[1]);
}

/* ---------- JSON ---------- */

/* A JSON string of the UTF-8 bytes s, as json.dumps(ensure_ascii=False) writes it
 * (the text of composite keys). */
static inline int json_string(Buf *b, const unsigned char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    if (buf_byte(b, '"') < 0) return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = s[i];
        const char *esc = NULL;
        switch (ch) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        }
        if (esc) {
            if (buf_put(b, esc, 2) < 0) return -1;
        } else if (ch < 0x20) {
            char u[6] = {'\\', 'u', '0', '0', hex[ch >> 4], hex[ch & 15]};
            if (buf_put(b, u, 6) < 0) return -1;
        } else if (buf_byte(b, ch) < 0) {
            return -1;
        }
    }
    return buf_byte(b, '"');
}

/* ---------- the event (DbusEvent V2, databus.core.event) ---------- */
#define EV_HEADER_LEN 45
#define EV_ATTR_KEY_BYTES 0x0008
#define EV_ATTR_HAS_METADATA 0x0010
#define EV_ATTR_SNAPSHOT 0x0020

/* A schema digest as an event's part carries it (at most 64 bytes). */
typedef struct {
    unsigned char b[64];
    int len;
} EvDigest;

/* What an event says of its table version: source id, schema version, digest. */
typedef struct {
    int32_t src_id;
    int16_t version;
    EvDigest id;
} EvSchema;

/* 0, or -1 with ValueError naming ``what`` for a digest longer than 64 bytes. */
static inline int ev_digest_set(EvDigest *d, const Py_buffer *v, const char *what) {
    if (v->len > (Py_ssize_t)sizeof d->b) {
        PyErr_Format(PyExc_ValueError, "%s digest longer than 64 bytes", what);
        return -1;
    }
    memcpy(d->b, v->buf, (size_t)v->len);
    d->len = (int)v->len;
    return 0;
}

static inline int ev_schema_set(EvSchema *s, int src_id, int version, const Py_buffer *digest) {
    if (ev_digest_set(&s->id, digest, "schema") < 0) return -1;
    s->src_id = (int32_t)src_id;
    s->version = (int16_t)version;
    return 0;
}

/* A part (metadata or payload): length, schema version, digest length, digest, data. */
static inline int ev_part(Buf *b, int16_t version, const unsigned char *digest, int dlen,
                          const unsigned char *data, size_t n) {
    unsigned char h[7];
    put_be32_at(h, (uint32_t)n);
    h[4] = (unsigned char)((uint16_t)version >> 8);
    h[5] = (unsigned char)version;
    h[6] = (unsigned char)dlen;
    if (buf_put(b, h, 7) < 0 || buf_put(b, digest, (size_t)dlen) < 0) return -1;
    return buf_put(b, data, n);
}

/* Starts an event at the end of b: its header (zeros until ev_finish) and its key, an
 * int64 (is_int_key) or length + bytes (then *attrs gets EV_ATTR_KEY_BYTES); *start is
 * where the event begins. The caller then writes its parts (ev_part). */
static inline int ev_start(Buf *b, size_t *start, int is_int_key, int64_t ikey,
                           const unsigned char *kp, size_t klen, uint16_t *attrs) {
    *start = b->len;
    if (buf_reserve(b, EV_HEADER_LEN) < 0) return -1;
    memset(b->p + b->len, 0, EV_HEADER_LEN);
    b->len += EV_HEADER_LEN;
    unsigned char k8[8];
    if (is_int_key) {
        put_be64_at(k8, (uint64_t)ikey);
        return buf_put(b, k8, 8);
    }
    *attrs |= EV_ATTR_KEY_BYTES;
    put_be32_at(k8, (uint32_t)klen);
    if (buf_put(b, k8, 4) < 0) return -1;
    return buf_put(b, kp, klen);
}

/* Fills in the header of the event begun at start, whose parts end b now: version 2,
 * magic, lengths, attributes, timestamp, source id, partition 0, sequence (SCN), and
 * both CRCs. */
static inline void ev_finish(Buf *b, size_t start, uint16_t attrs, int64_t ts,
                             int32_t src_id, int64_t scn) {
    size_t body = start + EV_HEADER_LEN;
    unsigned char *h = b->p + start;
    h[0] = 2;
    put_be32_at(h + 1, 0xCAFEDEEDu);
    put_be32_at(h + 5, EV_HEADER_LEN);
    put_be32_at(h + 13, crc32_update(0, b->p + body, b->len - body));
    put_be32_at(h + 17, (uint32_t)(b->len - start));
    h[21] = (unsigned char)(attrs >> 8);
    h[22] = (unsigned char)attrs;
    put_be64_at(h + 23, (uint64_t)ts);
    put_be32_at(h + 31, (uint32_t)src_id);
    h[35] = h[36] = 0;
    put_be64_at(h + 37, (uint64_t)scn);
    put_be32_at(h + 9, crc32_update(crc32_update(0, h, 9), h + 13, EV_HEADER_LEN - 13));
}

#endif /* DATABUS_CENC_H */
