/* err.c - names, messages and gRPC status codes of mt_err_t, all from MT_ERR_MAP. */
#include "mt/err.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

typedef struct {
    int value;
    int grpc;
    const char *name;
    const char *msg;
} err_info_t;

static const err_info_t err_table[] = {
#define MT__ERR_INFO(name, value, grpc, msg) {value, grpc, #name, msg},
    MT_ERR_MAP(MT__ERR_INFO)
#undef MT__ERR_INFO
};

static const err_info_t *err_find(mt_err_t err) {
    for (size_t i = 0; i < sizeof(err_table) / sizeof(err_table[0]); i++)
        if (err_table[i].value == (int)err) return &err_table[i];
    return NULL;
}

const char *mt_strerror(mt_err_t err) {
    const err_info_t *e = err_find(err);
    return e ? e->msg : "unknown error";
}

const char *mt_err_name(mt_err_t err) {
    const err_info_t *e = err_find(err);
    return e ? e->name : "UNKNOWN";
}

int mt_err_grpc_status(mt_err_t err) {
    const err_info_t *e = err_find(err);
    return e ? e->grpc : 13;
}

void mt_msgf(char *buf, size_t len, const char *fmt, ...) {
    if (!buf || !len) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}
