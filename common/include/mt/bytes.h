/*
 * bytes.h - fixed-width little-endian integers in byte buffers, the encoding of every
 * on-disk format (table snapshots, the checkpoint store, the joiner's state). Byte by byte,
 * so the formats do not depend on the host's byte order or alignment; compilers turn these
 * loops into single loads and stores.
 *
 * Thread safety: pure functions.
 */
#ifndef MT_BYTES_H
#define MT_BYTES_H

#include <stdint.h>

/** Writes the low @p n bytes (1..8) of @p v at @p d, least significant first. */
static inline void mt_put_le(uint8_t *d, uint64_t v, int n) {
    for (int i = 0; i < n; i++)
        d[i] = (uint8_t)(v >> (8 * i));
}

/** Reads @p n bytes (1..8) at @p s, least significant first. */
static inline uint64_t mt_get_le(const uint8_t *s, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)s[i] << (8 * i);
    return v;
}

#endif /* MT_BYTES_H */
