/*
 * rpc_bench - the price of the rpc layer's security and admission (issue #7), in process
 * over loopback: one server (4 threads) with an empty unary method, plaintext and TLS
 * (throwaway certificates made with the openssl CLI, as the tests do), then one JSON object
 * per line:
 *
 *   - empty_call: one empty call at a time on a connected channel: p50/p99 (us);
 *   - empty_calls_8: 8 client threads on one channel, calls/s;
 *   - connect: a new channel's first call (TCP connect, the HTTP/2 preface and, with TLS,
 *     the handshake): p50 (ms);
 *   - overload: 1 thread, max_queued 4, a 2 ms handler, 32 client threads calling without
 *     pause: calls/s served, share refused RESOURCE_EXHAUSTED and the p99 of a refusal
 *     (how fast "no" is).
 *
 *   rpc_bench [--quick]
 *
 * Never asserts on time. Client and server share the machine's cores.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "mt/clock.h"
#include "mt/rpc.h"
#include "tls_certs.h"

#define P_EMPTY "/mt.bench.Rpc/Empty"
#define P_SLOW  "/mt.bench.Rpc/Slow"

static char dir[64];

static void emit(const char *metric, double v, const char *unit, const char *extra) {
    mt_bench_emit("rpc", metric, v, unit, extra);
}

static void h_empty(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)ud;
    (void)req;
    (void)len;
    mt_rpc_reply(c, NULL, 0);
}

static void h_slow(void *ud, mt_rpc_call_t *c, const uint8_t *req, size_t len) {
    (void)ud;
    (void)req;
    (void)len;
    struct timespec ts = {0, 2000000L};
    nanosleep(&ts, NULL);
    mt_rpc_reply(c, NULL, 0);
}

static mt_rpc_tls_config_t tls_server(int on) {
    mt_rpc_tls_config_t t = {0};
    if (!on) return t;
    t.enabled = 1;
    t.cert_file = tls_path(dir, "server.pem");
    t.key_file = tls_path(dir, "server.key");
    return t;
}

static mt_rpc_tls_config_t tls_client(int on) {
    mt_rpc_tls_config_t t = {0};
    if (!on) return t;
    t.enabled = 1;
    t.ca_file = tls_path(dir, "ca.pem");
    return t;
}

static mt_rpc_server_t *server(int tls, uint32_t threads, uint32_t max_queued, int *port) {
    mt_rpc_server_config_t cfg;
    mt_rpc_server_config_init(&cfg);
    cfg.threads = threads;
    cfg.max_queued = max_queued;
    cfg.tls = tls_server(tls);
    mt_rpc_server_t *s = NULL;
    if (mt_rpc_server_create(&cfg, &s) != MT_OK ||
        mt_rpc_server_add(s, P_EMPTY, 0, h_empty, NULL) != MT_OK ||
        mt_rpc_server_add(s, P_SLOW, 0, h_slow, NULL) != MT_OK ||
        mt_rpc_server_start(s, port) != MT_OK) {
        fprintf(stderr, "rpc_bench: cannot start the server\n");
        exit(1);
    }
    return s;
}

static mt_rpc_channel_t *channel(int tls, int port) {
    mt_rpc_client_config_t cc;
    mt_rpc_client_config_init(&cc);
    cc.retries = 0;
    cc.tls = tls_client(tls);
    char target[64];
    snprintf(target, sizeof(target), "127.0.0.1:%d", port);
    mt_rpc_channel_t *ch = NULL;
    if (mt_rpc_channel_create(target, &cc, &ch) != MT_OK) {
        fprintf(stderr, "rpc_bench: cannot create a channel\n");
        exit(1);
    }
    return ch;
}

/* One call; @returns its status code. */
static int call(mt_rpc_channel_t *ch, const char *path) {
    uint8_t *resp = NULL;
    size_t rl = 0;
    mt_rpc_status_t st;
    mt_rpc_call(ch, path, NULL, 0, 10000, &resp, &rl, &st);
    free(resp);
    return st.code;
}

typedef struct worker {
    mt_rpc_channel_t *ch;
    const char *path;
    double until;
    long ok, refused, other;
    double *refuse_s; /* latencies of refusals */
    size_t nrefuse, caprefuse;
} worker_t;

static void *worker_main(void *p) {
    worker_t *w = p;
    while (mt_mono_s() < w->until) {
        double t0 = mt_mono_s();
        int code = call(w->ch, w->path);
        double dt = mt_mono_s() - t0;
        if (code == MT_RPC_OK) {
            w->ok++;
        } else if (code == MT_RPC_RESOURCE_EXHAUSTED) {
            w->refused++;
            if (w->nrefuse < w->caprefuse) w->refuse_s[w->nrefuse++] = dt;
        } else {
            w->other++;
        }
    }
    return NULL;
}

/* n threads calling @p path on @p ch for @p secs; sums into *tot. */
static void run_threads(mt_rpc_channel_t *ch, const char *path, int n, double secs, worker_t *tot,
                        double **refuse, size_t *nrefuse) {
    worker_t *w = calloc((size_t)n, sizeof(*w));
    pthread_t *th = calloc((size_t)n, sizeof(*th));
    double until = mt_mono_s() + secs;
    for (int i = 0; i < n; i++) {
        w[i] = (worker_t){.ch = ch, .path = path, .until = until, .caprefuse = 100000};
        w[i].refuse_s = malloc(w[i].caprefuse * sizeof(double));
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    memset(tot, 0, sizeof(*tot));
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        total += w[i].nrefuse;
    }
    double *all = malloc((total ? total : 1) * sizeof(double));
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        tot->ok += w[i].ok;
        tot->refused += w[i].refused;
        tot->other += w[i].other;
        memcpy(all + k, w[i].refuse_s, w[i].nrefuse * sizeof(double));
        k += w[i].nrefuse;
        free(w[i].refuse_s);
    }
    *refuse = all;
    *nrefuse = total;
    free(w);
    free(th);
}

int main(int argc, char **argv) {
    mt_bench_run_conditions("rpc");
    int quick = argc > 1 && !strcmp(argv[1], "--quick");
    int ncalls = quick ? 2000 : 20000, nconnect = quick ? 10 : 50;
    double secs = quick ? 1.0 : 5.0;
    if (tls_certs_make(dir, sizeof(dir)) != 0) {
        fprintf(stderr, "rpc_bench: openssl failed (see %s/openssl.log)\n", dir);
        return 1;
    }
    double *lat = malloc((size_t)ncalls * sizeof(double));
    for (int tls = 0; tls < 2; tls++) {
        const char *mode = tls ? "\"transport\":\"tls\"" : "\"transport\":\"plaintext\"";
        int port;
        mt_rpc_server_t *s = server(tls, 4, 16, &port);
        mt_rpc_channel_t *ch = channel(tls, port);
        for (int i = 0; i < 200; i++) /* connect and warm up */
            call(ch, P_EMPTY);
        for (int i = 0; i < ncalls; i++) {
            double t0 = mt_mono_s();
            call(ch, P_EMPTY);
            lat[i] = (mt_mono_s() - t0) * 1e6;
        }
        double p50 = mt_bench_pct(lat, (size_t)ncalls, 0.5),
               p99 = mt_bench_pct(lat, (size_t)ncalls, 0.99);
        char extra[160];
        snprintf(extra, sizeof(extra), "%s,\"p99_us\":%.1f,\"calls\":%d", mode, p99, ncalls);
        emit("empty_call_p50_us", p50, "us", extra);
        worker_t tot;
        double *rf;
        size_t nrf;
        run_threads(ch, P_EMPTY, 8, secs, &tot, &rf, &nrf);
        free(rf);
        snprintf(extra, sizeof(extra), "%s,\"in_flight\":8,\"errors\":%ld", mode,
                 tot.refused + tot.other);
        emit("empty_calls_per_s", (double)tot.ok / secs, "calls/s", extra);
        mt_rpc_channel_destroy(ch);
        for (int i = 0; i < nconnect; i++) {
            double t0 = mt_mono_s();
            mt_rpc_channel_t *c2 = channel(tls, port);
            call(c2, P_EMPTY);
            lat[i] = (mt_mono_s() - t0) * 1e3;
            mt_rpc_channel_destroy(c2);
        }
        snprintf(extra, sizeof(extra), "%s,\"channels\":%d", mode, nconnect);
        emit("connect_first_call_p50_ms", mt_bench_pct(lat, (size_t)nconnect, 0.5), "ms", extra);
        mt_rpc_server_destroy(s);
    }
    /* Overload: far more callers than 1 thread + 4 queued. */
    int port;
    mt_rpc_server_t *s = server(0, 1, 4, &port);
    mt_rpc_channel_t *ch = channel(0, port);
    call(ch, P_EMPTY);
    worker_t tot;
    double *rf;
    size_t nrf;
    run_threads(ch, P_SLOW, 32, secs, &tot, &rf, &nrf);
    mt_rpc_server_stats_t st;
    mt_rpc_server_stats(s, &st);
    char extra[256];
    double all = (double)(tot.ok + tot.refused + tot.other);
    snprintf(extra, sizeof(extra),
             "\"threads\":1,\"max_queued\":4,\"handler_ms\":2,\"callers\":32,"
             "\"refused_share\":%.3f,\"refusal_p50_us\":%.1f,\"refusal_p99_us\":%.1f,"
             "\"server_rejected\":%llu,\"other_errors\":%ld",
             all > 0 ? (double)tot.refused / all : 0.0, mt_bench_pct(rf, nrf, 0.5) * 1e6,
             mt_bench_pct(rf, nrf, 0.99) * 1e6, (unsigned long long)st.rejected, tot.other);
    emit("overload_served_per_s", (double)tot.ok / secs, "calls/s", extra);
    free(rf);
    mt_rpc_channel_destroy(ch);
    mt_rpc_server_destroy(s);
    free(lat);
    tls_certs_remove(dir);
    return 0;
}
