/*
 * grow.h - the doubling growth of a heap array that the readers and builders share: an
 * array of *cap elements of elem bytes at *p is reallocated to the first power-of-two
 * multiple of @p first elements that holds @p need (amortized O(1) appends).
 *
 * Ownership: *p stays the caller's (realloc'ed in place: a NULL *p with *cap 0 is a start).
 * Thread safety: none needed: it touches only what the caller passes.
 */
#ifndef MT_GROW_H
#define MT_GROW_H

#include <stdint.h>
#include <stdlib.h>

#include "mt/err.h"

/** Makes room for @p need elements of @p elem bytes, starting at @p first elements.
 *  @returns MT_OK (then *cap >= need) or MT_NOMEM (out of memory or a size that overflows;
 *  *p and *cap unchanged). */
static inline mt_err_t mt_grow(void **p, size_t *cap, size_t need, size_t elem, size_t first) {
    if (need <= *cap) return MT_OK;
    size_t c = *cap ? *cap : (first ? first : 1);
    while (c < need) {
        if (c > SIZE_MAX / 2) return MT_NOMEM;
        c *= 2;
    }
    if (elem && c > SIZE_MAX / elem) return MT_NOMEM;
    void *np = realloc(*p, c * elem);
    if (!np) return MT_NOMEM;
    *p = np;
    *cap = c;
    return MT_OK;
}

#endif /* MT_GROW_H */
