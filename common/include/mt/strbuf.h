/*
 * strbuf.h - a growable string appended to with printf formats (metrics pages, reports).
 *
 *   mt_strbuf_t b = {0};
 *   mt_strbuf_printf(&b, "x %d\n", 1);
 *   if (b.oom) { free(b.p); return MT_NOMEM; }   // else b.p (NUL-terminated), b.len: yours
 *
 * Ownership: b.p is malloc'd, the caller frees it. After an allocation failure b.oom is set
 * and further appends do nothing (what was appended stays).
 * Thread safety: a buffer is used by one thread at a time.
 */
#ifndef MT_STRBUF_H
#define MT_STRBUF_H

#include <stddef.h>

typedef struct mt_strbuf {
    char *p;
    size_t len, cap;
    int oom;
} mt_strbuf_t;

void mt_strbuf_printf(mt_strbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* MT_STRBUF_H */
