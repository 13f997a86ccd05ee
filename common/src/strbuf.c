/* strbuf.c - see mt/strbuf.h. */
#include "mt/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void mt_strbuf_printf(mt_strbuf_t *b, const char *fmt, ...) {
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t c = b->cap ? b->cap * 2 : 8192;
        while (c < b->len + (size_t)n + 1)
            c *= 2;
        char *np = realloc(b->p, c);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = c;
    }
}
