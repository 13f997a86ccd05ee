/* fuzz_rpc_stub.c - see fuzz_rpc_stub.h. One fuzzer thread drives the server side (no
 * locking there); client calls (WRAP_RPC_CLIENT) may come from several threads and are
 * serialized by client_lock. */
#include "fuzz_rpc_stub.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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

/* A client call answered in process: what its handler replied, sent or failed with. The
 * handler gets it as its mt_rpc_call_t (anything but &fake_call is one of these). */
typedef struct client_call {
    int code; /* -1 until the handler finished the call */
    char message[256];
    uint8_t **msgs; /* the reply, or the stream's messages, in order (malloc'd copies) */
    size_t *lens;
    size_t n, cap, next;
    int oom;
} client_call_t;

static pthread_mutex_t client_lock = PTHREAD_MUTEX_INITIALIZER;

static int is_client(const mt_rpc_call_t *c) {
    return (const void *)c != (const void *)&fake_call;
}

static void collect(client_call_t *cc, const uint8_t *buf, size_t len) {
    if (cc->n == cc->cap) {
        size_t cap = cc->cap ? 2 * cc->cap : 8;
        uint8_t **m = realloc(cc->msgs, cap * sizeof(*m));
        if (m) cc->msgs = m;
        size_t *l = m ? realloc(cc->lens, cap * sizeof(*l)) : NULL;
        if (l) cc->lens = l;
        if (!m || !l) {
            cc->oom = 1;
            return;
        }
        cc->cap = cap;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy) {
        cc->oom = 1;
        return;
    }
    if (len) memcpy(copy, buf, len);
    cc->msgs[cc->n] = copy;
    cc->lens[cc->n++] = len;
}

static void client_call_free(client_call_t *cc) {
    for (size_t i = cc->next; i < cc->n; i++)
        free(cc->msgs[i]);
    free(cc->msgs);
    free(cc->lens);
    free(cc);
}

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
    if (is_client(c)) {
        client_call_t *cc = (client_call_t *)c;
        if (buf && len) collect(cc, buf, len);
        cc->code = MT_RPC_OK;
        return;
    }
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
    if (is_client(c)) {
        client_call_t *cc = (client_call_t *)c;
        cc->code = code;
        snprintf(cc->message, sizeof(cc->message), "%s", msg);
        return;
    }
    last_code = code;
}

mt_err_t __wrap_mt_rpc_send(mt_rpc_call_t *c, const uint8_t *buf, size_t len) {
    if (is_client(c)) {
        client_call_t *cc = (client_call_t *)c;
        collect(cc, buf, len);
        return cc->oom ? MT_CANCELLED : MT_OK;
    }
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

/* ============================== client side ============================== */

/* Runs the handler of @p path on @p req to its end. @returns the call (caller frees), or
 * NULL when out of memory. */
static client_call_t *client_run(const char *path, const uint8_t *req, size_t len) {
    client_call_t *cc = calloc(1, sizeof(*cc));
    if (!cc) return NULL;
    cc->code = -1;
    pthread_mutex_lock(&client_lock);
    size_t i = 0;
    while (i < nhandlers && strcmp(handlers[i].path, path))
        i++;
    if (i == nhandlers) {
        cc->code = MT_RPC_UNIMPLEMENTED;
        snprintf(cc->message, sizeof(cc->message), "no in-process handler for %s", path);
    } else {
        handlers[i].fn(handlers[i].ud, (mt_rpc_call_t *)cc, req, len);
    }
    pthread_mutex_unlock(&client_lock);
    if (cc->code == -1) {
        cc->code = MT_RPC_INTERNAL;
        snprintf(cc->message, sizeof(cc->message), "%s: the handler did not finish the call", path);
    }
    if (cc->oom && cc->code == MT_RPC_OK) {
        cc->code = MT_RPC_RESOURCE_EXHAUSTED;
        snprintf(cc->message, sizeof(cc->message), "fuzz stub: out of memory");
    }
    return cc;
}

static void set_status(mt_rpc_status_t *st, const client_call_t *cc) {
    if (!st) return;
    st->code = cc->code;
    snprintf(st->message, sizeof(st->message), "%s", cc->message);
}

mt_err_t __wrap_mt_rpc_call(mt_rpc_channel_t *ch, const char *path, const uint8_t *req, size_t len,
                            int64_t deadline_ms, uint8_t **resp, size_t *resp_len,
                            mt_rpc_status_t *st) {
    (void)ch;
    (void)deadline_ms;
    *resp = NULL;
    *resp_len = 0;
    client_call_t *cc = client_run(path, req, len);
    if (!cc) return MT_NOMEM;
    set_status(st, cc);
    if (cc->code == MT_RPC_OK && cc->n > 0) { /* a unary reply is its first message */
        *resp = cc->msgs[0];
        *resp_len = cc->lens[0];
        cc->next = 1;
    }
    client_call_free(cc);
    return MT_OK;
}

mt_err_t __wrap_mt_rpc_call_many(mt_rpc_batch_call_t *calls, size_t n, int64_t deadline_ms) {
    for (size_t i = 0; i < n; i++) {
        mt_rpc_batch_call_t *b = &calls[i];
        mt_err_t err = __wrap_mt_rpc_call(b->ch, b->path, b->req, b->len, deadline_ms, &b->resp,
                                          &b->resp_len, &b->st);
        if (err != MT_OK) return err;
    }
    return MT_OK;
}

mt_err_t __wrap_mt_rpc_stream_open(mt_rpc_channel_t *ch, const char *path, const uint8_t *req,
                                   size_t len, int64_t deadline_ms, mt_rpc_stream_t **out) {
    (void)ch;
    (void)deadline_ms;
    client_call_t *cc = client_run(path, req, len);
    if (!cc) return MT_NOMEM;
    *out = (mt_rpc_stream_t *)cc;
    return MT_OK;
}

mt_err_t __wrap_mt_rpc_stream_next(mt_rpc_stream_t *s, uint8_t **buf, size_t *len) {
    client_call_t *cc = (client_call_t *)s;
    *buf = NULL; /* as the real one: nothing to free at the end */
    *len = 0;
    if (cc->next == cc->n) return MT_NOT_FOUND;
    *buf = cc->msgs[cc->next];
    *len = cc->lens[cc->next];
    cc->next++;
    return MT_OK;
}

void __wrap_mt_rpc_stream_close(mt_rpc_stream_t *s, mt_rpc_status_t *st) {
    client_call_t *cc = (client_call_t *)s;
    set_status(st, cc);
    client_call_free(cc);
}

/* ============================== server side ============================== */

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
