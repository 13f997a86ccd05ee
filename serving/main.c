/*
 * monolith-serving - a serving replica: Predict and Lookup from its own copy of the
 * parameters, synced from the PS shards (docs/serving.md).
 *
 *   monolith-serving --config FILE [--set section.key=value]... [--listen ADDR]
 *                    [--port-file PATH] [--log-level LEVEL] [--check]
 *   monolith-serving --config-reference        prints every configuration key (Markdown)
 *
 * --check reads and checks the configuration (with the overrides) and exits: 0 if good.
 *
 * What it reads from the one configuration file: [serving] (its own keys), [cluster] ps
 * (the shards it syncs from), [trainer] slots / dim / hidden / hash_buckets (the model's
 * shape: the file that trains also serves; mt_config_derive_trainer_slots() gives the table
 * slots), [table] (parts and pre-size of the replica), joiner.negative_rate (the log-odds
 * correction) and [kafka] bootstrap / bootstrap_file / features_topic (the impression log;
 * not used when serving.log_sample_rate is 0).
 *
 * Start-up: read and check the configuration and the TLS files (an error names the key or
 * the file and exits 2, as --check does), serve monolith.v1.Serving and
 * grpc.health.v1.Health on serving.listen at once (Health NOT_SERVING and Predict
 * UNAVAILABLE until the first dense pull and a first sync of every shard), write the port
 * file, start the sync threads; Prometheus metrics on
 * serving.metrics_listen. SIGTERM or SIGINT: stop taking calls, let in-flight ones finish,
 * stop the sync threads, flush the impression log (up to 5 s), exit 0.
 */
#include <cblas.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mt/config.h"
#include "mt/config_cli.h"
#include "mt/config_rpc.h"
#include "mt/http.h"
#include "mt/jemalloc_conf.h"
#include "mt/kafka.h"
#include "mt/log.h"
#include "mt/process.h"
#include "mt/rpc.h"
#include "mt/serving.h"

#define WHO "serving"

typedef struct daemon {
    mt_config_t cfg;
    mt_serving_t *sv;
    mt_rpc_server_t *srv; /* for /metrics (admission counters); set before the http thread */
    time_t started;
    uint32_t held[64]; /* serving.shards, parsed */
} daemon_t;

static void usage(FILE *f) {
    fprintf(f, "usage: monolith-serving --config FILE [--set section.key=value]...\n"
               "                        [--listen ADDR] [--port-file PATH]\n"
               "                        [--log-level debug|info|warn|error] [--check]\n"
               "       monolith-serving --config-reference\n");
}

/* Resident set size in bytes, from /proc/self/statm (0 if unreadable). */
static unsigned long long rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, rss = 0;
    if (!f) return 0;
    if (fscanf(f, "%llu %llu", &size, &rss) != 2) rss = 0;
    fclose(f);
    return rss * (unsigned long long)sysconf(_SC_PAGESIZE);
}

static int render(void *ud, const char *path, char **body, size_t *len) {
    daemon_t *d = ud;
    if (!strcmp(path, "/healthz")) {
        const char *s = mt_serving_ready(d->sv) ? "ok\n" : "starting\n";
        *body = strdup(s);
        *len = *body ? strlen(s) : 0;
        return mt_serving_ready(d->sv) ? 200 : 503;
    }
    if (strcmp(path, "/metrics") != 0) return 404;
    char extra[4096];
    int n = snprintf(extra, sizeof(extra),
                     "# HELP monolith_serving_resident_bytes Resident memory of the process.\n"
                     "# TYPE monolith_serving_resident_bytes gauge\n"
                     "monolith_serving_resident_bytes %llu\n"
                     "# HELP monolith_serving_uptime_seconds Seconds since start.\n"
                     "# TYPE monolith_serving_uptime_seconds gauge\n"
                     "monolith_serving_uptime_seconds %lld\n",
                     rss_bytes(), (long long)(time(NULL) - d->started));
    if (n > 0 && (size_t)n < sizeof(extra))
        mt_rpc_server_render_metrics(d->srv, "monolith_serving", "", extra + n,
                                     sizeof(extra) - (size_t)n);
    size_t used = strlen(extra);
    mt_process_render_metrics((double)d->started, extra + used, sizeof(extra) - used);
    return mt_serving_render_metrics(d->sv, extra, body, len) == MT_OK ? 200 : 500;
}

/* The library's configuration from the file's. @returns 0 or 2 (bad configuration). */
static int serving_config(const mt_config_t *c, const uint16_t *slots, size_t nslots,
                          uint32_t held[64], mt_serving_config_t *sc, char *err, size_t errlen) {
    mt_serving_config_init(sc);
    uint32_t ns = c->cluster.num_shards ? c->cluster.num_shards : (uint32_t)c->cluster.nps;
    if (c->cluster.nps == 0 || ns != c->cluster.nps) {
        snprintf(err, errlen, "cluster.ps: serving needs the address of every PS shard");
        return 2;
    }
    sc->ps_addrs = (const char *const *)c->cluster.ps;
    sc->num_shards = ns;
    if (nslots == 0) {
        snprintf(err, errlen, "trainer.slots: no feature slots (the model serving scores)");
        return 2;
    }
    sc->nslots = (uint32_t)nslots;
    memcpy(sc->slot_ids, slots, nslots * sizeof(uint16_t));
    if (mt_config_mean_slots(c, slots, nslots, sc->slot_mean, err, errlen) != MT_OK) return 2;
    mt_model_config_t mc;
    if (mt_config_model(c, slots, nslots, sc->slot_dim, &mc, err, errlen) != MT_OK) return 2;
    sc->dim = mc.dim;
    sc->nhidden = mc.nhidden;
    memcpy(sc->hidden, mc.hidden, sizeof(sc->hidden));
    mt_model_family_get(&mc, &sc->family);
    sc->hash_buckets = c->trainer.hash_buckets;
    if (mt_config_slot_hash_buckets(c, slots, nslots, sc->slot_hash_buckets, err, errlen) != MT_OK)
        return 2;
    mt_config_table(c, &sc->table);
    sc->negative_rate = (float)c->joiner.negative_rate;
    sc->sync_interval_ms = c->serving.sync_interval_ms;
    sc->sync_stream_ms = c->serving.sync_stream_ms;
    sc->dense_sync_interval_ms = c->serving.dense_sync_interval_ms;
    sc->sync_timeout_ms = c->serving.sync_timeout_ms;
    sc->max_candidates = c->serving.max_candidates;
    sc->max_request_fids = c->serving.max_request_fids;
    sc->max_message_bytes = (uint32_t)c->serving.max_message_bytes; /* as the rpc server's */
    mt_config_rpc_tls(c, &sc->ps_tls);
    sc->workers = c->serving.threads;
    sc->features_topic = c->kafka.features_topic;
    sc->log_sample_rate = c->serving.log_sample_rate;
    uint64_t h[64];
    size_t nheld = 0;
    if (mt_config_parse_uint_list(c->serving.shards, 0, ns - 1, h, 64, &nheld, err, errlen))
        return 2;
    for (size_t i = 0; i < nheld; i++)
        held[i] = (uint32_t)h[i];
    sc->held_shards = held;
    sc->nheld = (uint32_t)nheld;
    sc->peer_addrs = (const char *const *)c->serving.peers;
    sc->npeers = (uint32_t)c->serving.npeers;
    sc->peer_timeout_ms = c->serving.peer_timeout_ms;
    sc->peer_refresh_ms = c->serving.peer_refresh_ms;
    sc->peer_zeros = c->serving.peer_zeros;
    sc->sync_kafka = c->serving.sync_kafka;
    sc->params_topic = c->kafka.params_topic;
    return 0;
}

/* SIGTERM / SIGINT taken by a thread that does not block them (see main). */
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig) {
    g_stop_signal = sig;
}

int main(int argc, char **argv) {
    daemon_t d;
    memset(&d, 0, sizeof(d));
    d.started = time(NULL);
    char err[1024] = "";
    const char *port_file = NULL;
    int rc = 2;
    mt_rpc_server_t *srv = NULL;
    mt_http_t *http = NULL;
    mt_kafka_producer_t *producer = NULL;
    if (mt_config_init(&d.cfg) != MT_OK) return 1;

    const mt_config_cli_opt_t opts[] = {
        {"--port-file", NULL, &port_file, NULL},
        {"--listen", NULL, NULL, "serving.listen"},
    };
    mt_config_cli_t cli = {
        "monolith-serving", usage, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0};
    if ((rc = mt_config_cli(&cli, &d.cfg, argc, argv)) != MT_CONFIG_CLI_OK) goto out;
    rc = 2;
    const char *config = cli.config;
    int check_only = cli.check;
    uint16_t slots[MT_SERVING_MAX_SLOTS];
    size_t nslots = MT_SERVING_MAX_SLOTS;
    /* the TLS files too, as the server and the PS channels will read them (the server's
     * check covers the channels'): exit 2, with --check or without */
    if (mt_config_derive_trainer_slots(&d.cfg, slots, &nslots, err, sizeof(err)) != MT_OK ||
        mt_config_validate(&d.cfg, err, sizeof(err)) != MT_OK ||
        mt_config_rpc_check_tls(&d.cfg, 1, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-serving: %s: %s\n", config, err);
        goto out;
    }
    mt_serving_config_t sc;
    if (serving_config(&d.cfg, slots, nslots, d.held, &sc, err, sizeof(err))) {
        fprintf(stderr, "monolith-serving: %s: %s\n", config, err);
        goto out;
    }
    if (check_only) {
        /* the library's own checks too (model shape, slots of the model in the table) */
        /* the brokers are not asked here: --check needs no running Kafka */
        if (sc.sync_kafka) sc.kafka_bootstrap = "not-checked:9092";
        mt_err_t e = mt_serving_create(&sc, &d.sv, err, sizeof(err));
        if (e) {
            fprintf(stderr, "monolith-serving: %s: %s\n", config, err);
            rc = e == MT_CONFIG ? 2 : 1;
            goto out;
        }
        printf("%s: ok (%zu feature slots, %u shards)\n", config, nslots, sc.num_shards);
        rc = 0;
        goto out;
    }

    /* Signals are taken by the main loop: block them before any thread of ours starts.
     * OpenBLAS started its threads when the library loaded, before main(), with the signals
     * unblocked: a SIGTERM delivered to one of them would kill the process by the default
     * action (exit 143, no graceful stop). A handler makes that delivery a flag instead. */
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* Concurrent Predicts each run their own sgemm: one BLAS thread per request thread. */
    openblas_set_num_threads(1);

    rc = 1;
    if (d.cfg.serving.log_sample_rate > 0) {
        char bootstrap[8192];
        if (mt_config_kafka_bootstrap(&d.cfg, bootstrap, sizeof(bootstrap), err, sizeof(err))) {
            mt_log(MT_LOG_ERROR, WHO, "%s", err);
            goto out;
        }
        /* lz4: the impressions of one request share their user-side fids */
        const char *pconf[] = {"linger.ms=5", "compression.codec=lz4", NULL};
        if (mt_kafka_producer_create(bootstrap, pconf, &producer, err, sizeof(err)) != MT_OK) {
            mt_log(MT_LOG_ERROR, WHO, "Kafka producer on %s: %s", bootstrap, err);
            goto out;
        }
        sc.producer = producer;
    }
    char params_bootstrap[8192], fetch_wait[64] = "";
    const char *kconf[] = {fetch_wait, NULL};
    if (sc.sync_kafka) {
        if (mt_config_kafka_bootstrap(&d.cfg, params_bootstrap, sizeof(params_bootstrap), err,
                                      sizeof(err))) {
            mt_log(MT_LOG_ERROR, WHO, "serving.sync_source = kafka: %s", err);
            goto out;
        }
        sc.kafka_bootstrap = params_bootstrap;
        snprintf(fetch_wait, sizeof(fetch_wait), "fetch.wait.max.ms=%u", d.cfg.kafka.fetch_wait_ms);
        sc.kafka_conf = kconf;
    }
    mt_err_t e = mt_serving_create(&sc, &d.sv, err, sizeof(err));
    if (e) {
        mt_log(MT_LOG_ERROR, WHO, "cannot create the service: %s: %s", mt_strerror(e), err);
        rc = e == MT_CONFIG ? 2 : 1;
        goto out;
    }
    mt_rpc_server_config_t rcfg;
    mt_rpc_server_config_init(&rcfg);
    rcfg.listen = d.cfg.serving.listen;
    rcfg.threads = d.cfg.serving.threads;
    rcfg.max_message_bytes = (uint32_t)d.cfg.serving.max_message_bytes;
    rcfg.max_queued = d.cfg.serving.max_queued_calls;
    /* peers' Lookups run on the stream threads (mt_serving_register): as many as the peers'
     * Predict threads may send at once, within reason */
    rcfg.max_streams = d.cfg.serving.threads * 4 > 8 ? d.cfg.serving.threads * 4 : 8;
    if (rcfg.max_streams > 256) rcfg.max_streams = 256;
    mt_config_rpc_tls(&d.cfg, &rcfg.tls);
    int port = 0;
    if ((e = mt_rpc_server_create(&rcfg, &srv)) != MT_OK ||
        (e = mt_serving_register(d.sv, srv)) != MT_OK ||
        (e = mt_rpc_server_start(srv, &port)) != MT_OK) {
        mt_log(MT_LOG_ERROR, WHO, "cannot serve on %s: %s", d.cfg.serving.listen, mt_strerror(e));
        goto out;
    }
    d.srv = srv;
    if (*d.cfg.serving.metrics_listen) {
        int mport = 0;
        if (mt_http_start(d.cfg.serving.metrics_listen, render, &d, &mport, &http) != MT_OK) {
            mt_log(MT_LOG_ERROR, WHO, "cannot serve metrics on %s", d.cfg.serving.metrics_listen);
            goto out;
        }
        mt_log(MT_LOG_INFO, WHO, "metrics on port %d", mport);
    }
    if ((e = mt_serving_start(d.sv)) != MT_OK) {
        mt_log(MT_LOG_ERROR, WHO, "cannot start the sync threads: %s", mt_strerror(e));
        goto out;
    }
    mt_log(MT_LOG_INFO, WHO,
           "serving on port %d: %u shards, sync every %u ms, dense every %u ms, logging %.3g of "
           "requests",
           port, sc.num_shards, sc.sync_interval_ms, sc.dense_sync_interval_ms,
           producer ? sc.log_sample_rate : 0.0);
    if (port_file) {
        FILE *f = fopen(port_file, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0) {
            mt_log(MT_LOG_ERROR, WHO, "cannot write %s: %s", port_file, strerror(errno));
            goto out;
        }
    }
    int sig = 0;
    while (!sig) {
        struct timespec tick = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
        int s = sigtimedwait(&sigs, NULL, &tick);
        if (s == SIGTERM || s == SIGINT)
            sig = s;
        else if (g_stop_signal)
            sig = (int)g_stop_signal;
    }
    mt_log(MT_LOG_INFO, WHO, "%s: finishing in-flight calls",
           sig == SIGTERM ? "SIGTERM" : "SIGINT");
    mt_rpc_server_shutdown(srv);
    mt_serving_stop(d.sv);
    rc = 0;
    mt_log(MT_LOG_INFO, WHO, "stopped");
out:
    mt_http_stop(http);
    mt_rpc_server_destroy(srv);
    mt_serving_destroy(d.sv);
    mt_kafka_producer_destroy(producer);
    mt_config_free(&d.cfg);
    return rc;
}
