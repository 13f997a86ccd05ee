/* fuzz_rpc_stub.c - see fuzz_rpc_stub.h. One process = one fuzzer thread: no locking. */
#include "fuzz_rpc_stub.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define MAX_HANDLERS 16

static struct {
    char path[128];
    mt_rpc_handler_fn fn;
    void *ud;
} handlers[MAX_HANDLERS];
static size_t nhandlers;
static int last_code;
static char fake_call; /* the handlers only pass their mt_rpc_call_t to the wrappers */

static void touch(const uint8_t *buf, size_t len) {
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < len; i++)
        sink ^= buf[i];
    (void)sink;
}

mt_err_t __wrap_mt_rpc_server_add(mt_rpc_server_t *s, const char *path, int streaming,
                                  mt_rpc_handler_fn fn, void *ud) {
    (void)s;
    (void)streaming;
    if (nhandlers == MAX_HANDLERS || strlen(path) >= sizeof(handlers[0].path)) return MT_NOMEM;
    strcpy(handlers[nhandlers].path, path);
    handlers[nhandlers].fn = fn;
    handlers[nhandlers].ud = ud;
    nhandlers++;
    return MT_OK;
}

void __wrap_mt_rpc_server_set_serving(mt_rpc_server_t *s, int serving) {
    (void)s;
    (void)serving;
}

void __wrap_mt_rpc_reply(mt_rpc_call_t *c, const uint8_t *buf, size_t len) {
    (void)c;
    if (buf) touch(buf, len);
    last_code = 0;
}

void __wrap_mt_rpc_fail(mt_rpc_call_t *c, int code, const char *fmt, ...) {
    (void)c;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    last_code = code;
}

mt_err_t __wrap_mt_rpc_send(mt_rpc_call_t *c, const uint8_t *buf, size_t len) {
    (void)c;
    touch(buf, len);
    return MT_OK;
}

const char *__wrap_mt_rpc_call_metadata(const mt_rpc_call_t *c, const char *key) {
    (void)c;
    (void)key;
    return NULL;
}

int64_t __wrap_mt_rpc_call_remaining_ms(const mt_rpc_call_t *c) {
    (void)c;
    return 60000;
}

int mt_fuzz_rpc_call(const char *path, const uint8_t *req, size_t len) {
    for (size_t i = 0; i < nhandlers; i++) {
        if (!strcmp(handlers[i].path, path)) {
            last_code = -1;
            handlers[i].fn(handlers[i].ud, (mt_rpc_call_t *)&fake_call, req, len);
            return 0;
        }
    }
    return -1;
}

int mt_fuzz_rpc_last_code(void) {
    return last_code;
}

void mt_fuzz_rpc_reset(void) {
    nhandlers = 0;
}
