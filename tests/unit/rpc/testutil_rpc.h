/*
 * testutil_rpc.h - what the rpc layer's tests (test_rpc.c, test_rpc_security.c) share: the
 * clock and polling helpers, a server started with a table of test methods, and a channel to
 * host:port. Header-only (static inline), like tls_certs.h: each test executable includes
 * it once and needs no extra source in its cmake entry.
 *
 * tu_rpc_server_start() and tu_rpc_channel() assert with Criterion (cr_assert): call them
 * from the test's own thread, never from a handler (handlers run on server threads and only
 * record what they see). The clock helpers are safe anywhere.
 */
#ifndef MT_TESTUTIL_RPC_H
#define MT_TESTUTIL_RPC_H

#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "mt/rpc.h"

/* CLOCK_MONOTONIC in milliseconds. */
static inline int64_t tu_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void tu_sleep_ms(int64_t ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Polls @p flag every 2 ms until it is at least @p want. @returns 1, or 0 when
 * @p timeout_ms passed first. */
static inline int tu_wait_for(atomic_int *flag, int want, int64_t timeout_ms) {
    int64_t end = tu_now_ms() + timeout_ms;
    while (atomic_load(flag) < want) {
        if (tu_now_ms() > end) return 0;
        tu_sleep_ms(2);
    }
    return 1;
}

/* One method of a test server. */
typedef struct tu_rpc_method {
    const char *path; /* "/pkg.Service/Method" */
    int streaming;    /* 1: server streaming */
    mt_rpc_handler_fn fn;
    void *ud; /* borrowed: passed to fn */
} tu_rpc_method_t;

/* Creates a server with @p cfg, adds the @p n methods @p m and starts it; *port receives the
 * bound port. Asserts that every step succeeds. @returns the server (mt_rpc_server_destroy). */
static inline mt_rpc_server_t *tu_rpc_server_start(const mt_rpc_server_config_t *cfg,
                                                   const tu_rpc_method_t *m, size_t n, int *port) {
    mt_rpc_server_t *s = NULL;
    cr_assert_eq(mt_rpc_server_create(cfg, &s), MT_OK);
    cr_assert_not_null(s);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(mt_rpc_server_add(s, m[i].path, m[i].streaming, m[i].fn, m[i].ud), MT_OK, "%s",
                     m[i].path);
    *port = -1;
    cr_assert_eq(mt_rpc_server_start(s, port), MT_OK);
    cr_assert(*port > 0 && *port < 65536, "bound port %d", *port);
    return s;
}

/* A channel to @p host:@p port with @p cc. Asserts that it is created. @returns the channel
 * (mt_rpc_channel_destroy). */
static inline mt_rpc_channel_t *tu_rpc_channel(const char *host, int port,
                                               const mt_rpc_client_config_t *cc) {
    char target[96];
    snprintf(target, sizeof(target), "%s:%d", host, port);
    mt_rpc_channel_t *ch = NULL;
    cr_assert_eq(mt_rpc_channel_create(target, cc, &ch), MT_OK, "%s", target);
    cr_assert_not_null(ch);
    return ch;
}

#endif /* MT_TESTUTIL_RPC_H */
