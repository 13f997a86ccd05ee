/*
 * test_rpc.c - the gRPC service layer (rpc/include/mt/rpc.h) end to end, over loopback.
 *
 * Every case starts its own servers on 127.0.0.1 port 0 and stops them before it ends (the
 * daemons rely on a clean shutdown as much as on the calls). Covered:
 *   - unary round trips (reversed bytes, so an echo that forgets to transform fails), empty
 *     request and reply, a 10 MiB message, many sequential calls on one channel;
 *   - handler errors: mt_rpc_fail's code and message reach the client exactly; a handler that
 *     returns without finishing answers INTERNAL; unknown paths answer UNIMPLEMENTED at once
 *     (not at the deadline, which a server with only registered methods would do);
 *   - max_message_bytes on both sides (RESOURCE_EXHAUSTED, and the server keeps serving);
 *   - deadlines: the client gives up in time, the handler sees the remaining time;
 *   - server streaming: N = 0, 1, 1000 messages in order, a failure midway, a client that
 *     goes away (the handler's mt_rpc_send must return MT_CANCELLED so it can stop);
 *   - mt_rpc_call_many across two servers, 8 threads sharing one channel, streams and unary
 *     calls from several threads at once;
 *   - grpc.health.v1.Health/Check (SERVING / NOT_SERVING, by service name, NOT_FOUND);
 *   - client retries: exactly `retries` extra attempts on UNAVAILABLE and none on other codes,
 *     UNAVAILABLE when nobody listens, success when the server comes up late (also with a
 *     short backoff, which needs gRPC's own reconnect backoff tuned to the client's);
 *   - config validation, duplicate/late method registration, busy and bad listen addresses;
 *   - graceful shutdown: in-flight calls finish, later calls fail UNAVAILABLE, calls past the
 *     grace period are cancelled, shutdown under load, idempotence, destroy(NULL).
 * Metadata is not tested: the client API does not send any yet. TLS and admission (bounded
 * queue, streams, overload): test_rpc_security.c.
 *
 * Handlers run on server worker threads, so they never assert: they record what they saw in
 * the atomics of `g` (one process per case under Criterion), and the test checks those.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "mt/rpc.h"
#include "testutil_rpc.h"
#include "testutil_tsan.h"

#ifdef MT_SANITIZED
#define SCALE_DIV 4
#else
#define SCALE_DIV 1
#endif

/* ============================== helpers ============================== */

#define P_REVERSE  "/mt.test.Echo/Reverse"
#define P_EMPTY    "/mt.test.Echo/Empty"
#define P_FAIL     "/mt.test.Echo/Fail"
#define P_NOFINISH "/mt.test.Echo/NoFinish"
#define P_SLEEP    "/mt.test.Echo/Sleep"
#define P_BIG      "/mt.test.Echo/Big"
#define P_COUNT    "/mt.test.Stream/Count"
#define P_FAILMID  "/mt.test.Stream/FailMid"
#define P_FOREVER  "/mt.test.Stream/Forever"
#define P_HEALTH   "/grpc.health.v1.Health/Check"

/* What handlers observed (written on worker threads, read by the test). */
static struct {
    atomic_int calls;          /* handler invocations, all methods */
    atomic_int sleep_started;  /* Sleep handlers that began */
    atomic_int sleep_done;     /* Sleep handlers that returned */
    atomic_llong remaining_ms; /* mt_rpc_call_remaining_ms at the start of the last Sleep */
    atomic_int empty_len_bad;  /* Empty handler got len != 0 or a non-NULL pointer with len */
    atomic_int forever_started;
    atomic_int forever_cancelled; /* mt_rpc_send returned MT_CANCELLED */
    atomic_int forever_other;     /* mt_rpc_send returned something else than OK/CANCELLED */
    atomic_int forever_gave_up;   /* the handler hit its safety time limit */
    atomic_long forever_sent;
} g;

static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Reply: [server tag byte, if ud is non-NULL] + the request reversed. */
static void h_reverse(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    atomic_fetch_add(&g.calls, 1);
    size_t off = ud ? 1 : 0;
    if (len + off == 0) {
        mt_rpc_reply(c, NULL, 0);
        return;
    }
    uint8_t *out = malloc(len + off);
    if (!out) {
        mt_rpc_fail(c, MT_RPC_RESOURCE_EXHAUSTED, "no memory");
        return;
    }
    if (ud) out[0] = (uint8_t) * (const int *)ud;
    for (size_t i = 0; i < len; i++)
        out[off + i] = req[len - 1 - i];
    mt_rpc_reply(c, out, len + off);
    free(out);
}

static void h_empty(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)ud;
    (void)req;
    atomic_fetch_add(&g.calls, 1);
    if (len != 0) atomic_fetch_add(&g.empty_len_bad, 1);
    mt_rpc_reply(c, NULL, 0);
}

static void h_fail(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)ud;
    (void)req;
    atomic_fetch_add(&g.calls, 1);
    mt_rpc_fail(c, MT_RPC_INVALID_ARGUMENT, "bad input: %zu bytes, want %d", len, 42);
}

static void h_nofinish(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)ud;
    (void)c;
    (void)req;
    (void)len;
    atomic_fetch_add(&g.calls, 1);
}

/* Request: u32 milliseconds to sleep (in small steps). Reply: "slept". */
static void h_sleep(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)ud;
    atomic_fetch_add(&g.calls, 1);
    atomic_store(&g.remaining_ms, (long long)mt_rpc_call_remaining_ms(c));
    atomic_fetch_add(&g.sleep_started, 1);
    uint32_t ms = len >= 4 ? get_u32(req) : 0;
    int64_t end = tu_now_ms() + ms;
    while (tu_now_ms() < end)
        tu_sleep_ms(5);
    mt_rpc_reply(c, (const uint8_t *)"slept", 5);
    atomic_fetch_add(&g.sleep_done, 1);
}

/* Request: u32 size. Reply: that many bytes (i * 7 + 3). */
static void h_big(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)ud;
    atomic_fetch_add(&g.calls, 1);
    if (len < 4) {
        mt_rpc_fail(c, MT_RPC_INVALID_ARGUMENT, "need a size");
        return;
    }
    size_t n = get_u32(req);
    uint8_t *out = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        out[i] = (uint8_t)(i * 7 + 3);
    mt_rpc_reply(c, out, n);
    free(out);
}

/* Stream of N messages; message i = u32 i followed by i % 13 bytes of (i + k). */
static size_t count_msg(uint8_t *buf, uint32_t i) {
    put_u32(buf, i);
    size_t extra = i % 13;
    for (size_t k = 0; k < extra; k++)
        buf[4 + k] = (uint8_t)(i + k);
    return 4 + extra;
}

static void h_count(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)ud;
    atomic_fetch_add(&g.calls, 1);
    uint32_t n = len >= 4 ? get_u32(req) : 0;
    uint8_t buf[32];
    for (uint32_t i = 0; i < n; i++) {
        if (mt_rpc_send(c, buf, count_msg(buf, i)) != MT_OK) {
            mt_rpc_fail(c, MT_RPC_CANCELLED, "client went away at %u", i);
            return;
        }
    }
    mt_rpc_reply(c, NULL, 0);
}

/* Sends 5 messages, then fails with ABORTED. */
static void h_failmid(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)ud;
    (void)req;
    (void)len;
    atomic_fetch_add(&g.calls, 1);
    uint8_t buf[32];
    for (uint32_t i = 0; i < 5; i++) {
        if (mt_rpc_send(c, buf, count_msg(buf, i)) != MT_OK) {
            mt_rpc_fail(c, MT_RPC_CANCELLED, "client went away");
            return;
        }
    }
    mt_rpc_fail(c, MT_RPC_ABORTED, "stopped after %d messages", 5);
}

/* Sends 4 KiB messages until mt_rpc_send refuses (or 20 s pass: a safety net). */
static void h_forever(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)ud;
    (void)req;
    (void)len;
    atomic_fetch_add(&g.calls, 1);
    atomic_fetch_add(&g.forever_started, 1);
    static uint8_t buf[4096];
    int64_t end = tu_now_ms() + 20000;
    for (uint32_t i = 0;; i++) {
        if (tu_now_ms() > end) {
            atomic_fetch_add(&g.forever_gave_up, 1);
            mt_rpc_fail(c, MT_RPC_DEADLINE_EXCEEDED, "gave up");
            return;
        }
        uint8_t msg[4096];
        memcpy(msg, buf, sizeof(msg));
        put_u32(msg, i);
        mt_err_t rc = mt_rpc_send(c, msg, sizeof(msg));
        if (rc == MT_OK) {
            atomic_fetch_add(&g.forever_sent, 1);
            continue;
        }
        if (rc == MT_CANCELLED)
            atomic_fetch_add(&g.forever_cancelled, 1);
        else
            atomic_fetch_add(&g.forever_other, 1);
        mt_rpc_fail(c, MT_RPC_CANCELLED, "stopped at %u", i);
        return;
    }
}

/* Fails UNAVAILABLE until it has been called `unavail_until` times, then echoes. */
static atomic_int unavail_until;
static atomic_int unavail_calls;

static void h_flaky(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)ud;
    int n = atomic_fetch_add(&unavail_calls, 1) + 1;
    if (n <= atomic_load(&unavail_until)) {
        mt_rpc_fail(c, MT_RPC_UNAVAILABLE, "busy, attempt %d", n);
        return;
    }
    mt_rpc_reply(c, req, len);
}

#define P_FLAKY "/mt.test.Echo/Flaky"

typedef struct server_opts {
    uint32_t threads;           /* 0: default */
    uint32_t max_message_bytes; /* 0: default */
    uint32_t grace_ms;          /* 0: default */
    uint32_t max_queued;        /* 0: default */
    const char *listen;         /* NULL: default */
    const int *tag;             /* ud of the Reverse method (prefixes its reply) */
} server_opts_t;

static mt_rpc_server_t *start_server_opts(const server_opts_t *o, int *port) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    if (o->threads) cfg.threads = o->threads;
    if (o->max_message_bytes) cfg.max_message_bytes = o->max_message_bytes;
    if (o->grace_ms) cfg.grace_ms = o->grace_ms;
    if (o->max_queued) cfg.max_queued = o->max_queued;
    if (o->listen) cfg.listen = o->listen;
    const tu_rpc_method_t m[] = {
        {P_REVERSE, 0, h_reverse, (void *)o->tag},
        {P_EMPTY, 0, h_empty, NULL},
        {P_FAIL, 0, h_fail, NULL},
        {P_NOFINISH, 0, h_nofinish, NULL},
        {P_SLEEP, 0, h_sleep, NULL},
        {P_BIG, 0, h_big, NULL},
        {P_COUNT, 1, h_count, NULL},
        {P_FAILMID, 1, h_failmid, NULL},
        {P_FOREVER, 1, h_forever, NULL},
        {P_FLAKY, 0, h_flaky, NULL},
    };
    return tu_rpc_server_start(&cfg, m, sizeof(m) / sizeof(m[0]), port);
}

static mt_rpc_server_t *start_server(int *port) {
    server_opts_t o = {0};
    return start_server_opts(&o, port);
}

/* retries: -1 keeps the default. */
static mt_rpc_channel_t *open_channel(int port, int retries, uint32_t max_message_bytes) {
    mt_rpc_client_config_t cfg;
    mt_rpc_client_config_init(&cfg);
    if (retries >= 0) cfg.retries = (uint32_t)retries;
    if (max_message_bytes) cfg.max_message_bytes = max_message_bytes;
    return tu_rpc_channel("127.0.0.1", port, &cfg);
}

/* A channel to 127.0.0.1:@p port that retries UNAVAILABLE @p retries times with this
 * backoff. */
static mt_rpc_channel_t *retrying_channel(int port, uint32_t retries, uint32_t backoff_ms,
                                          uint32_t backoff_max_ms) {
    mt_rpc_client_config_t cfg;
    mt_rpc_client_config_init(&cfg);
    cfg.retries = retries;
    cfg.backoff_ms = backoff_ms;
    cfg.backoff_max_ms = backoff_max_ms;
    return tu_rpc_channel("127.0.0.1", port, &cfg);
}

/* A unary call that must succeed with the reverse of @p req. */
static void expect_reverse(mt_rpc_channel_t *ch, const uint8_t *req, size_t len) {
    uint8_t *resp = (uint8_t *)1;
    size_t resp_len = (size_t)-1;
    mt_rpc_status_t st;
    memset(&st, 0x7f, sizeof(st));
    mt_err_t rc =
        mt_rpc_call(ch, P_REVERSE, req, len, 60000, &resp, &resp_len, &st); /* a hang guard */
    cr_assert_eq(rc, MT_OK, "rc %s", mt_err_name(rc));
    cr_assert_eq(st.code, MT_RPC_OK, "status %d '%s'", st.code, st.message);
    cr_assert_eq(resp_len, len);
    if (len == 0) {
        cr_assert_null(resp, "empty reply must give resp == NULL");
    } else {
        cr_assert_not_null(resp);
        for (size_t i = 0; i < len; i++)
            cr_assert_eq(resp[i], req[len - 1 - i], "byte %zu of %zu", i, len);
    }
    free(resp);
}

/* A unary call whose bytes we want back whatever they are; returns rc. */
static mt_err_t call(mt_rpc_channel_t *ch, const char *path, const void *req, size_t len,
                     int64_t deadline_ms, uint8_t **resp, size_t *resp_len, mt_rpc_status_t *st) {
    *resp = NULL;
    *resp_len = 0;
    memset(st, 0, sizeof(*st));
    st->code = -1;
    return mt_rpc_call(ch, path, (const uint8_t *)req, len, deadline_ms, resp, resp_len, st);
}

/* Reserves a port nobody listens on: a server binds it, then goes away. */
static int dead_port(void) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_server_shutdown(s);
    mt_rpc_server_destroy(s);
    return port;
}

/* ============================== config ============================== */

Test(rpc, config_defaults_and_validation) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cr_assert_not_null(cfg.listen);
    cr_assert_str_eq(cfg.listen, "127.0.0.1:0");
    cr_assert_eq(cfg.threads, 4);
    cr_assert_eq(cfg.max_message_bytes, 64u << 20);
    cr_assert_eq(cfg.grace_ms, 5000);
    mt_rpc_client_config_t ccfg;
    mt_rpc_client_config_init(&ccfg);
    cr_assert_eq(ccfg.max_message_bytes, 64u << 20);
    cr_assert_eq(ccfg.retries, 3);
    cr_assert_eq(ccfg.backoff_ms, 50);
    cr_assert_eq(ccfg.backoff_max_ms, 2000);

    mt_rpc_server_t *s = (mt_rpc_server_t *)1;
    cfg.threads = 0;
    cr_assert_eq(mt_rpc_server_create(&cfg, &s), MT_CONFIG);
    cfg.threads = 65;
    cr_assert_eq(mt_rpc_server_create(&cfg, &s), MT_CONFIG);
    cfg.threads = 64;
    s = NULL;
    cr_assert_eq(mt_rpc_server_create(&cfg, &s), MT_OK);
    mt_rpc_server_destroy(s); /* never started */
    mt_rpc_server_destroy(NULL);
}

Test(rpc, add_rules_and_bad_listen_address) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    mt_rpc_server_t *s = NULL;
    cr_assert_eq(mt_rpc_server_create(&cfg, &s), MT_OK);
    cr_assert_eq(mt_rpc_server_add(s, P_REVERSE, 0, h_reverse, NULL), MT_OK);
    cr_assert_eq(mt_rpc_server_add(s, P_REVERSE, 0, h_reverse, NULL), MT_INVALID,
                 "a path registered twice must be refused");
    int port = -1;
    cr_assert_eq(mt_rpc_server_start(s, &port), MT_OK);
    cr_assert_gt(port, 0);
    cr_assert_eq(mt_rpc_server_add(s, P_EMPTY, 0, h_empty, NULL), MT_INVALID,
                 "adding a method after start must be refused");
    /* The server works with its one method; the refused one is unknown. */
    mt_rpc_channel_t *ch = open_channel(port, 0, 0);
    expect_reverse(ch, (const uint8_t *)"abc", 3);
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    cr_assert_eq(call(ch, P_EMPTY, "x", 1, 5000, &resp, &rl, &st), MT_OK);
    cr_assert_eq(st.code, MT_RPC_UNIMPLEMENTED, "status %d '%s'", st.code, st.message);
    free(resp);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);

    /* A port already in use cannot be bound. */
    int busy_port;
    mt_rpc_server_t *busy = start_server(&busy_port);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", busy_port);
    cfg.listen = addr;
    mt_rpc_server_t *s2 = NULL;
    cr_assert_eq(mt_rpc_server_create(&cfg, &s2), MT_OK);
    cr_assert_eq(mt_rpc_server_add(s2, P_REVERSE, 0, h_reverse, NULL), MT_OK);
    int p2 = -1;
    mt_err_t rc = mt_rpc_server_start(s2, &p2);
    mt_rpc_server_destroy(s2);
    mt_rpc_server_destroy(busy);
    cr_assert_eq(rc, MT_IO, "binding a busy port gave %s", mt_err_name(rc));
}

Test(rpc, unresolvable_listen_address_is_io_error) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cfg.listen = "256.1.2.3:0";
    mt_rpc_server_t *s = NULL;
    cr_assert_eq(mt_rpc_server_create(&cfg, &s), MT_OK);
    cr_assert_eq(mt_rpc_server_add(s, P_REVERSE, 0, h_reverse, NULL), MT_OK);
    int port = -1;
    mt_err_t rc = mt_rpc_server_start(s, &port);
    cr_assert_eq(rc, MT_IO, "start gave %s", mt_err_name(rc));
    mt_rpc_server_shutdown(s);
    mt_rpc_server_destroy(s);
}

/* ============================== unary ============================== */

Test(rpc, unary_echo_round_trip) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    expect_reverse(ch, (const uint8_t *)"hello, world", 12);
    uint8_t bin[300];
    for (size_t i = 0; i < sizeof(bin); i++)
        bin[i] = (uint8_t)(i * 31); /* includes zeros */
    expect_reverse(ch, bin, sizeof(bin));
    expect_reverse(ch, bin, 1);
    cr_assert_eq(atomic_load(&g.calls), 3);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_shutdown(s);
    mt_rpc_server_destroy(s);
}

Test(rpc, empty_request_and_empty_reply) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    expect_reverse(ch, NULL, 0); /* empty request -> empty reply, resp NULL */
    uint8_t *resp = (uint8_t *)1;
    size_t rl = 99;
    mt_rpc_status_t st;
    cr_assert_eq(mt_rpc_call(ch, P_EMPTY, NULL, 0, 5000, &resp, &rl, &st), MT_OK);
    cr_assert_eq(st.code, MT_RPC_OK, "status %d '%s'", st.code, st.message);
    cr_assert_null(resp);
    cr_assert_eq(rl, 0);
    cr_assert_eq(atomic_load(&g.empty_len_bad), 0, "handler saw a non-empty request");
    /* A non-empty request whose handler replies nothing (Big with size 0). */
    uint8_t zero[4] = {0, 0, 0, 0};
    cr_assert_eq(call(ch, P_BIG, zero, 4, 5000, &resp, &rl, &st), MT_OK);
    cr_assert_eq(st.code, MT_RPC_OK, "status %d '%s'", st.code, st.message);
    cr_assert_null(resp);
    cr_assert_eq(rl, 0);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* Not under ThreadSanitizer (it runs in the release and ASan builds): a size test with no
 * concurrency of its own, where a 10 MiB message through uninstrumented gRPC did not finish
 * in 5 minutes. */
Test(rpc, ten_mib_message_within_limits, MT_NOT_UNDER_TSAN) {
    int port;
    mt_rpc_server_t *s = start_server(&port); /* default limit 64 MiB */
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    size_t n = 10u << 20;
    uint8_t *big = malloc(n);
    uint64_t x = 12345;
    for (size_t i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        big[i] = (uint8_t)(x >> 56);
    }
    expect_reverse(ch, big, n);
    /* And a 10 MiB reply to a small request. */
    uint8_t req[4];
    put_u32(req, (uint32_t)n);
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    cr_assert_eq(call(ch, P_BIG, req, 4, 20000, &resp, &rl, &st), MT_OK);
    cr_assert_eq(st.code, MT_RPC_OK, "status %d '%s'", st.code, st.message);
    cr_assert_eq(rl, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(resp[i], (uint8_t)(i * 7 + 3), "byte %zu", i);
    free(resp);
    free(big);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

Test(rpc, many_sequential_calls) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    int n = 2000 / SCALE_DIV;
    uint8_t buf[64];
    for (int i = 0; i < n; i++) {
        size_t len = (size_t)(i % 64);
        for (size_t k = 0; k < len; k++)
            buf[k] = (uint8_t)(i + k * 3);
        expect_reverse(ch, buf, len);
    }
    cr_assert_eq(atomic_load(&g.calls), n);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* ============================== errors ============================== */

Test(rpc, handler_fail_code_and_message_reach_client) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    uint8_t *resp = (uint8_t *)1;
    size_t rl;
    mt_rpc_status_t st;
    cr_assert_eq(call(ch, P_FAIL, "abcdefg", 7, 5000, &resp, &rl, &st), MT_OK);
    cr_assert_eq(st.code, MT_RPC_INVALID_ARGUMENT, "status %d '%s'", st.code, st.message);
    cr_assert_str_eq(st.message, "bad input: 7 bytes, want 42");
    cr_assert_null(resp, "no reply bytes on an error");
    /* Still serving. */
    expect_reverse(ch, (const uint8_t *)"ok", 2);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

Test(rpc, handler_without_finish_answers_internal) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    for (int i = 0; i < 3; i++) { /* the worker must be reusable after it */
        cr_assert_eq(call(ch, P_NOFINISH, "x", 1, 5000, &resp, &rl, &st), MT_OK);
        cr_assert_eq(st.code, MT_RPC_INTERNAL, "status %d '%s'", st.code, st.message);
        free(resp);
    }
    expect_reverse(ch, (const uint8_t *)"ok", 2);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

Test(rpc, unknown_method_is_unimplemented_not_a_deadline) {
    int port;
    server_opts_t o = {.threads = 1};
    mt_rpc_server_t *s = start_server_opts(&o, &port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    /* More unknown calls than workers and posted slots: each must be answered. Deadline 20 s:
     * a server that leaves them hanging shows up as MT_TIMEOUT / DEADLINE_EXCEEDED. */
    for (int i = 0; i < 10; i++) {
        mt_err_t rc = call(ch, "/mt.test.Nope/Missing", "x", 1, 20000, &resp, &rl, &st);
        cr_assert_eq(rc, MT_OK, "call %d: rc %s", i, mt_err_name(rc));
        cr_assert_eq(st.code, MT_RPC_UNIMPLEMENTED, "call %d: status %d '%s'", i, st.code,
                     st.message);
        cr_assert_null(resp);
    }
    /* Many at once, more than the one worker keeps posted. */
    enum { N = 16 };
    mt_rpc_batch_call_t bc[N];
    memset(bc, 0, sizeof(bc));
    for (int i = 0; i < N; i++) {
        bc[i].ch = ch;
        bc[i].path = i % 2 ? "/mt.test.Nope/Missing" : "/other.Svc/Gone";
        bc[i].req = (const uint8_t *)"y";
        bc[i].len = 1;
    }
    cr_assert_eq(mt_rpc_call_many(bc, N, 20000), MT_OK);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(bc[i].st.code, MT_RPC_UNIMPLEMENTED, "batch call %d: %d '%s'", i,
                     bc[i].st.code, bc[i].st.message);
        cr_assert_null(bc[i].resp);
    }
    cr_assert_eq(atomic_load(&g.calls), 0, "no handler may run for an unknown path");
    expect_reverse(ch, (const uint8_t *)"ok", 2);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* ============================== limits ============================== */

Test(rpc, request_over_server_limit_is_resource_exhausted) {
    int port;
    server_opts_t o = {.threads = 2, .max_message_bytes = 1u << 20};
    mt_rpc_server_t *s = start_server_opts(&o, &port);
    mt_rpc_channel_t *ch = open_channel(port, 0, 0);
    size_t n = 2u << 20;
    uint8_t *big = calloc(1, n);
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    for (int i = 0; i < 3; i++) { /* more than once: no slot is lost to it */
        mt_err_t rc = call(ch, P_REVERSE, big, n, 60000, &resp, &rl, &st);
        cr_assert_eq(rc, MT_OK, "rc %s", mt_err_name(rc));
        cr_assert_eq(st.code, MT_RPC_RESOURCE_EXHAUSTED, "status %d '%s'", st.code, st.message);
        cr_assert_null(resp);
        free(resp);
    }
    cr_assert_eq(atomic_load(&g.calls), 0, "the handler must not see an oversized request");
    /* Still serving, including a request just under the limit. */
    expect_reverse(ch, (const uint8_t *)"still here", 10);
    expect_reverse(ch, big, (1u << 20) - 64);
    free(big);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

Test(rpc, reply_over_a_limit_fails_and_server_keeps_serving) {
    int port;
    server_opts_t o = {.threads = 2, .max_message_bytes = 1u << 20};
    mt_rpc_server_t *s = start_server_opts(&o, &port);
    uint8_t req[4];
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;

    /* The server's send limit: a 2 MiB reply must not go out. */
    mt_rpc_channel_t *ch = open_channel(port, 0, 0);
    put_u32(req, 2u << 20);
    mt_err_t rc = call(ch, P_BIG, req, 4, 60000, &resp, &rl, &st);
    cr_assert(rc != MT_OK || st.code != MT_RPC_OK, "a reply over the server's limit went out");
    free(resp);
    expect_reverse(ch, (const uint8_t *)"after", 5);

    /* The client's receive limit: 512 KiB accepted, 600 KiB refused. */
    mt_rpc_channel_t *small = open_channel(port, 0, 512u << 10);
    put_u32(req, 512u << 10);
    cr_assert_eq(call(small, P_BIG, req, 4, 60000, &resp, &rl, &st), MT_OK);
    cr_assert_eq(st.code, MT_RPC_OK, "status %d '%s'", st.code, st.message);
    cr_assert_eq(rl, 512u << 10);
    free(resp);
    put_u32(req, 600u << 10);
    rc = call(small, P_BIG, req, 4, 60000, &resp, &rl, &st);
    cr_assert_eq(rc, MT_OK, "rc %s", mt_err_name(rc));
    cr_assert_eq(st.code, MT_RPC_RESOURCE_EXHAUSTED, "status %d '%s'", st.code, st.message);
    cr_assert_null(resp);
    expect_reverse(small, (const uint8_t *)"after", 5);
    mt_rpc_channel_destroy(small);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* ============================== deadlines ============================== */

/* The wall clock's offset from the monotonic one, in ms: it changes when the system's
 * realtime clock is stepped (NTP, a VM resumed). gRPC converts between its clocks with
 * offsets it takes at its start, so a step after that moves the remaining time a handler
 * sees. */
static long long realtime_offset_ms(void) {
    struct timespec r, m;
    clock_gettime(CLOCK_REALTIME, &r);
    clock_gettime(CLOCK_MONOTONIC, &m);
    return ((long long)r.tv_sec - m.tv_sec) * 1000 + (r.tv_nsec - m.tv_nsec) / 1000000;
}

Test(rpc, deadline_passes_while_handler_sleeps) {
    long long off0 = realtime_offset_ms(); /* before gRPC starts in this process */
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    /* Warm the connection so that the deadline is spent in the handler. */
    expect_reverse(ch, (const uint8_t *)"warm", 4);
    uint8_t req[4];
    put_u32(req, 1500);
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    mt_err_t rc = call(ch, P_SLEEP, req, 4, 300, &resp, &rl, &st);
    cr_assert(rc == MT_TIMEOUT || (rc == MT_OK && st.code == MT_RPC_DEADLINE_EXCEEDED),
              "rc %s, status %d '%s'", mt_err_name(rc), st.code, st.message);
    cr_assert_null(resp);
    cr_assert(tu_wait_for(&g.sleep_started, 1, 60000));
    /* The client's 300 ms, not the 60 s of the call below nor none. Not exactly 300: gRPC
     * sends the timeout rounded up to whole units, the handler's clock conversion (realtime
     * to monotonic) is exact to about a millisecond (301 seen under ASan), and 359 was seen
     * under TSan on a machine with two busy loops, the realtime clock steady (our reading,
     * not verified in gRPC: the client computes the timeout it sends from an exec context's
     * cached clock, which lags the real time while that context runs). 899 was seen once under TSan on a
     * loaded VM with the realtime clock stepped: a step since the test began widens the
     * bound by the step, measured. */
    long long rem = atomic_load(&g.remaining_ms);
    long long step = llabs(realtime_offset_ms() - off0);
    if (step > 5) cr_log_info("the realtime clock stepped by %lld ms during the call", step);
    if (rem > 320) cr_log_info("remaining_ms in the handler: %lld for a 300 ms deadline", rem);
    cr_assert(rem > 0 && rem <= 300 + 1000 + step,
              "remaining_ms in the handler: %lld (clock step %lld ms)", rem, step);
    /* The late reply of the handler is harmless; the server still serves. */
    cr_assert(tu_wait_for(&g.sleep_done, 1, 60000));
    expect_reverse(ch, (const uint8_t *)"after", 5);
    /* A generous deadline: the handler sees it, the call succeeds. */
    put_u32(req, 0);
    cr_assert_eq(call(ch, P_SLEEP, req, 4, 60000, &resp, &rl, &st), MT_OK);
    cr_assert_eq(st.code, MT_RPC_OK);
    cr_assert_eq(rl, 5);
    cr_assert_eq(memcmp(resp, "slept", 5), 0);
    free(resp);
    /* gRPC sends the timeout rounded up to its wire units (100 ms steps at a minute), so
     * the server's deadline may be a little later than the client's. */
    rem = atomic_load(&g.remaining_ms);
    cr_assert(rem > 300 && rem <= 60000 + 1000, "remaining_ms in the handler: %lld", rem);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* ============================== streaming ============================== */

static void expect_count_stream(mt_rpc_channel_t *ch, uint32_t n) {
    uint8_t req[4];
    put_u32(req, n);
    mt_rpc_stream_t *st = NULL;
    cr_assert_eq(mt_rpc_stream_open(ch, P_COUNT, req, 4, 20000, &st), MT_OK);
    cr_assert_not_null(st);
    uint8_t want[32];
    for (uint32_t i = 0; i < n; i++) {
        uint8_t *buf = NULL;
        size_t len = 0;
        mt_err_t rc = mt_rpc_stream_next(st, &buf, &len);
        cr_assert_eq(rc, MT_OK, "message %u of %u: %s", i, n, mt_err_name(rc));
        size_t wl = count_msg(want, i);
        cr_assert_eq(len, wl, "message %u: %zu bytes", i, len);
        cr_assert_eq(memcmp(buf, want, wl), 0, "message %u out of order or corrupt", i);
        free(buf);
    }
    uint8_t *buf = (uint8_t *)1;
    size_t len = 7;
    mt_err_t rc = mt_rpc_stream_next(st, &buf, &len);
    cr_assert_eq(rc, MT_NOT_FOUND, "after %u messages: %s", n, mt_err_name(rc));
    mt_rpc_status_t status;
    memset(&status, 0, sizeof(status));
    status.code = -1;
    mt_rpc_stream_close(st, &status);
    cr_assert_eq(status.code, MT_RPC_OK, "n=%u: status %d '%s'", n, status.code, status.message);
}

Test(rpc, stream_exactly_n_messages_in_order) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    expect_count_stream(ch, 0);
    expect_count_stream(ch, 1);
    expect_count_stream(ch, 1000);
    expect_count_stream(ch, 2);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

Test(rpc, stream_failing_midway_gives_messages_then_status) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    mt_rpc_stream_t *st = NULL;
    cr_assert_eq(mt_rpc_stream_open(ch, P_FAILMID, NULL, 0, 10000, &st), MT_OK);
    uint8_t want[32];
    for (uint32_t i = 0; i < 5; i++) {
        uint8_t *buf = NULL;
        size_t len = 0;
        mt_err_t rc = mt_rpc_stream_next(st, &buf, &len);
        cr_assert_eq(rc, MT_OK, "message %u: %s", i, mt_err_name(rc));
        size_t wl = count_msg(want, i);
        cr_assert_eq(len, wl);
        cr_assert_eq(memcmp(buf, want, wl), 0);
        free(buf);
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    mt_err_t rc = mt_rpc_stream_next(st, &buf, &len);
    cr_assert(rc == MT_NOT_FOUND || rc == MT_CANCELLED, "after the failure: %s", mt_err_name(rc));
    mt_rpc_status_t status;
    mt_rpc_stream_close(st, &status);
    cr_assert_eq(status.code, MT_RPC_ABORTED, "status %d '%s'", status.code, status.message);
    cr_assert_str_eq(status.message, "stopped after 5 messages");
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

Test(rpc, stream_closed_early_by_client_cancels_handler_sends) {
    int port;
    server_opts_t o = {.threads = 2};
    mt_rpc_server_t *s = start_server_opts(&o, &port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    mt_rpc_stream_t *st = NULL;
    cr_assert_eq(mt_rpc_stream_open(ch, P_FOREVER, NULL, 0, 30000, &st), MT_OK);
    for (uint32_t i = 0; i < 3; i++) {
        uint8_t *buf = NULL;
        size_t len = 0;
        cr_assert_eq(mt_rpc_stream_next(st, &buf, &len), MT_OK);
        cr_assert_eq(len, 4096);
        cr_assert_eq(get_u32(buf), i);
        free(buf);
    }
    mt_rpc_status_t status;
    mt_rpc_stream_close(st, &status);
    cr_assert_eq(status.code, MT_RPC_CANCELLED, "status %d '%s'", status.code, status.message);
    /* The handler's next send (at the latest once flow control blocks it) must say so. */
    cr_assert(tu_wait_for(&g.forever_cancelled, 1, 60000),
              "mt_rpc_send never returned MT_CANCELLED (sent %ld, other %d, gave up %d)",
              atomic_load(&g.forever_sent), atomic_load(&g.forever_other),
              atomic_load(&g.forever_gave_up));
    cr_assert_eq(atomic_load(&g.forever_other), 0);
    /* The server stays healthy: unary and streaming calls, on both workers. */
    expect_reverse(ch, (const uint8_t *)"healthy", 7);
    expect_count_stream(ch, 10);
    expect_count_stream(ch, 10);
    /* Once more with a stream that was never read from. */
    cr_assert_eq(mt_rpc_stream_open(ch, P_FOREVER, NULL, 0, 30000, &st), MT_OK);
    cr_assert(tu_wait_for(&g.forever_started, 2, 60000));
    mt_rpc_stream_close(st, &status);
    cr_assert_neq(status.code, MT_RPC_OK);
    cr_assert(tu_wait_for(&g.forever_cancelled, 2, 60000), "second handler was not cancelled");
    expect_reverse(ch, (const uint8_t *)"healthy", 7);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* The stream's deadline ends it on both sides: the client sees DEADLINE_EXCEEDED, and a
 * handler that runs is told (its next send returns MT_CANCELLED). On a loaded machine the
 * deadline can pass before the server hands the call to a handler at all: then no handler
 * ran, and the test tries again with a deadline four times as long (4 attempts at most,
 * from 300 ms; the attempt that proved it is in the log). */
Test(rpc, stream_deadline_cancels_handler) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    uint32_t deadline_ms = 300;
    int attempt = 1;
    for (;; attempt++, deadline_ms *= 4) {
        int started0 = atomic_load(&g.forever_started);
        int cancelled0 = atomic_load(&g.forever_cancelled);
        mt_rpc_stream_t *st = NULL;
        cr_assert_eq(mt_rpc_stream_open(ch, P_FOREVER, NULL, 0, deadline_ms, &st), MT_OK);
        /* Read until the stream breaks; a slow reader, so flow control holds the handler. */
        int got = 0;
        mt_err_t rc;
        for (;;) {
            uint8_t *buf = NULL;
            size_t len = 0;
            rc = mt_rpc_stream_next(st, &buf, &len);
            if (rc != MT_OK) break;
            free(buf);
            got++;
            cr_assert_lt(got, 1000000, "the stream outlived its deadline");
            if (got % 64 == 0) tu_sleep_ms(20);
        }
        cr_assert(rc == MT_CANCELLED || rc == MT_NOT_FOUND, "rc %s", mt_err_name(rc));
        mt_rpc_status_t status;
        mt_rpc_stream_close(st, &status);
        cr_assert_eq(status.code, MT_RPC_DEADLINE_EXCEEDED, "status %d '%s'", status.code,
                     status.message);
        if (got > 0 || atomic_load(&g.forever_started) > started0) {
            /* a handler ran (it sent what was read): it must hear of the deadline */
            cr_assert(tu_wait_for(&g.forever_cancelled, cancelled0 + 1, 60000),
                      "handler not told of the deadline (attempt %d, %u ms: sent %ld, other %d, "
                      "gave up %d)",
                      attempt, deadline_ms, atomic_load(&g.forever_sent),
                      atomic_load(&g.forever_other), atomic_load(&g.forever_gave_up));
            cr_assert_eq(atomic_load(&g.forever_other), 0);
            cr_assert_eq(atomic_load(&g.forever_gave_up), 0);
            break;
        }
        cr_assert_lt(attempt, 4, "no handler started before a deadline of %u ms", deadline_ms);
    }
    cr_log_info("deadline seen by the handler at attempt %d (%u ms)", attempt, deadline_ms);
    expect_reverse(ch, (const uint8_t *)"ok", 2);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

Test(rpc, stream_to_unknown_method) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    mt_rpc_stream_t *st = NULL;
    cr_assert_eq(mt_rpc_stream_open(ch, "/mt.test.Nope/Stream", NULL, 0, 20000, &st), MT_OK);
    uint8_t *buf = NULL;
    size_t len = 0;
    mt_err_t rc = mt_rpc_stream_next(st, &buf, &len);
    cr_assert(rc == MT_NOT_FOUND || rc == MT_CANCELLED, "rc %s", mt_err_name(rc));
    mt_rpc_status_t status;
    mt_rpc_stream_close(st, &status);
    cr_assert_eq(status.code, MT_RPC_UNIMPLEMENTED, "status %d '%s'", status.code, status.message);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* ============================== parallel ============================== */

Test(rpc, call_many_across_two_servers) {
    static const int tags[2] = {0xA1, 0xB2};
    int ports[2];
    mt_rpc_server_t *srv[2];
    mt_rpc_channel_t *ch[2];
    for (int k = 0; k < 2; k++) {
        /* 32 calls arrive at each server at once: room to queue them all (the bound itself,
         * which refuses the calls beyond it, is test_rpc_security's) */
        server_opts_t o = {.threads = 2, .max_queued = 64, .tag = &tags[k]};
        srv[k] = start_server_opts(&o, &ports[k]);
        ch[k] = open_channel(ports[k], -1, 0);
    }
    enum { N = 64 };
    mt_rpc_batch_call_t calls[N];
    char reqs[N][48];
    for (int i = 0; i < N; i++) {
        int len = snprintf(reqs[i], sizeof(reqs[i]), "request number %d to %d", i, i % 2);
        memset(&calls[i], 0, sizeof(calls[i]));
        calls[i].ch = ch[(i * 7 / 3) % 2];
        calls[i].path = P_REVERSE;
        calls[i].req = (const uint8_t *)reqs[i];
        calls[i].len = (size_t)len;
        calls[i].st.code = -1;
    }
    /* One call to a failing method: it fails alone, the others are unaffected. */
    calls[17].path = P_FAIL;
    cr_assert_eq(mt_rpc_call_many(calls, N, 20000), MT_OK);
    for (int i = 0; i < N; i++) {
        if (i == 17) {
            cr_assert_eq(calls[i].st.code, MT_RPC_INVALID_ARGUMENT);
            free(calls[i].resp);
            continue;
        }
        int k = calls[i].ch == ch[0] ? 0 : 1;
        cr_assert_eq(calls[i].st.code, MT_RPC_OK, "call %d: status %d '%s'", i, calls[i].st.code,
                     calls[i].st.message);
        cr_assert_eq(calls[i].resp_len, calls[i].len + 1, "call %d", i);
        cr_assert_eq(calls[i].resp[0], (uint8_t)tags[k], "call %d answered by the wrong server", i);
        for (size_t b = 0; b < calls[i].len; b++)
            cr_assert_eq(calls[i].resp[1 + b], calls[i].req[calls[i].len - 1 - b],
                         "call %d got another call's answer", i);
        free(calls[i].resp);
    }
    cr_assert_eq(atomic_load(&g.calls), N);
    cr_assert_eq(mt_rpc_call_many(calls, 0, 1000), MT_OK); /* an empty batch */
    for (int k = 0; k < 2; k++) {
        mt_rpc_channel_destroy(ch[k]);
        mt_rpc_server_destroy(srv[k]);
    }
}

/* What mt_rpc_call_many_overlap's callback saw. */
typedef struct overlap_seen {
    int calls;
    int handlers_started; /* g.sleep_started when it ran */
    int handlers_done;    /* g.sleep_done when it ran */
} overlap_seen_t;

static void overlap_cb(void *ud) {
    overlap_seen_t *o = ud;
    o->calls++;
    /* the calls are on their way: wait until a handler runs them, which shows that the
     * requests were sent before the callback and that the batch waits after it */
    int64_t end = tu_now_ms() + 10000;
    while (atomic_load(&g.sleep_started) < 2 && tu_now_ms() < end)
        tu_sleep_ms(2);
    o->handlers_started = atomic_load(&g.sleep_started);
    o->handlers_done = atomic_load(&g.sleep_done);
}

/* The callback runs once, while the calls are in flight (sent, not answered: the handlers
 * sleep 300 ms), and also for an empty batch. */
Test(rpc, call_many_overlap_runs_its_work_while_the_calls_fly) {
    int port;
    server_opts_t o = {.threads = 2, .max_queued = 8};
    mt_rpc_server_t *srv = start_server_opts(&o, &port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    uint8_t req[4];
    put_u32(req, 300);
    mt_rpc_batch_call_t calls[2];
    for (int i = 0; i < 2; i++)
        calls[i] = (mt_rpc_batch_call_t){.ch = ch, .path = P_SLEEP, .req = req, .len = 4};
    overlap_seen_t seen = {0};
    cr_assert_eq(mt_rpc_call_many_overlap(calls, 2, 20000, overlap_cb, &seen), MT_OK);
    cr_assert_eq(seen.calls, 1);
    cr_assert_eq(seen.handlers_started, 2, "the requests were not sent before the callback");
    cr_assert_eq(seen.handlers_done, 0, "the callback ran after the answers");
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(calls[i].st.code, MT_RPC_OK);
        cr_assert_eq(calls[i].resp_len, 5);
        free(calls[i].resp);
    }
    overlap_seen_t none = {0};
    cr_assert_eq(mt_rpc_call_many_overlap(calls, 0, 1000, overlap_cb, &none), MT_OK);
    cr_assert_eq(none.calls, 1, "an empty batch runs the work too");
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(srv);
}

typedef struct worker_arg {
    mt_rpc_channel_t *ch;
    int id;
    int calls;
    int bad; /* out */
} worker_arg_t;

static void *client_thread(void *p) {
    worker_arg_t *a = p;
    uint64_t x = (uint64_t)a->id * 0x9E3779B97F4A7C15ull + 1;
    uint8_t req[1024];
    for (int i = 0; i < a->calls; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        size_t len = 8 + (size_t)(x >> 40) % (sizeof(req) - 8);
        put_u32(req, (uint32_t)a->id);
        put_u32(req + 4, (uint32_t)i);
        for (size_t k = 8; k < len; k++)
            req[k] = (uint8_t)(x >> (k % 56));
        uint8_t *resp = NULL;
        size_t rl = 0;
        mt_rpc_status_t st;
        mt_err_t rc = mt_rpc_call(a->ch, P_REVERSE, req, len, 20000, &resp, &rl, &st);
        int ok = rc == MT_OK && st.code == MT_RPC_OK && rl == len && resp;
        for (size_t k = 0; ok && k < len; k++)
            ok = resp[k] == req[len - 1 - k];
        if (!ok) a->bad++;
        free(resp);
    }
    return NULL;
}

Test(rpc, eight_threads_share_one_channel) {
    int port;
    server_opts_t o = {.threads = 4};
    mt_rpc_server_t *s = start_server_opts(&o, &port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    enum { T = 8 };
    pthread_t th[T];
    worker_arg_t args[T];
    int per = 200 / SCALE_DIV;
    for (int t = 0; t < T; t++) {
        args[t] = (worker_arg_t){.ch = ch, .id = t, .calls = per};
        cr_assert_eq(pthread_create(&th[t], NULL, client_thread, &args[t]), 0);
    }
    int bad = 0;
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        bad += args[t].bad;
    }
    cr_assert_eq(bad, 0, "%d of %d calls wrong", bad, T * per);
    cr_assert_eq(atomic_load(&g.calls), T * per);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

static void *stream_thread(void *p) {
    worker_arg_t *a = p;
    for (int k = 0; k < a->calls; k++) {
        uint32_t n = (uint32_t)(a->id * 37 + k * 11) % 200;
        uint8_t req[4];
        put_u32(req, n);
        mt_rpc_stream_t *st = NULL;
        if (mt_rpc_stream_open(a->ch, P_COUNT, req, 4, 20000, &st) != MT_OK) {
            a->bad++;
            continue;
        }
        uint32_t got = 0;
        uint8_t want[32];
        uint8_t *buf;
        size_t len;
        mt_err_t rc;
        while ((rc = mt_rpc_stream_next(st, &buf, &len)) == MT_OK) {
            size_t wl = count_msg(want, got);
            if (len != wl || memcmp(buf, want, wl) != 0) a->bad++;
            free(buf);
            got++;
        }
        mt_rpc_status_t status;
        mt_rpc_stream_close(st, &status);
        if (rc != MT_NOT_FOUND || got != n || status.code != MT_RPC_OK) a->bad++;
    }
    return NULL;
}

Test(rpc, streams_and_unary_calls_from_several_threads) {
    int port;
    server_opts_t o = {.threads = 4};
    mt_rpc_server_t *s = start_server_opts(&o, &port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    enum { T = 6 };
    pthread_t th[T];
    worker_arg_t args[T];
    for (int t = 0; t < T; t++) {
        args[t] = (worker_arg_t){.ch = ch, .id = t, .calls = t % 2 ? 100 / SCALE_DIV : 20};
        cr_assert_eq(pthread_create(&th[t], NULL, t % 2 ? client_thread : stream_thread, &args[t]),
                     0);
    }
    int bad = 0;
    for (int t = 0; t < T; t++) {
        pthread_join(th[t], NULL);
        bad += args[t].bad;
    }
    cr_assert_eq(bad, 0, "%d wrong calls or streams", bad);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* ============================== health ============================== */

static int health_status(mt_rpc_channel_t *ch, uint8_t raw[2]) {
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    cr_assert_eq(call(ch, P_HEALTH, NULL, 0, 5000, &resp, &rl, &st), MT_OK);
    cr_assert_eq(st.code, MT_RPC_OK, "status %d '%s'", st.code, st.message);
    cr_assert_eq(rl, 2, "health reply of %zu bytes", rl);
    memcpy(raw, resp, 2);
    Grpc__Health__V1__HealthCheckResponse *r =
        grpc__health__v1__health_check_response__unpack(NULL, rl, resp);
    cr_assert_not_null(r);
    int status = (int)r->status;
    grpc__health__v1__health_check_response__free_unpacked(r, NULL);
    free(resp);
    return status;
}

Test(rpc, health_check_serving_and_not_serving) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    uint8_t raw[2];
    cr_assert_eq(health_status(ch, raw),
                 GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    cr_assert(raw[0] == 0x08 && raw[1] == 0x01, "bytes %02x %02x", raw[0], raw[1]);
    mt_rpc_server_set_serving(s, 0);
    cr_assert_eq(health_status(ch, raw),
                 GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING);
    cr_assert(raw[0] == 0x08 && raw[1] == 0x02, "bytes %02x %02x", raw[0], raw[1]);
    /* NOT_SERVING is a health answer only: other methods still work. */
    expect_reverse(ch, (const uint8_t *)"abc", 3);
    mt_rpc_server_set_serving(s, 1);
    cr_assert_eq(health_status(ch, raw),
                 GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING);
    /* A request naming the whole server ("" service, encoded explicitly) is fine too. */
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)"";
    uint8_t rb[16];
    size_t rbl = grpc__health__v1__health_check_request__pack(&req, rb);
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    cr_assert_eq(call(ch, P_HEALTH, rb, rbl, 5000, &resp, &rl, &st), MT_OK);
    cr_assert_eq(st.code, MT_RPC_OK);
    cr_assert_eq(rl, 2);
    cr_assert(resp[0] == 0x08 && resp[1] == 0x01);
    free(resp);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* The client's check (mt_rpc_serving): what load balancers and our tools wait for. */
Test(rpc, serving_check) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    cr_assert_eq(mt_rpc_serving(ch, 5000), 1);
    mt_rpc_server_set_serving(s, 0);
    cr_assert_eq(mt_rpc_serving(ch, 5000), 0);
    mt_rpc_server_set_serving(s, 1);
    cr_assert_eq(mt_rpc_serving(ch, 5000), 1);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
    /* nobody listening: 0 within the deadline */
    mt_rpc_channel_t *dead = retrying_channel(dead_port(), 3, 20, 100);
    cr_assert_eq(mt_rpc_serving(dead, 2000), 0);
    mt_rpc_channel_destroy(dead);
}

static int health_for(mt_rpc_channel_t *ch, const char *service, uint8_t *out) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    uint8_t rb[64];
    size_t rbl = grpc__health__v1__health_check_request__pack(&req, rb);
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    cr_assert_eq(call(ch, P_HEALTH, rb, rbl, 5000, &resp, &rl, &st), MT_OK);
    if (st.code == MT_RPC_OK) {
        cr_assert_eq(rl, 2, "health reply of %zu bytes", rl);
        memcpy(out, resp, 2);
    }
    free(resp);
    return st.code;
}

Test(rpc, health_check_by_service_name) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, -1, 0);
    uint8_t raw[2] = {0, 0};
    /* A service the server registered answers like the whole server. */
    cr_assert_eq(health_for(ch, "mt.test.Echo", raw), MT_RPC_OK);
    cr_assert(raw[0] == 0x08 && raw[1] == 0x01, "bytes %02x %02x", raw[0], raw[1]);
    mt_rpc_server_set_serving(s, 0);
    cr_assert_eq(health_for(ch, "mt.test.Stream", raw), MT_RPC_OK);
    cr_assert(raw[0] == 0x08 && raw[1] == 0x02, "bytes %02x %02x", raw[0], raw[1]);
    /* An unknown service is NOT_FOUND (the health protocol's rule). */
    cr_assert_eq(health_for(ch, "no.Such", raw), MT_RPC_NOT_FOUND);
    cr_assert_eq(health_for(ch, "mt.test", raw), MT_RPC_NOT_FOUND);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* ============================== retries ============================== */

Test(rpc, nobody_listening_is_unavailable_within_deadline) {
    int port = dead_port();
    mt_rpc_channel_t *ch = retrying_channel(port, 3, 20, 100);
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    /* No clock bound (a loaded machine may stretch any): the status is the proof. Every
     * attempt carries the call's own deadline, so an attempt still waiting when it passes
     * ends DEADLINE_EXCEEDED (MT_TIMEOUT), and no backoff follows the last attempt; an
     * UNAVAILABLE result therefore means the 4 attempts all failed before the deadline,
     * rather than the call waiting for one. That retries stop at the deadline is counted
     * in server_unavailable_is_retried_exactly_retries_times. */
    mt_err_t rc = call(ch, P_REVERSE, "x", 1, 5000, &resp, &rl, &st);
    cr_assert(rc == MT_UNAVAILABLE || (rc == MT_OK && st.code == MT_RPC_UNAVAILABLE),
              "rc %s status %d '%s'", mt_err_name(rc), st.code, st.message);
    cr_assert_null(resp);
    /* The batch form reports the same per call. */
    mt_rpc_batch_call_t bc[2];
    memset(bc, 0, sizeof(bc));
    for (int i = 0; i < 2; i++) {
        bc[i].ch = ch;
        bc[i].path = P_REVERSE;
        bc[i].req = (const uint8_t *)"y";
        bc[i].len = 1;
    }
    mt_err_t brc = mt_rpc_call_many(bc, 2, 5000);
    cr_assert(brc == MT_OK || brc == MT_UNAVAILABLE, "batch rc %s", mt_err_name(brc));
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(bc[i].st.code, MT_RPC_UNAVAILABLE, "batch call %d: %d '%s'", i, bc[i].st.code,
                     bc[i].st.message);
        cr_assert_null(bc[i].resp);
    }
    /* A stream reports it at its end. */
    mt_rpc_stream_t *sst = NULL;
    rc = mt_rpc_stream_open(ch, P_COUNT, NULL, 0, 5000, &sst);
    if (rc == MT_OK) {
        uint8_t *buf = NULL;
        size_t len = 0;
        cr_assert_neq(mt_rpc_stream_next(sst, &buf, &len), MT_OK);
        mt_rpc_status_t sstat;
        mt_rpc_stream_close(sst, &sstat);
        cr_assert_eq(sstat.code, MT_RPC_UNAVAILABLE, "stream: %d '%s'", sstat.code, sstat.message);
    } else {
        cr_assert_eq(rc, MT_UNAVAILABLE, "stream open: %s", mt_err_name(rc));
    }
    mt_rpc_channel_destroy(ch);
}

Test(rpc, server_unavailable_is_retried_exactly_retries_times) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = retrying_channel(port, 3, 10, 40);
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;

    /* Always UNAVAILABLE: 1 attempt + 3 retries, the last server message reported. */
    atomic_store(&unavail_until, 1000);
    mt_err_t rc = call(ch, P_FLAKY, "ab", 2, 60000, &resp, &rl, &st);
    cr_assert(rc == MT_UNAVAILABLE || (rc == MT_OK && st.code == MT_RPC_UNAVAILABLE),
              "rc %s status %d", mt_err_name(rc), st.code);
    cr_assert_eq(st.code, MT_RPC_UNAVAILABLE);
    cr_assert_eq(atomic_load(&unavail_calls), 4, "attempts: %d", atomic_load(&unavail_calls));
    cr_assert_str_eq(st.message, "busy, attempt 4");
    cr_assert_null(resp);

    /* UNAVAILABLE twice, then an answer: the third attempt succeeds. */
    atomic_store(&unavail_calls, 0);
    atomic_store(&unavail_until, 2);
    rc = call(ch, P_FLAKY, "ab", 2, 60000, &resp, &rl, &st);
    cr_assert_eq(rc, MT_OK, "rc %s", mt_err_name(rc));
    cr_assert_eq(st.code, MT_RPC_OK, "status %d '%s'", st.code, st.message);
    cr_assert_eq(rl, 2);
    cr_assert_eq(memcmp(resp, "ab", 2), 0);
    free(resp);
    cr_assert_eq(atomic_load(&unavail_calls), 3);

    /* Other errors are not retried. */
    int before = atomic_load(&g.calls);
    cr_assert_eq(call(ch, P_FAIL, "x", 1, 60000, &resp, &rl, &st), MT_OK);
    cr_assert_eq(st.code, MT_RPC_INVALID_ARGUMENT);
    cr_assert_eq(atomic_load(&g.calls), before + 1, "INVALID_ARGUMENT was retried");

    /* In a batch, only the failing calls are retried. */
    atomic_store(&unavail_calls, 0);
    atomic_store(&unavail_until, 1);
    mt_rpc_batch_call_t bc[3];
    memset(bc, 0, sizeof(bc));
    const char *paths[3] = {P_REVERSE, P_FLAKY, P_REVERSE};
    for (int i = 0; i < 3; i++) {
        bc[i].ch = ch;
        bc[i].path = paths[i];
        bc[i].req = (const uint8_t *)"xyz";
        bc[i].len = 3;
    }
    before = atomic_load(&g.calls);
    cr_assert_eq(mt_rpc_call_many(bc, 3, 10000), MT_OK);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(bc[i].st.code, MT_RPC_OK, "call %d: %d '%s'", i, bc[i].st.code,
                     bc[i].st.message);
        cr_assert_eq(bc[i].resp_len, 3);
        cr_assert_eq(memcmp(bc[i].resp, i == 1 ? "xyz" : "zyx", 3), 0, "call %d", i);
        free(bc[i].resp);
    }
    cr_assert_eq(atomic_load(&unavail_calls), 2);
    cr_assert_eq(atomic_load(&g.calls), before + 2, "a successful call was sent again");

    /* The deadline ends the retries, counted rather than timed: 1000 retries 20 ms apart
     * would back off for 20 s at least, a 1 s deadline stops them long before. A call
     * that ignored its deadline makes all 1001 attempts, however fast or slow the machine;
     * the last one ends UNAVAILABLE, or DEADLINE_EXCEEDED if the deadline caught it. */
    mt_rpc_channel_t *many = retrying_channel(port, 1000, 20, 20);
    atomic_store(&unavail_calls, 0);
    atomic_store(&unavail_until, 1 << 30);
    rc = call(many, P_FLAKY, "ab", 2, 1000, &resp, &rl, &st);
    cr_assert(
        rc == MT_UNAVAILABLE || rc == MT_TIMEOUT ||
            (rc == MT_OK && (st.code == MT_RPC_UNAVAILABLE || st.code == MT_RPC_DEADLINE_EXCEEDED)),
        "rc %s status %d '%s'", mt_err_name(rc), st.code, st.message);
    cr_assert_null(resp);
    int attempts = atomic_load(&unavail_calls);
    cr_assert(attempts >= 1 && attempts < 1001, "attempts: %d", attempts);
    mt_rpc_channel_destroy(many);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

typedef struct late_start {
    int port;
    int delay_ms;
    mt_rpc_server_t *s; /* out */
    int bound_port;     /* out */
    mt_err_t rc;        /* out */
} late_start_t;

static void *late_server_thread(void *p) {
    late_start_t *ls = p;
    tu_sleep_ms(ls->delay_ms);
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    char addr[64];
    snprintf(addr, sizeof(addr), "127.0.0.1:%d", ls->port);
    cfg.listen = addr;
    ls->rc = mt_rpc_server_create(&cfg, &ls->s);
    if (ls->rc != MT_OK) return NULL;
    ls->rc = mt_rpc_server_add(ls->s, P_REVERSE, 0, h_reverse, NULL);
    if (ls->rc != MT_OK) return NULL;
    ls->rc = mt_rpc_server_start(ls->s, &ls->bound_port);
    return NULL;
}

static void late_server_case(uint32_t retries, uint32_t backoff_ms, uint32_t backoff_max_ms) {
    late_start_t ls = {.port = dead_port(), .delay_ms = 300};
    mt_rpc_channel_t *ch = retrying_channel(ls.port, retries, backoff_ms, backoff_max_ms);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, late_server_thread, &ls), 0);
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    mt_err_t rc = call(ch, P_REVERSE, "late", 4, 60000, &resp, &rl, &st);
    pthread_join(th, NULL);
    /* Clean up first: a failed assertion ends the case (and LeakSanitizer would report). */
    int reply_ok = rl == 4 && resp && memcmp(resp, "etal", 4) == 0;
    free(resp);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(ls.s);
    cr_assert_eq(ls.rc, MT_OK, "late server failed to start: %s", mt_err_name(ls.rc));
    cr_assert_eq(ls.bound_port, ls.port);
    cr_assert_eq(rc, MT_OK, "rc %s status %d '%s'", mt_err_name(rc), st.code, st.message);
    cr_assert_eq(st.code, MT_RPC_OK, "status %d '%s'", st.code, st.message);
    cr_assert(reply_ok, "wrong reply (%zu bytes)", rl);
    cr_assert_eq(atomic_load(&g.calls), 1, "exactly one attempt reached the handler");
}

Test(rpc, retries_reach_a_server_that_starts_late) {
    /* Attempts at about 0, 50, 150, 350, 750, 1250, 1750, 2250 ms. */
    late_server_case(7, 50, 500);
}

Test(rpc, retries_follow_the_configured_backoff_not_grpcs) {
    /* Attempts at about 0, 100, 300, 500, 700 ms, the server is up at ~300 ms: the last two
     * attempts must reach it. (gRPC's own reconnect backoff, 1 s +-20% after a refused
     * connection, would make them fail fast unless the channel is told the client's.) */
    late_server_case(4, 100, 200);
}

/* ============================== shutdown ============================== */

typedef struct bg_call {
    mt_rpc_channel_t *ch;
    uint32_t sleep_ms;
    mt_err_t rc;
    mt_rpc_status_t st;
    uint8_t *resp;
    size_t resp_len;
} bg_call_t;

static void *bg_call_thread(void *p) {
    bg_call_t *b = p;
    uint8_t req[4];
    put_u32(req, b->sleep_ms);
    b->rc = mt_rpc_call(b->ch, P_SLEEP, req, 4, 20000, &b->resp, &b->resp_len, &b->st);
    return NULL;
}

Test(rpc, graceful_shutdown_finishes_in_flight_calls) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, 1, 0);
    expect_reverse(ch, (const uint8_t *)"warm", 4);
    bg_call_t b = {.ch = ch, .sleep_ms = 300};
    b.st.code = -1;
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, bg_call_thread, &b), 0);
    cr_assert(tu_wait_for(&g.sleep_started, 1, 60000), "the handler never started");
    mt_rpc_server_shutdown(s);
    /* Shutdown waits for the handler (grace 5 s > 300 ms). */
    cr_assert_eq(atomic_load(&g.sleep_done), 1, "shutdown returned before the handler ended");
    pthread_join(th, NULL);
    cr_assert_eq(b.rc, MT_OK, "rc %s", mt_err_name(b.rc));
    cr_assert_eq(b.st.code, MT_RPC_OK, "in-flight call: status %d '%s'", b.st.code, b.st.message);
    cr_assert_eq(b.resp_len, 5);
    cr_assert_eq(memcmp(b.resp, "slept", 5), 0);
    free(b.resp);

    /* After shutdown: UNAVAILABLE (after the one configured retry). */
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    mt_err_t rc = call(ch, P_REVERSE, "x", 1, 5000, &resp, &rl, &st);
    cr_assert(rc == MT_UNAVAILABLE || (rc == MT_OK && st.code == MT_RPC_UNAVAILABLE),
              "after shutdown: rc %s status %d '%s'", mt_err_name(rc), st.code, st.message);
    cr_assert_null(resp);
    int calls_before = atomic_load(&g.calls);
    mt_rpc_server_shutdown(s); /* idempotent */
    mt_rpc_server_set_serving(s, 0);
    mt_rpc_server_destroy(s);
    mt_rpc_server_destroy(NULL);
    cr_assert_eq(atomic_load(&g.calls), calls_before);
    mt_rpc_channel_destroy(ch);
    mt_rpc_channel_destroy(NULL);
}

Test(rpc, shutdown_cancels_calls_past_the_grace_period) {
    int port;
    server_opts_t o = {.threads = 2, .grace_ms = 200};
    mt_rpc_server_t *s = start_server_opts(&o, &port);
    mt_rpc_channel_t *ch = open_channel(port, 0, 0);
    expect_reverse(ch, (const uint8_t *)"warm", 4);
    /* A long unary handler and a stream whose client does not read. */
    bg_call_t b = {.ch = ch, .sleep_ms = 1500};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, bg_call_thread, &b), 0);
    mt_rpc_stream_t *stream = NULL;
    cr_assert_eq(mt_rpc_stream_open(ch, P_FOREVER, NULL, 0, 30000, &stream), MT_OK);
    cr_assert(tu_wait_for(&g.sleep_started, 1, 60000));
    cr_assert(tu_wait_for(&g.forever_started, 1, 60000));
    mt_rpc_server_shutdown(s);
    /* Workers are joined: every handler has returned; the stream's sends were refused. */
    cr_assert_eq(atomic_load(&g.sleep_done), 1);
    cr_assert_eq(atomic_load(&g.forever_cancelled), 1, "stream handler not cancelled");
    pthread_join(th, NULL);
    cr_assert(b.rc != MT_OK || b.st.code != MT_RPC_OK, "a call past the grace period completed OK");
    free(b.resp);
    uint8_t *buf = NULL;
    size_t len = 0;
    mt_err_t rc;
    int n = 0;
    while ((rc = mt_rpc_stream_next(stream, &buf, &len)) == MT_OK) {
        free(buf);
        buf = NULL;
        cr_assert_lt(++n, 1000000);
    }
    mt_rpc_status_t status;
    mt_rpc_stream_close(stream, &status);
    cr_assert_neq(status.code, MT_RPC_OK);
    mt_rpc_server_destroy(s);
    mt_rpc_channel_destroy(ch);
}

typedef struct load_arg {
    mt_rpc_channel_t *ch;
    int id;
    atomic_int *stop;
    int ok, failed, wrong; /* out */
} load_arg_t;

static void *load_thread(void *p) {
    load_arg_t *a = p;
    uint8_t req[64];
    for (int i = 0; !atomic_load(a->stop); i++) {
        size_t len = 1 + (size_t)(i % 63);
        for (size_t k = 0; k < len; k++)
            req[k] = (uint8_t)(a->id * 13 + i + k);
        uint8_t *resp = NULL;
        size_t rl = 0;
        mt_rpc_status_t st;
        mt_err_t rc = mt_rpc_call(a->ch, P_REVERSE, req, len, 5000, &resp, &rl, &st);
        if (rc == MT_OK && st.code == MT_RPC_OK) {
            int same = rl == len && resp;
            for (size_t k = 0; same && k < len; k++)
                same = resp[k] == req[len - 1 - k];
            if (same)
                a->ok++;
            else
                a->wrong++;
        } else if (st.code == MT_RPC_UNAVAILABLE || st.code == MT_RPC_CANCELLED) {
            a->failed++;
        } else {
            a->wrong++;
        }
        free(resp);
    }
    return NULL;
}

Test(rpc, shutdown_under_load) {
    /* Calls keep arriving while the server shuts down: each ends OK with the right reply or
     * UNAVAILABLE/CANCELLED, shutdown returns, nothing crashes or leaks. Several rounds. */
    for (int round = 0; round < 3; round++) {
        int port;
        server_opts_t o = {.threads = 2, .grace_ms = 1000};
        mt_rpc_server_t *s = start_server_opts(&o, &port);
        mt_rpc_channel_t *ch = open_channel(port, 0, 0);
        atomic_int stop;
        atomic_init(&stop, 0);
        int before = atomic_load(&g.calls);
        enum { T = 4 };
        pthread_t th[T];
        load_arg_t args[T];
        for (int t = 0; t < T; t++) {
            args[t] = (load_arg_t){.ch = ch, .id = t, .stop = &stop};
            cr_assert_eq(pthread_create(&th[t], NULL, load_thread, &args[t]), 0);
        }
        /* some calls succeed first (the first connection can take a while under ASan) */
        cr_assert(tu_wait_for(&g.calls, before + 1, 60000), "round %d: no call reached the server",
                  round);
        tu_sleep_ms(100 + 50 * round);
        mt_rpc_server_shutdown(s);
        tu_sleep_ms(50);
        atomic_store(&stop, 1);
        int ok = 0, failed = 0, wrong = 0;
        for (int t = 0; t < T; t++) {
            pthread_join(th[t], NULL);
            ok += args[t].ok;
            failed += args[t].failed;
            wrong += args[t].wrong;
        }
        mt_rpc_server_destroy(s);
        mt_rpc_channel_destroy(ch);
        cr_assert_eq(wrong, 0, "round %d: %d wrong answers (%d ok, %d failed)", round, wrong, ok,
                     failed);
        cr_assert_gt(ok, 0, "round %d: no call succeeded before shutdown", round);
        cr_assert_gt(failed, 0, "round %d: no call failed after shutdown", round);
    }
}

Test(rpc, destroy_without_shutdown_and_with_open_channel) {
    int port;
    mt_rpc_server_t *s = start_server(&port);
    mt_rpc_channel_t *ch = open_channel(port, 0, 0);
    expect_reverse(ch, (const uint8_t *)"abc", 3);
    mt_rpc_server_destroy(s); /* shuts down itself */
    uint8_t *resp;
    size_t rl;
    mt_rpc_status_t st;
    mt_err_t rc = call(ch, P_REVERSE, "x", 1, 3000, &resp, &rl, &st);
    cr_assert(rc == MT_UNAVAILABLE || (rc == MT_OK && st.code == MT_RPC_UNAVAILABLE),
              "rc %s status %d '%s'", mt_err_name(rc), st.code, st.message);
    mt_rpc_channel_destroy(ch);
    /* A fresh server in the same process works (gRPC init/shutdown balanced). */
    s = start_server(&port);
    ch = open_channel(port, 0, 0);
    expect_reverse(ch, (const uint8_t *)"again", 5);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}
