/*
 * What the compiled event encoders share (sources/mysql/_rowcodec.c,
 * sources/postgres/_pgcodec.c #include it): CRC-32 as zlib.crc32, a growable
 * output buffer, and the Avro and big-endian integer writers. One copy, so the
 * bytes both sources write cannot drift apart.
 */
#ifndef DATABUS_CENC_H
#define DATABUS_CENC_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---------- CRC-32 (IEEE, as zlib.crc32), slicing by 8 ---------- */
static uint32_t crc_tab[8][256];

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

#endif /* DATABUS_CENC_H */
