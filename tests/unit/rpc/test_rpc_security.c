/*
 * test_rpc_security.c - the rpc layer's TLS and admission (issue #7), over loopback.
 *
 * TLS (certificates made at test time by tls_certs.h):
 *   - unary and streaming round trips over TLS; mutual TLS; server_name override;
 *   - every mismatch fails UNAVAILABLE (the handshake fails), never a silent plaintext call:
 *     plaintext client vs TLS server and the reverse, a server certificate of another CA,
 *     a certificate without the dialed name, mTLS required and no client certificate;
 *   - bad files: missing, unreadable, not PEM, a key of another certificate, a server
 *     without a certificate, client_auth without a CA: MT_IO / MT_CONFIG at create, with
 *     the key and the path in mt_rpc_tls_check()'s message.
 * Admission:
 *   - 1 thread, max_queued 2, 20 concurrent slow calls: 3 succeed, the others get
 *     RESOURCE_EXHAUSTED at once ("server overloaded"), Health is answered meanwhile, and
 *     the server's rejected counter equals what the clients saw;
 *   - max_queued 0 refuses as soon as the thread is busy;
 *   - streams run beside the unary threads (long streams do not starve unary calls), are
 *     bounded by max_streams, and Health still answers;
 *   - shutdown with a full queue: queued calls are answered within the grace period, not
 *     run after it; everything is freed (ASan).
 *
 * Handlers run on server threads: they only count in atomics; the test thread asserts.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mt/rpc.h"
#include "testutil_rpc.h"
#include "tls_certs.h"

#define P_REVERSE "/mt.test.Echo/Reverse"
#define P_SLEEP   "/mt.test.Echo/Sleep"
#define P_COUNT   "/mt.test.Stream/Count"
#define P_HOLD    "/mt.test.Stream/Hold"
#define P_HEALTH  "/grpc.health.v1.Health/Check"

static char dir[64];

static struct {
    atomic_int sleep_started;
    atomic_int hold_started;
    atomic_int release; /* Hold streams end when this is set */
} g;

/* ============================== handlers ============================== */

static void h_reverse(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    uint8_t out[256];
    if (len > sizeof(out)) {
        mt_rpc_fail(c, MT_RPC_INVALID_ARGUMENT, "too long");
        return;
    }
    for (size_t i = 0; i < len; i++)
        out[i] = req[len - 1 - i];
    mt_rpc_reply(c, out, len);
}

/* Request: u32 milliseconds (little-endian). */
static void h_sleep(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    atomic_fetch_add(&g.sleep_started, 1);
    uint32_t ms = len >= 4 ? (uint32_t)req[0] | (uint32_t)req[1] << 8 | (uint32_t)req[2] << 16 |
                                 (uint32_t)req[3] << 24
                           : 0;
    tu_sleep_ms(ms);
    mt_rpc_reply(c, (const uint8_t *)"slept", 5);
}

/* Stream of req[0] one-byte messages 0, 1, 2, ... */
static void h_count(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    unsigned n = len ? req[0] : 0;
    for (unsigned i = 0; i < n; i++) {
        uint8_t b = (uint8_t)i;
        if (mt_rpc_send(c, &b, 1) != MT_OK) {
            mt_rpc_fail(c, MT_RPC_CANCELLED, "gone");
            return;
        }
    }
    mt_rpc_reply(c, NULL, 0);
}

/* A long-lived stream: one message, then waits for g.release (at most 10 s). */
static void h_hold(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    uint8_t b = 1;
    atomic_fetch_add(&g.hold_started, 1);
    if (mt_rpc_send(c, &b, 1) != MT_OK) {
        mt_rpc_fail(c, MT_RPC_CANCELLED, "gone");
        return;
    }
    int64_t end = tu_now_ms() + 10000;
    while (!atomic_load(&g.release) && tu_now_ms() < end && mt_rpc_call_remaining_ms(c) > 0)
        tu_sleep_ms(5);
    mt_rpc_reply(c, NULL, 0);
}

/* ============================== helpers ============================== */

static void setup_certs(void) {
    cr_assert_eq(tls_certs_make(dir, sizeof(dir)), 0, "openssl failed: see %s/openssl.log", dir);
}

static void cleanup_certs(void) {
    tls_certs_remove(dir);
}

static mt_rpc_tls_config_t server_tls(const char *cert, const char *key) {
    mt_rpc_tls_config_t t = {0};
    t.enabled = 1;
    t.cert_file = tls_path(dir, cert);
    t.key_file = tls_path(dir, key);
    return t;
}

static mt_rpc_tls_config_t client_tls(const char *ca) {
    mt_rpc_tls_config_t t = {0};
    t.enabled = 1;
    t.ca_file = tls_path(dir, ca);
    return t;
}

static mt_rpc_server_t *start(const mt_rpc_server_config_t *cfg, int *port) {
    const tu_rpc_method_t m[] = {
        {P_REVERSE, 0, h_reverse, NULL},
        {P_SLEEP, 0, h_sleep, NULL},
        {P_COUNT, 1, h_count, NULL},
        {P_HOLD, 1, h_hold, NULL},
    };
    return tu_rpc_server_start(cfg, m, sizeof(m) / sizeof(m[0]), port);
}

static mt_rpc_server_t *start_tls(mt_rpc_tls_config_t tls, int *port) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cfg.tls = tls;
    return start(&cfg, port);
}

static mt_rpc_channel_t *channel(const char *host, int port, const mt_rpc_tls_config_t *tls) {
    mt_rpc_client_config_t cc;
    mt_rpc_client_config_init(&cc);
    cc.retries = 0; /* a failed handshake is UNAVAILABLE: no need to try again */
    if (tls) cc.tls = *tls;
    return tu_rpc_channel(host, port, &cc);
}

/* A Reverse call; returns the status code (and checks the reply when OK). */
static int reverse(mt_rpc_channel_t *ch, char *msg, size_t msglen) {
    const uint8_t req[] = "monolith";
    uint8_t *resp = NULL;
    size_t rl = 0;
    mt_rpc_status_t st;
    mt_rpc_call(ch, P_REVERSE, req, 8, 5000, &resp, &rl, &st);
    if (st.code == MT_RPC_OK) {
        cr_assert_eq(rl, 8);
        cr_assert_eq(memcmp(resp, "htilonom", 8), 0);
    }
    if (msg) snprintf(msg, msglen, "%s", st.message);
    free(resp);
    return st.code;
}

/* Health/Check of the whole server: the status byte (1 SERVING), or -code on failure. */
static int health(mt_rpc_channel_t *ch, int64_t deadline_ms) {
    uint8_t *resp = NULL;
    size_t rl = 0;
    mt_rpc_status_t st;
    mt_rpc_call(ch, P_HEALTH, NULL, 0, deadline_ms, &resp, &rl, &st);
    int r = st.code != MT_RPC_OK ? -st.code : (rl == 2 ? resp[1] : -100);
    free(resp);
    return r;
}

/* Reads a Count stream of @p n messages; returns the final status code. */
static int count_stream(mt_rpc_channel_t *ch, uint8_t n) {
    mt_rpc_stream_t *s = NULL;
    cr_assert_eq(mt_rpc_stream_open(ch, P_COUNT, &n, 1, 5000, &s), MT_OK);
    uint8_t *buf;
    size_t len;
    unsigned got = 0;
    while (mt_rpc_stream_next(s, &buf, &len) == MT_OK) {
        cr_assert_eq(len, 1);
        cr_assert_eq(buf[0], (uint8_t)got);
        got++;
        free(buf);
    }
    mt_rpc_status_t st;
    mt_rpc_stream_close(s, &st);
    if (st.code == MT_RPC_OK) cr_assert_eq(got, n);
    return st.code;
}

/* ============================== TLS ============================== */

TestSuite(rpc_tls, .init = setup_certs, .fini = cleanup_certs, .timeout = 60);

Test(rpc_tls, unary_and_stream_round_trip) {
    /* gRPC's c-ares resolver leaks 10 bytes per process resolving a name (LSan): the
     * native one (getaddrinfo) resolves "localhost" here. Read at gRPC's init, which is the
     * first rpc call of this process (each case is a process of its own). */
    setenv("GRPC_DNS_RESOLVER", "native", 1);
    int port;
    mt_rpc_server_t *s = start_tls(server_tls("server.pem", "server.key"), &port);
    mt_rpc_tls_config_t ct = client_tls("ca.pem");
    /* The certificate names both: dialing by IP and by name works. */
    const char *hosts[] = {"127.0.0.1", "localhost"};
    for (int h = 0; h < 2; h++) {
        mt_rpc_channel_t *ch = channel(hosts[h], port, &ct);
        char msg[256];
        cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_OK, "%s: %s", hosts[h], msg);
        cr_assert_eq(count_stream(ch, 0), MT_RPC_OK);
        cr_assert_eq(count_stream(ch, 200), MT_RPC_OK);
        cr_assert_eq(health(ch, 5000), 1);
        mt_rpc_channel_destroy(ch);
    }
    mt_rpc_server_destroy(s);
}

Test(rpc_tls, plaintext_and_tls_do_not_mix) {
    int tport, pport;
    mt_rpc_server_t *ts = start_tls(server_tls("server.pem", "server.key"), &tport);
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    mt_rpc_server_t *ps = start(&cfg, &pport);
    char msg[256];
    /* plaintext client -> TLS server */
    mt_rpc_channel_t *ch = channel("127.0.0.1", tport, NULL);
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_UNAVAILABLE, "%s", msg);
    mt_rpc_channel_destroy(ch);
    /* TLS client -> plaintext server */
    mt_rpc_tls_config_t ct = client_tls("ca.pem");
    ch = channel("127.0.0.1", pport, &ct);
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_UNAVAILABLE, "%s", msg);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(ts);
    mt_rpc_server_destroy(ps);
}

Test(rpc_tls, server_of_another_ca_is_refused) {
    int port;
    mt_rpc_server_t *s = start_tls(server_tls("other-server.pem", "other-server.key"), &port);
    mt_rpc_tls_config_t ct = client_tls("ca.pem");
    mt_rpc_channel_t *ch = channel("127.0.0.1", port, &ct);
    char msg[256];
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_UNAVAILABLE, "%s", msg);
    mt_rpc_channel_destroy(ch);
    /* ... and accepted by a client that trusts that CA. */
    ct = client_tls("other.pem");
    ch = channel("127.0.0.1", port, &ct);
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_OK, "%s", msg);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

Test(rpc_tls, server_name_override) {
    int port;
    mt_rpc_server_t *s = start_tls(server_tls("named.pem", "named.key"), &port);
    char msg[256];
    /* The certificate names ps.monolith.test only: dialing 127.0.0.1 fails ... */
    mt_rpc_tls_config_t ct = client_tls("ca.pem");
    mt_rpc_channel_t *ch = channel("127.0.0.1", port, &ct);
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_UNAVAILABLE, "%s", msg);
    mt_rpc_channel_destroy(ch);
    /* ... unless the client expects that name; a wrong name fails. */
    ct.server_name = "ps.monolith.test";
    ch = channel("127.0.0.1", port, &ct);
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_OK, "%s", msg);
    mt_rpc_channel_destroy(ch);
    ct.server_name = "serving.monolith.test";
    ch = channel("127.0.0.1", port, &ct);
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_UNAVAILABLE, "%s", msg);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

Test(rpc_tls, mutual_tls_requires_a_client_certificate) {
    int port;
    mt_rpc_tls_config_t st = server_tls("server.pem", "server.key");
    st.ca_file = tls_path(dir, "ca.pem");
    st.client_auth = 1;
    mt_rpc_server_t *s = start_tls(st, &port);
    char msg[256];
    /* no client certificate */
    mt_rpc_tls_config_t ct = client_tls("ca.pem");
    mt_rpc_channel_t *ch = channel("127.0.0.1", port, &ct);
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_UNAVAILABLE, "%s", msg);
    mt_rpc_channel_destroy(ch);
    /* a client certificate of another CA */
    ct.cert_file = tls_path(dir, "other-server.pem");
    ct.key_file = tls_path(dir, "other-server.key");
    ch = channel("127.0.0.1", port, &ct);
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_UNAVAILABLE, "%s", msg);
    mt_rpc_channel_destroy(ch);
    /* the client certificate; also the server's own (serverAuth + clientAuth), as one
     * shared [tls] section gives every daemon */
    const char *certs[][2] = {{"client.pem", "client.key"}, {"server.pem", "server.key"}};
    for (int i = 0; i < 2; i++) {
        ct.cert_file = tls_path(dir, certs[i][0]);
        ct.key_file = tls_path(dir, certs[i][1]);
        ch = channel("127.0.0.1", port, &ct);
        cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_OK, "%s: %s", certs[i][0], msg);
        cr_assert_eq(count_stream(ch, 10), MT_RPC_OK);
        mt_rpc_channel_destroy(ch);
    }
    mt_rpc_server_destroy(s);
}

/* A server config that must fail create with @p want, and a check message holding @p text. */
static void expect_bad_server(mt_rpc_tls_config_t t, mt_err_t want, const char *text) {
    char msg[512] = "";
    cr_assert_eq(mt_rpc_tls_check(&t, 1, msg, sizeof(msg)), want, "%s", msg);
    cr_assert(strstr(msg, text), "message '%s' lacks '%s'", msg, text);
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cfg.tls = t;
    mt_rpc_server_t *s = (mt_rpc_server_t *)1;
    cr_assert_eq(mt_rpc_server_create(&cfg, &s), want);
}

Test(rpc_tls, bad_files_are_clear_errors_at_create) {
    char missing[300];
    snprintf(missing, sizeof(missing), "%s/missing.pem", dir);
    mt_rpc_tls_config_t t = server_tls("server.pem", "server.key");
    t.cert_file = missing;
    expect_bad_server(t, MT_IO, "tls.cert_file '");
    expect_bad_server(t, MT_IO, "missing.pem': cannot open: No such file or directory");
    t = server_tls("server.pem", "server.key");
    t.key_file = missing;
    expect_bad_server(t, MT_IO, "tls.key_file '");
    t = server_tls("garbage.pem", "server.key");
    expect_bad_server(t, MT_CONFIG, "garbage.pem': no PEM certificate in it");
    t = server_tls("server.pem", "garbage.pem");
    expect_bad_server(t, MT_CONFIG, "garbage.pem': no PEM private key in it");
    t = server_tls("server.pem", "client.key");
    expect_bad_server(t, MT_CONFIG, "client.key' is not the key of the certificate in");
    t = server_tls("server.pem", "server.key");
    t.cert_file = t.key_file = NULL;
    expect_bad_server(t, MT_CONFIG, "tls.cert_file: a TLS server needs");
    t = server_tls("server.pem", "server.key");
    t.key_file = "";
    expect_bad_server(t, MT_CONFIG, "tls.key_file: tls.cert_file and tls.key_file go together");
    t = server_tls("server.pem", "server.key");
    t.client_auth = 1;
    expect_bad_server(t, MT_CONFIG, "tls.ca_file: tls.client_auth needs");
    t.ca_file = tls_path(dir, "garbage.pem");
    expect_bad_server(t, MT_CONFIG, "tls.ca_file '");
    /* An unreadable file (not as root: root reads anything). */
    if (geteuid() != 0) {
        cr_assert_eq(chmod(tls_path(dir, "server.key"), 0), 0);
        t = server_tls("server.pem", "server.key");
        expect_bad_server(t, MT_IO, "server.key': cannot open: Permission denied");
        chmod(tls_path(dir, "server.key"), 0600);
    }
    /* Clients: the same checks; a channel with a bad CA file is not created. */
    mt_rpc_tls_config_t ct = client_tls("garbage.pem");
    char msg[512] = "";
    cr_assert_eq(mt_rpc_tls_check(&ct, 0, msg, sizeof(msg)), MT_CONFIG);
    cr_assert(strstr(msg, "tls.ca_file '"), "%s", msg);
    mt_rpc_client_config_t cc;
    mt_rpc_client_config_init(&cc);
    cc.tls = ct;
    mt_rpc_channel_t *ch = NULL;
    cr_assert_eq(mt_rpc_channel_create("127.0.0.1:1", &cc, &ch), MT_CONFIG);
    cc.tls = client_tls("ca.pem");
    cc.tls.cert_file = tls_path(dir, "client.pem");
    cr_assert_eq(mt_rpc_channel_create("127.0.0.1:1", &cc, &ch), MT_CONFIG);
    /* Disabled: the paths are not even looked at. */
    t.enabled = 0;
    t.cert_file = missing;
    cr_assert_eq(mt_rpc_tls_check(&t, 1, msg, sizeof(msg)), MT_OK);
}

/* ============================== admission ============================== */

typedef struct slow_call {
    mt_rpc_channel_t *ch;
    uint32_t ms;
    int code;
    int64_t took_ms;
    char msg[256];
} slow_call_t;

static void *slow_thread(void *p) {
    slow_call_t *c = p;
    uint8_t req[4] = {(uint8_t)c->ms, (uint8_t)(c->ms >> 8), 0, 0};
    uint8_t *resp = NULL;
    size_t rl = 0;
    mt_rpc_status_t st;
    int64_t t0 = tu_now_ms();
    mt_rpc_call(c->ch, P_SLEEP, req, 4, 20000, &resp, &rl, &st);
    c->took_ms = tu_now_ms() - t0;
    c->code = st.code;
    snprintf(c->msg, sizeof(c->msg), "%s", st.message);
    free(resp);
    return NULL;
}

enum { NCALLS = 20, SLOW_MS = 1000 };

Test(rpc_admission, overload_is_refused_at_once_and_health_answers, .timeout = 60) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cfg.threads = 1;
    cfg.max_queued = 2;
    int port;
    mt_rpc_server_t *s = start(&cfg, &port);
    mt_rpc_channel_t *ch = channel("127.0.0.1", port, NULL);
    cr_assert_eq(health(ch, 5000), 1); /* connected before the burst */
    slow_call_t calls[NCALLS];
    pthread_t th[NCALLS];
    for (int i = 0; i < NCALLS; i++) {
        calls[i] = (slow_call_t){.ch = ch, .ms = SLOW_MS};
        cr_assert_eq(pthread_create(&th[i], NULL, slow_thread, &calls[i]), 0);
    }
    /* While the thread sleeps and the queue is full, Health is answered at once. */
    cr_assert(tu_wait_for(&g.sleep_started, 1, 5000));
    int64_t t0 = tu_now_ms();
    cr_assert_eq(health(ch, 2000), 1);
    int64_t health_ms = tu_now_ms() - t0;
    mt_rpc_server_stats_t st;
    mt_rpc_server_stats(s, &st);
    cr_assert_eq(st.running, 1);
    cr_assert_leq(st.queued, 2);
    for (int i = 0; i < NCALLS; i++)
        pthread_join(th[i], NULL);
    int ok = 0, refused = 0;
    for (int i = 0; i < NCALLS; i++) {
        if (calls[i].code == MT_RPC_OK) {
            ok++;
            cr_assert_geq(calls[i].took_ms, SLOW_MS - 50);
        } else {
            cr_assert_eq(calls[i].code, MT_RPC_RESOURCE_EXHAUSTED, "call %d: %d %s", i,
                         calls[i].code, calls[i].msg);
            cr_assert(strstr(calls[i].msg, "server overloaded: 2 calls queued"), "%s",
                      calls[i].msg);
            /* refused at once, not after waiting for the thread */
            cr_assert_lt(calls[i].took_ms, SLOW_MS / 2, "refused after %lld ms",
                         (long long)calls[i].took_ms);
            refused++;
        }
    }
    /* One running and two queued get through (more only if a call came late, after the
     * first finished: the 20 threads start within far less than a second). */
    cr_assert_geq(ok, 3);
    cr_assert_leq(ok, 6);
    cr_assert_eq(ok + refused, NCALLS);
    mt_rpc_server_stats(s, &st);
    cr_assert_eq(st.rejected, (uint64_t)refused);
    cr_assert_eq(st.rejected_streams, 0);
    cr_assert_eq(st.queued, 0);
    cr_assert_eq(st.running, 0);
    cr_assert_lt(health_ms, 1000, "Health took %lld ms under overload", (long long)health_ms);
    char text[2048];
    mt_rpc_server_render_metrics(s, "monolith_test", "shard=\"0\"", text, sizeof(text));
    char want[96];
    snprintf(want, sizeof(want), "monolith_test_rejected_total{shard=\"0\"} %d\n", refused);
    cr_assert(strstr(text, want), "%s", text);
    cr_assert(strstr(text, "monolith_test_queued_calls{shard=\"0\"} 0\n"), "%s", text);
    /* After the burst the server serves normally. */
    cr_assert_eq(reverse(ch, NULL, 0), MT_RPC_OK);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

Test(rpc_admission, no_queue_refuses_when_the_threads_are_busy, .timeout = 30) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cfg.threads = 1;
    cfg.max_queued = 0;
    int port;
    mt_rpc_server_t *s = start(&cfg, &port);
    mt_rpc_channel_t *ch = channel("127.0.0.1", port, NULL);
    slow_call_t slow = {.ch = ch, .ms = 800};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, slow_thread, &slow), 0);
    cr_assert(tu_wait_for(&g.sleep_started, 1, 5000));
    char msg[256];
    int64_t t0 = tu_now_ms();
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_RESOURCE_EXHAUSTED, "%s", msg);
    cr_assert_lt(tu_now_ms() - t0, 400);
    cr_assert(strstr(msg, "server overloaded: 0 calls queued"), "%s", msg);
    pthread_join(th, NULL);
    cr_assert_eq(slow.code, MT_RPC_OK, "%s", slow.msg);
    /* The thread is free again a moment after its reply left: then a call is admitted. */
    mt_rpc_server_stats_t st;
    int64_t end = tu_now_ms() + 2000;
    do
        mt_rpc_server_stats(s, &st);
    while (st.running && tu_now_ms() < end);
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_OK, "%s", msg);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

typedef struct hold {
    mt_rpc_channel_t *ch;
    mt_rpc_stream_t *s;
    int code;
} hold_t;

Test(rpc_admission, streams_do_not_starve_unary_calls_and_are_bounded, .timeout = 30) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cfg.threads = 1;
    cfg.max_queued = 4; /* back-to-back calls may find the thread still finishing a reply */
    cfg.max_streams = 3;
    int port;
    mt_rpc_server_t *s = start(&cfg, &port);
    mt_rpc_channel_t *ch = channel("127.0.0.1", port, NULL);
    /* Three long streams: each runs on a thread of its own. */
    mt_rpc_stream_t *st[3];
    for (int i = 0; i < 3; i++) {
        uint8_t b = 0;
        cr_assert_eq(mt_rpc_stream_open(ch, P_HOLD, &b, 1, 20000, &st[i]), MT_OK);
        uint8_t *buf;
        size_t len;
        cr_assert_eq(mt_rpc_stream_next(st[i], &buf, &len), MT_OK, "stream %d", i);
        free(buf);
    }
    cr_assert_eq(atomic_load(&g.hold_started), 3);
    mt_rpc_server_stats_t ss;
    mt_rpc_server_stats(s, &ss);
    cr_assert_eq(ss.streams, 3);
    /* Unary calls and Health still go through: if the streams held the one unary thread,
     * these would wait in the queue until their deadline. */
    char msg[256];
    for (int i = 0; i < 5; i++)
        cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_OK, "%s", msg);
    cr_assert_eq(health(ch, 2000), 1);
    /* A fourth stream is refused at once. */
    int64_t t0 = tu_now_ms();
    cr_assert_eq(count_stream(ch, 5), MT_RPC_RESOURCE_EXHAUSTED);
    cr_assert_lt(tu_now_ms() - t0, 1000);
    mt_rpc_server_stats(s, &ss);
    cr_assert_eq(ss.rejected, 1);
    cr_assert_eq(ss.rejected_streams, 1);
    /* Released, the streams end OK and new ones are admitted. */
    atomic_store(&g.release, 1);
    for (int i = 0; i < 3; i++) {
        uint8_t *buf;
        size_t len;
        cr_assert_eq(mt_rpc_stream_next(st[i], &buf, &len), MT_NOT_FOUND);
        mt_rpc_status_t cs;
        mt_rpc_stream_close(st[i], &cs);
        cr_assert_eq(cs.code, MT_RPC_OK, "%s", cs.message);
    }
    int64_t end = tu_now_ms() + 2000;
    do
        mt_rpc_server_stats(s, &ss);
    while (ss.streams && tu_now_ms() < end);
    cr_assert_eq(count_stream(ch, 5), MT_RPC_OK);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* A server of one thread and a queue of four, and k threads calling Sleep on it. */
typedef struct full_queue {
    mt_rpc_server_t *s;
    mt_rpc_channel_t *ch;
    int k;
    slow_call_t calls[8];
    pthread_t th[8];
} full_queue_t;

/* Starts @p q: the server (@p grace_ms to shut down) and @p k threads calling Sleep(@p ms);
 * returns once one call runs and four wait in the queue. */
static void full_queue_start(full_queue_t *q, uint32_t grace_ms, uint32_t ms, int k) {
    cr_assert_leq(k, 8);
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cfg.threads = 1;
    cfg.max_queued = 4;
    cfg.grace_ms = grace_ms;
    int port;
    q->s = start(&cfg, &port);
    q->ch = channel("127.0.0.1", port, NULL);
    q->k = k;
    cr_assert_eq(health(q->ch, 5000), 1);
    for (int i = 0; i < k; i++) {
        q->calls[i] = (slow_call_t){.ch = q->ch, .ms = ms};
        cr_assert_eq(pthread_create(&q->th[i], NULL, slow_thread, &q->calls[i]), 0);
    }
    mt_rpc_server_stats_t st;
    int64_t end = tu_now_ms() + 5000;
    do {
        tu_sleep_ms(2);
        mt_rpc_server_stats(q->s, &st);
    } while (st.queued < 4 && tu_now_ms() < end);
    cr_assert_eq(st.queued, 4);
}

/* Waits for the callers of @p q (after the shutdown), then frees the channel and server. */
static void full_queue_end(full_queue_t *q) {
    for (int i = 0; i < q->k; i++)
        pthread_join(q->th[i], NULL);
    mt_rpc_channel_destroy(q->ch);
    mt_rpc_server_destroy(q->s);
}

Test(rpc_admission, shutdown_with_a_full_queue_answers_and_frees_everything, .timeout = 30) {
    full_queue_t q;
    full_queue_start(&q, 5000, 300, 8); /* shut down with one call running and four queued */
    mt_rpc_server_shutdown(q.s); /* the running call and the queued ones finish in the grace */
    full_queue_end(&q);
    int ok = 0;
    for (int i = 0; i < q.k; i++) {
        const slow_call_t *c = &q.calls[i];
        /* refused, or (a thread late under load) arrived as the shutdown began: refused by
         * gRPC, or caught between gRPC and a slot and cancelled once the server is idle */
        cr_assert(c->code == MT_RPC_OK || c->code == MT_RPC_RESOURCE_EXHAUSTED ||
                      c->code == MT_RPC_UNAVAILABLE || c->code == MT_RPC_CANCELLED,
                  "call %d: %d %s", i, c->code, c->msg);
        ok += c->code == MT_RPC_OK;
    }
    cr_assert_geq(ok, 5, "the running call and the 4 queued ones are answered");
}

Test(rpc_admission, shutdown_past_the_grace_does_not_run_queued_calls, .timeout = 30) {
    full_queue_t q;
    full_queue_start(&q, 100, 1000, 5);
    int64_t t0 = tu_now_ms();
    mt_rpc_server_shutdown(q.s);
    int64_t took = tu_now_ms() - t0;
    full_queue_end(&q);
    /* The running handler finished its second; the queued calls were cancelled unrun. */
    cr_assert_eq(atomic_load(&g.sleep_started), 1);
    cr_assert_lt(took, 2500, "shutdown took %lld ms", (long long)took);
    for (int i = 0; i < q.k; i++)
        cr_assert_neq(q.calls[i].code, MT_RPC_OK, "call %d answered OK after cancel_all", i);
}

Test(rpc_admission, config_bounds) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cr_assert_eq(cfg.threads, 4);
    cr_assert_eq(cfg.max_queued, 16);
    cr_assert_eq(cfg.max_streams, 8);
    cr_assert_eq(cfg.tls.enabled, 0);
    mt_rpc_server_t *s = NULL;
    cfg.max_queued = MT_RPC_MAX_QUEUED + 1;
    cr_assert_eq(mt_rpc_server_create(&cfg, &s), MT_CONFIG);
    cfg.max_queued = 0;
    cfg.max_streams = 0;
    cr_assert_eq(mt_rpc_server_create(&cfg, &s), MT_CONFIG);
    cfg.max_streams = MT_RPC_MAX_STREAMS + 1;
    cr_assert_eq(mt_rpc_server_create(&cfg, &s), MT_CONFIG);
    cfg.max_streams = 1;
    cr_assert_eq(mt_rpc_server_create(&cfg, &s), MT_OK);
    mt_rpc_server_stats_t st;
    mt_rpc_server_stats(s, &st);
    cr_assert_eq(st.rejected + st.queued + st.running + st.streams, 0);
    mt_rpc_server_destroy(s);
    mt_rpc_server_stats(NULL, &st);
    cr_assert_eq(st.rejected, 0);
}
