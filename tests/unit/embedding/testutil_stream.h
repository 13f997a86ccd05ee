/*
 * testutil_stream.h - in-memory table streams for the embedding tests (test_serialize.c,
 * test_delta.c): a growing write buffer whose Nth write call can fail, and a reader over
 * bytes whose Nth read call can fail.
 */
#ifndef MT_TESTUTIL_STREAM_H
#define MT_TESTUTIL_STREAM_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mt/table.h"

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
    size_t calls;      /* write callback invocations */
    size_t fail_at;    /* the call (0-based) that fails; SIZE_MAX: none */
    mt_err_t fail_err; /* what it fails with */
} wbuf_t;

static inline void wbuf_init(wbuf_t *w) {
    memset(w, 0, sizeof(*w));
    w->fail_at = SIZE_MAX;
}

static inline void wbuf_free(wbuf_t *w) {
    free(w->p);
    w->p = NULL;
    w->len = w->cap = 0;
}

static inline void wbuf_append(wbuf_t *w, const void *buf, size_t len) {
    if (w->len + len > w->cap) {
        size_t c = w->cap ? w->cap : 4096;
        while (c < w->len + len)
            c *= 2;
        uint8_t *n = realloc(w->p, c);
        cr_assert_not_null(n);
        w->p = n;
        w->cap = c;
    }
    if (len) memcpy(w->p + w->len, buf, len);
    w->len += len;
}

static inline void wbuf_put_le(wbuf_t *w, uint64_t v, int n) {
    uint8_t b[8];
    for (int i = 0; i < n; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    wbuf_append(w, b, (size_t)n);
}

static inline mt_err_t wbuf_write(void *ud, const void *buf, size_t len) {
    wbuf_t *w = ud;
    if (w->calls++ == w->fail_at) return w->fail_err;
    wbuf_append(w, buf, len);
    return MT_OK;
}

typedef struct rbuf {
    const uint8_t *p;
    size_t len, pos;
    size_t calls, fail_at;
    mt_err_t fail_err;
} rbuf_t;

/* Returns fewer bytes than asked only at the end of the buffer. */
static inline mt_err_t rbuf_read(void *ud, void *buf, size_t len, size_t *got) {
    rbuf_t *r = ud;
    if (r->calls++ == r->fail_at) {
        *got = 0;
        return r->fail_err;
    }
    size_t n = r->len - r->pos < len ? r->len - r->pos : len;
    if (n) memcpy(buf, r->p + r->pos, n);
    r->pos += n;
    *got = n;
    return MT_OK;
}

static inline void rbuf_init(rbuf_t *r, const uint8_t *p, size_t len) {
    memset(r, 0, sizeof(*r));
    r->p = p;
    r->len = len;
    r->fail_at = SIZE_MAX;
}

#endif /* MT_TESTUTIL_STREAM_H */
