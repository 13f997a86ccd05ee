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
 * Admission, proved by construction rather than by a clock (the tests must pass on a busy
 * machine): the Gate handler blocks until the test opens g.gate_open, so the test decides
 * when a call ends, and "at once" means "while the only thread is still held in the gate":
 *   - 1 thread, max_queued 2, 20 concurrent Gate calls: with the gate closed, 1 runs, 2 wait
 *     in the queue and the other 17 are answered RESOURCE_EXHAUSTED ("server overloaded"),
 *     Health is answered, and the server's rejected counter equals what the clients saw;
 *     once the gate opens, exactly 3 succeed;
 *   - max_queued 0 refuses while the thread is held;
 *   - streams run beside the unary threads (unary calls succeed while 3 streams are held
 *     open), are bounded by max_streams (a fourth is refused while the three are held), and
 *     Health still answers;
 *   - shutdown with a full queue: begun with 1 call held and 4 queued, the queued calls run
 *     and are answered within the grace period; past the grace, the queued calls are
 *     answered (cancelled) while the running handler is still held, and never run;
 *     everything is freed (ASan).
 * Deadlines of 60 s (GUARD_MS) are hang guards only, never what a test asserts.
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
#define P_GATE    "/mt.test.Echo/Gate"
#define P_COUNT   "/mt.test.Stream/Count"
#define P_HOLD    "/mt.test.Stream/Hold"
#define P_PEER    "/mt.test.Echo/PeerReverse" /* Reverse on threads of its own */
#define P_HEALTH  "/grpc.health.v1.Health/Check"

static char dir[64];

/* Deadline of every call and stream of these tests: a hang guard, never an assertion. */
#define GUARD_MS 60000

static struct {
    atomic_int gate_started; /* Gate handlers that began */
    atomic_int gate_open;    /* set by the test: Gate handlers reply */
    atomic_int calls_done;   /* Gate calls that returned to their client (gate_thread) */
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

/* Holds its thread until the test sets g.gate_open (or the call's deadline passes: a hang
 * guard), then replies "opened". */
static void h_gate(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    atomic_fetch_add(&g.gate_started, 1);
    while (!atomic_load(&g.gate_open) && mt_rpc_call_remaining_ms(c) > 0)
        tu_sleep_ms(2);
    mt_rpc_reply(c, (const uint8_t *)"opened", 6);
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

/* A long-lived stream: one message, then waits for g.release (or the deadline: a hang
 * guard). */
static void h_hold(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    uint8_t b = 1;
    atomic_fetch_add(&g.hold_started, 1);
    if (mt_rpc_send(c, &b, 1) != MT_OK) {
        mt_rpc_fail(c, MT_RPC_CANCELLED, "gone");
        return;
    }
    while (!atomic_load(&g.release) && mt_rpc_call_remaining_ms(c) > 0)
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
        {P_GATE, 0, h_gate, NULL},
        {P_COUNT, 1, h_count, NULL},
        {P_HOLD, 1, h_hold, NULL},
        {P_PEER, MT_RPC_OWN_THREADS, h_reverse, NULL},
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
    mt_rpc_call(ch, P_REVERSE, req, 8, GUARD_MS, &resp, &rl, &st);
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
    cr_assert_eq(mt_rpc_stream_open(ch, P_COUNT, &n, 1, GUARD_MS, &s), MT_OK);
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
        cr_assert_eq(health(ch, GUARD_MS), 1);
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

/* One Gate call made by a thread of its own. */
typedef struct gate_call {
    mt_rpc_channel_t *ch;
    int code;
    int gate_was_open; /* g.gate_open when the call returned */
    char msg[256];
} gate_call_t;

static void *gate_thread(void *p) {
    gate_call_t *c = p;
    uint8_t *resp = NULL;
    size_t rl = 0;
    mt_rpc_status_t st;
    mt_rpc_call(c->ch, P_GATE, (const uint8_t *)"g", 1, GUARD_MS, &resp, &rl, &st);
    c->gate_was_open = atomic_load(&g.gate_open);
    c->code = st.code;
    snprintf(c->msg, sizeof(c->msg), "%s", st.message);
    free(resp);
    atomic_fetch_add(&g.calls_done, 1);
    return NULL;
}

/* Polls the stats of @p s until no unary call runs or waits (a thread leaves `running` a
 * moment after its reply left). @returns 1, or 0 after GUARD_MS. */
static int wait_idle(mt_rpc_server_t *s) {
    int64_t end = tu_now_ms() + GUARD_MS;
    mt_rpc_server_stats_t st;
    for (;;) {
        mt_rpc_server_stats(s, &st);
        if (!st.running && !st.queued && !st.streams) return 1;
        if (tu_now_ms() > end) return 0;
        tu_sleep_ms(2);
    }
}

enum { NCALLS = 20 };

Test(rpc_admission, overload_is_refused_at_once_and_health_answers, .timeout = 180) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cfg.threads = 1;
    cfg.max_queued = 2;
    int port;
    mt_rpc_server_t *s = start(&cfg, &port);
    mt_rpc_channel_t *ch = channel("127.0.0.1", port, NULL);
    cr_assert_eq(health(ch, GUARD_MS), 1); /* connected before the burst */
    gate_call_t calls[NCALLS];
    pthread_t th[NCALLS];
    for (int i = 0; i < NCALLS; i++) {
        calls[i] = (gate_call_t){.ch = ch};
        cr_assert_eq(pthread_create(&th[i], NULL, gate_thread, &calls[i]), 0);
    }
    /* The gate is closed: one call holds the only thread and two wait in the queue, so the
     * 17 others can only be answered by being refused while the thread is busy, i.e. at
     * once, not after waiting for it. */
    cr_assert(tu_wait_for(&g.calls_done, NCALLS - 3, GUARD_MS), "%d calls answered",
              atomic_load(&g.calls_done));
    mt_rpc_server_stats_t st;
    mt_rpc_server_stats(s, &st);
    cr_assert_eq(st.running, 1);
    cr_assert_eq(st.queued, 2);
    cr_assert_eq(st.rejected, NCALLS - 3);
    cr_assert_eq(st.rejected_streams, 0);
    cr_assert_eq(atomic_load(&g.gate_started), 1);
    /* Health is answered while the only unary thread is held and the queue is full. */
    cr_assert_eq(health(ch, GUARD_MS), 1);
    char text[2048];
    mt_rpc_server_render_metrics(s, "monolith_test", "shard=\"0\"", text, sizeof(text));
    char want[96];
    snprintf(want, sizeof(want), "monolith_test_rejected_total{shard=\"0\"} %d\n", NCALLS - 3);
    cr_assert(strstr(text, want), "%s", text);
    cr_assert(strstr(text, "monolith_test_queued_calls{shard=\"0\"} 2\n"), "%s", text);
    cr_assert_eq(atomic_load(&g.calls_done), NCALLS - 3, "a held call returned");
    /* Open: the running call and the two queued ones succeed, and nothing else. */
    atomic_store(&g.gate_open, 1);
    for (int i = 0; i < NCALLS; i++)
        pthread_join(th[i], NULL);
    int ok = 0, refused = 0;
    for (int i = 0; i < NCALLS; i++) {
        if (calls[i].code == MT_RPC_OK) {
            ok++;
            cr_assert(calls[i].gate_was_open, "call %d succeeded before the gate opened", i);
        } else {
            cr_assert_eq(calls[i].code, MT_RPC_RESOURCE_EXHAUSTED, "call %d: %d %s", i,
                         calls[i].code, calls[i].msg);
            cr_assert(strstr(calls[i].msg, "server overloaded: 2 calls queued"), "%s",
                      calls[i].msg);
            cr_assert(!calls[i].gate_was_open, "call %d refused after the gate opened", i);
            refused++;
        }
    }
    cr_assert_eq(ok, 3);
    cr_assert_eq(refused, NCALLS - 3);
    cr_assert_eq(atomic_load(&g.gate_started), 3);
    cr_assert(wait_idle(s));
    mt_rpc_server_stats(s, &st);
    cr_assert_eq(st.rejected, (uint64_t)refused);
    cr_assert_eq(st.rejected_streams, 0);
    mt_rpc_server_render_metrics(s, "monolith_test", "shard=\"0\"", text, sizeof(text));
    cr_assert(strstr(text, want), "%s", text);
    cr_assert(strstr(text, "monolith_test_queued_calls{shard=\"0\"} 0\n"), "%s", text);
    /* After the burst the server serves normally. */
    cr_assert_eq(reverse(ch, NULL, 0), MT_RPC_OK);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

Test(rpc_admission, no_queue_refuses_when_the_threads_are_busy, .timeout = 180) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cfg.threads = 1;
    cfg.max_queued = 0;
    int port;
    mt_rpc_server_t *s = start(&cfg, &port);
    mt_rpc_channel_t *ch = channel("127.0.0.1", port, NULL);
    gate_call_t held = {.ch = ch};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, gate_thread, &held), 0);
    cr_assert(tu_wait_for(&g.gate_started, 1, GUARD_MS));
    /* Refused while the thread is held: it did not wait for the thread. */
    char msg[256];
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_RESOURCE_EXHAUSTED, "%s", msg);
    cr_assert(strstr(msg, "server overloaded: 0 calls queued"), "%s", msg);
    cr_assert_eq(atomic_load(&g.calls_done), 0, "the held call returned");
    atomic_store(&g.gate_open, 1);
    pthread_join(th, NULL);
    cr_assert_eq(held.code, MT_RPC_OK, "%s", held.msg);
    /* The thread is free again a moment after its reply left: then a call is admitted. */
    cr_assert(wait_idle(s));
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_OK, "%s", msg);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* A unary method registered MT_RPC_OWN_THREADS (serving's peer Lookup) is answered while
 * every unary thread is held and the queue is full, and counted as a stream; unknown flags
 * are refused. */
Test(rpc_admission, own_thread_methods_are_answered_while_unary_threads_are_busy, .timeout = 180) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cfg.threads = 1;
    cfg.max_queued = 0;
    int port;
    mt_rpc_server_t *s = start(&cfg, &port);
    mt_rpc_channel_t *ch = channel("127.0.0.1", port, NULL);
    gate_call_t held = {.ch = ch};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, gate_thread, &held), 0);
    cr_assert(tu_wait_for(&g.gate_started, 1, GUARD_MS));
    char msg[256];
    cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_RESOURCE_EXHAUSTED, "%s", msg);
    const uint8_t req[] = "monolith";
    for (int i = 0; i < 3; i++) {
        uint8_t *resp = NULL;
        size_t rl = 0;
        mt_rpc_status_t st;
        mt_rpc_call(ch, P_PEER, req, 8, GUARD_MS, &resp, &rl, &st);
        cr_assert_eq(st.code, MT_RPC_OK, "%s", st.message);
        cr_assert_eq(rl, 8);
        cr_assert_eq(memcmp(resp, "htilonom", 8), 0);
        free(resp);
    }
    cr_assert_eq(atomic_load(&g.calls_done), 0, "the held call returned");
    atomic_store(&g.gate_open, 1);
    pthread_join(th, NULL);
    cr_assert_eq(held.code, MT_RPC_OK, "%s", held.msg);
    cr_assert(wait_idle(s));
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
    mt_rpc_server_config_init(&cfg);
    cr_assert_eq(mt_rpc_server_create(&cfg, &s), MT_OK);
    cr_assert_eq(mt_rpc_server_add(s, "/a.B/C", 4, h_reverse, NULL), MT_INVALID);
    cr_assert_eq(mt_rpc_server_add(s, "/a.B/C", MT_RPC_OWN_THREADS, h_reverse, NULL), MT_OK);
    mt_rpc_server_destroy(s);
}

Test(rpc_admission, streams_do_not_starve_unary_calls_and_are_bounded, .timeout = 180) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cfg.threads = 1;
    cfg.max_queued = 4; /* back-to-back calls may find the thread still finishing a reply */
    cfg.max_streams = 3;
    int port;
    mt_rpc_server_t *s = start(&cfg, &port);
    mt_rpc_channel_t *ch = channel("127.0.0.1", port, NULL);
    /* Three long streams, held until g.release: each runs on a thread of its own. */
    mt_rpc_stream_t *st[3];
    for (int i = 0; i < 3; i++) {
        uint8_t b = 0;
        cr_assert_eq(mt_rpc_stream_open(ch, P_HOLD, &b, 1, GUARD_MS, &st[i]), MT_OK);
        uint8_t *buf;
        size_t len;
        cr_assert_eq(mt_rpc_stream_next(st[i], &buf, &len), MT_OK, "stream %d", i);
        free(buf);
    }
    cr_assert_eq(atomic_load(&g.hold_started), 3);
    mt_rpc_server_stats_t ss;
    mt_rpc_server_stats(s, &ss);
    cr_assert_eq(ss.streams, 3);
    /* Unary calls and Health still go through: the streams stay held until the test
     * releases them, so if they held the one unary thread these could not succeed. */
    char msg[256];
    for (int i = 0; i < 5; i++)
        cr_assert_eq(reverse(ch, msg, sizeof(msg)), MT_RPC_OK, "%s", msg);
    cr_assert_eq(health(ch, GUARD_MS), 1);
    /* A fourth stream is refused while the three are still held: at once, not after one
     * of them ended. */
    cr_assert_eq(count_stream(ch, 5), MT_RPC_RESOURCE_EXHAUSTED);
    mt_rpc_server_stats(s, &ss);
    cr_assert_eq(ss.streams, 3);
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
    cr_assert(wait_idle(s));
    cr_assert_eq(count_stream(ch, 5), MT_RPC_OK);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
}

/* A server of one thread and a queue of four, and k threads calling Gate on it. */
typedef struct full_queue {
    mt_rpc_server_t *s;
    mt_rpc_channel_t *ch;
    int k;
    gate_call_t calls[8];
    pthread_t th[8];
    pthread_t shutdown_th;
} full_queue_t;

/* Starts @p q: the server (@p grace_ms to shut down) and @p k threads calling Gate; returns
 * once one call is held in the gate and four wait in the queue. */
static void full_queue_start(full_queue_t *q, uint32_t grace_ms, int k) {
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
    cr_assert_eq(health(q->ch, GUARD_MS), 1);
    for (int i = 0; i < k; i++) {
        q->calls[i] = (gate_call_t){.ch = q->ch};
        cr_assert_eq(pthread_create(&q->th[i], NULL, gate_thread, &q->calls[i]), 0);
    }
    mt_rpc_server_stats_t st;
    int64_t end = tu_now_ms() + GUARD_MS;
    do {
        tu_sleep_ms(2);
        mt_rpc_server_stats(q->s, &st);
    } while (st.queued < 4 && tu_now_ms() < end);
    cr_assert_eq(st.queued, 4);
    cr_assert_eq(st.running, 1);
}

static void *shutdown_thread(void *p) {
    mt_rpc_server_shutdown(p);
    return NULL;
}

/* Shuts @p q's server down on a thread of its own (it waits for the held handler). */
static void full_queue_shutdown(full_queue_t *q) {
    cr_assert_eq(pthread_create(&q->shutdown_th, NULL, shutdown_thread, q->s), 0);
}

/* Opens the gate, waits for the shutdown and the callers of @p q, then frees the channel
 * and the server. */
static void full_queue_end(full_queue_t *q) {
    atomic_store(&g.gate_open, 1);
    pthread_join(q->shutdown_th, NULL);
    for (int i = 0; i < q->k; i++)
        pthread_join(q->th[i], NULL);
    mt_rpc_channel_destroy(q->ch);
    mt_rpc_server_destroy(q->s);
}

Test(rpc_admission, shutdown_with_a_full_queue_answers_and_frees_everything, .timeout = 180) {
    full_queue_t q;
    /* The grace is only a hang guard here: the handlers end when the gate opens. */
    full_queue_start(&q, GUARD_MS, 8); /* one call held, four queued, the rest refused */
    full_queue_shutdown(&q);
    /* The shutdown has begun once Health stops answering SERVING (NOT_SERVING, then
     * UNAVAILABLE): only then is the gate opened, so the queued calls run during it. */
    /* Each probe has a short deadline: a Health call that reaches the server as its
     * shutdown begins can be held until the server is idle, which waits for the gate this
     * loop opens (a busy machine once held one for the whole guard, and the held handler's
     * caller hit its own deadline). No answer at all is not SERVING either. */
    int64_t end = tu_now_ms() + GUARD_MS;
    while (health(q.ch, 2000) == 1 && tu_now_ms() < end)
        tu_sleep_ms(2);
    cr_assert_neq(health(q.ch, 2000), 1, "the shutdown did not begin");
    full_queue_end(&q); /* the running call and the queued ones finish in the grace */
    int ok = 0;
    for (int i = 0; i < q.k; i++) {
        const gate_call_t *c = &q.calls[i];
        /* refused, or (a thread late under load) arrived as the shutdown began: refused by
         * gRPC, or caught between gRPC and a slot and cancelled once the server is idle */
        cr_assert(c->code == MT_RPC_OK || c->code == MT_RPC_RESOURCE_EXHAUSTED ||
                      c->code == MT_RPC_UNAVAILABLE || c->code == MT_RPC_CANCELLED,
                  "call %d: %d %s", i, c->code, c->msg);
        ok += c->code == MT_RPC_OK;
    }
    cr_assert_geq(ok, 5, "the running call and the 4 queued ones are answered");
    cr_assert_geq(atomic_load(&g.gate_started), 5, "the queued calls ran");
}

Test(rpc_admission, shutdown_past_the_grace_does_not_run_queued_calls, .timeout = 180) {
    full_queue_t q;
    full_queue_start(&q, 100, 5);
    full_queue_shutdown(&q);
    /* Past the 100 ms grace every call is cancelled: the four queued ones (and the held
     * one) are answered while the running handler is still held in the gate, so the
     * shutdown did not wait for it (nor for the callers' deadlines) to answer them. */
    cr_assert(tu_wait_for(&g.calls_done, q.k, GUARD_MS), "%d calls answered",
              atomic_load(&g.calls_done));
    cr_assert_eq(atomic_load(&g.gate_started), 1);
    full_queue_end(&q);
    /* The queued calls were cancelled unrun, also after the held handler returned. */
    cr_assert_eq(atomic_load(&g.gate_started), 1);
    for (int i = 0; i < q.k; i++) {
        cr_assert_neq(q.calls[i].code, MT_RPC_OK, "call %d answered OK after cancel_all", i);
        cr_assert_neq(q.calls[i].code, MT_RPC_DEADLINE_EXCEEDED, "call %d: %s", i, q.calls[i].msg);
    }
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
