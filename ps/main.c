/*
 * monolith-ps - one parameter-server shard.
 *
 *   monolith-ps --config FILE [--shard I] [--num-shards N] [--listen ADDR]
 *               [--set section.key=value]... [--port-file PATH] [--log-level LEVEL] [--check]
 *   monolith-ps --config-reference        prints every configuration key (Markdown)
 *
 * --check reads and checks the configuration (with the overrides) and exits: 0 if good.
 *
 * Start-up: read and check the configuration (any error names the key and exits 2), start
 * serving monolith.v1.ParameterServer and grpc.health.v1.Health on ps.listen (every method
 * answers UNAVAILABLE and Health NOT_SERVING meanwhile), restore the newest complete
 * snapshot from ps.snapshot_dir if there is one, then take calls; Prometheus metrics on
 * ps.metrics_listen. The main thread handles signals and the clocks: an expiry
 * tick every ps.expire_interval_ms (bounded work) and a snapshot every
 * ps.snapshot_interval_s. SIGTERM or SIGINT: stop taking calls, let in-flight ones finish,
 * write a last snapshot, exit 0.
 *
 * Snapshot layout in the store: table "sparse" (mt_table_save stream) and a metadata blob:
 *   u32 n, n bytes of CheckpointMeta (protobuf), then DenseState (protobuf) to the end.
 * The store commits a checkpoint only once all of it is durable, so a crash mid-snapshot
 * leaves the previous one in place (see store/include/mt/store.h).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "monolith/v1/ps.pb-c.h"
#include "mt/clock.h"
#include "mt/config.h"
#include "mt/http.h"
#include "mt/jemalloc_conf.h"
#include "mt/log.h"
#include "mt/ps.h"
#include "mt/rpc.h"
#include "mt/store.h"

#define WHO    "ps"
#define SPARSE "sparse"

/* Daemon state: lives in main's frame; the snapshot hook and the metrics thread borrow it. */
typedef struct daemon {
    mt_config_t cfg;
    mt_ps_t *ps;
    mt_store_t *store;
    pthread_mutex_t snap_lock; /* one snapshot at a time (RPC, timer, shutdown) */
    uint64_t last_id;
    double last_snap_s;
    uint64_t snapshots, snapshot_failures;
    time_t started;
} daemon_t;

static void usage(FILE *f) {
    fprintf(f, "usage: monolith-ps --config FILE [--shard I] [--num-shards N] [--listen ADDR]\n"
               "                   [--set section.key=value]... [--port-file PATH]\n"
               "                   [--log-level debug|info|warn|error] [--check]\n"
               "       monolith-ps --config-reference\n");
}

/* ---------------- snapshots ---------------- */

static mt_err_t snapshot(daemon_t *d, uint64_t want_id, uint64_t *id_out, uint64_t *rows,
                         uint64_t *bytes, double *secs) {
    char err[512] = "";
    mt_err_t rc = MT_OK;
    uint8_t *dense = NULL, *meta = NULL;
    size_t dense_len = 0;
    pthread_mutex_lock(&d->snap_lock);
    uint64_t cur = 0;
    mt_err_t e = mt_store_current(d->store, &cur, err, sizeof(err));
    if (e && e != MT_NOT_FOUND) {
        rc = e;
        goto out;
    }
    uint64_t id = want_id > cur ? want_id : cur + 1;
    rc = mt_ps_dense_save(d->ps, &dense, &dense_len);
    if (rc) goto out;
    mt_table_stats_t ts;
    mt_table_stats(mt_ps_table(d->ps), &ts);
    Monolith__V1__CheckpointMeta cm = MONOLITH__V1__CHECKPOINT_META__INIT;
    cm.checkpoint_id = id;
    cm.shard = d->cfg.ps.shard;
    cm.num_shards = d->cfg.cluster.num_shards
                        ? d->cfg.cluster.num_shards
                        : (d->cfg.cluster.nps ? (uint32_t)d->cfg.cluster.nps : 1);
    cm.created_ms = (int64_t)time(NULL) * 1000;
    cm.table_version = ts.version;
    size_t cml = monolith__v1__checkpoint_meta__get_packed_size(&cm);
    size_t mlen = 4 + cml + dense_len;
    meta = malloc(mlen);
    if (!meta) {
        rc = MT_NOMEM;
        goto out;
    }
    for (int i = 0; i < 4; i++)
        meta[i] = (uint8_t)(cml >> (8 * i));
    monolith__v1__checkpoint_meta__pack(&cm, meta + 4);
    memcpy(meta + 4 + cml, dense, dense_len);
    mt_store_table_t t = {SPARSE, mt_ps_table(d->ps)};
    mt_store_result_t res;
    rc = mt_store_save(d->store, id, &t, 1, meta, mlen, &res, err, sizeof(err));
    if (rc) goto out;
    d->last_id = id;
    d->last_snap_s = res.seconds;
    d->snapshots++;
    mt_log(MT_LOG_INFO, WHO, "snapshot %llu: %llu rows, %llu bytes in %.3f s",
           (unsigned long long)id, (unsigned long long)res.rows, (unsigned long long)res.bytes,
           res.seconds);
    if (id_out) *id_out = id;
    if (rows) *rows = res.rows;
    if (bytes) *bytes = res.bytes;
    if (secs) *secs = res.seconds;
out:
    if (rc) {
        d->snapshot_failures++;
        mt_log(MT_LOG_ERROR, WHO, "snapshot failed: %s%s%s", mt_strerror(rc), *err ? ": " : "",
               err);
    }
    pthread_mutex_unlock(&d->snap_lock);
    free(dense);
    free(meta);
    return rc;
}

static mt_err_t snapshot_hook(void *ud, uint64_t want, uint64_t *id, uint64_t *rows,
                              uint64_t *bytes, double *secs) {
    return snapshot(ud, want, id, rows, bytes, secs);
}

/* Restores the newest snapshot into a new table; *table stays NULL if there is none. */
static mt_err_t restore(daemon_t *d, const mt_table_config_t *tc, mt_table_t **table,
                        uint8_t **dense, size_t *dense_len) {
    char err[512] = "";
    uint64_t id = 0;
    void *meta = NULL;
    size_t mlen = 0;
    *table = NULL;
    mt_err_t rc = mt_store_load_meta(d->store, &id, &meta, &mlen, err, sizeof(err));
    if (rc == MT_NOT_FOUND) {
        mt_log(MT_LOG_INFO, WHO, "no snapshot in %s: starting empty", d->cfg.ps.snapshot_dir);
        return MT_OK;
    }
    if (rc) goto fail;
    double t0 = mt_mono_s();
    rc = mt_store_load_table(d->store, id, SPARSE, tc, table, err, sizeof(err));
    if (rc) goto fail;
    const uint8_t *m = meta;
    size_t cml = mlen >= 4
                     ? (size_t)m[0] | (size_t)m[1] << 8 | (size_t)m[2] << 16 | (size_t)m[3] << 24
                     : SIZE_MAX;
    if (cml > mlen - 4) {
        rc = MT_CORRUPT;
        snprintf(err, sizeof(err), "checkpoint %llu: bad metadata", (unsigned long long)id);
        goto fail;
    }
    Monolith__V1__CheckpointMeta *cm = monolith__v1__checkpoint_meta__unpack(NULL, cml, m + 4);
    if (!cm || cm->shard != d->cfg.ps.shard) {
        rc = cm ? MT_MISMATCH : MT_CORRUPT;
        snprintf(err, sizeof(err), "checkpoint %llu belongs to shard %u, this is shard %u",
                 (unsigned long long)id, cm ? cm->shard : 0, d->cfg.ps.shard);
        if (cm) monolith__v1__checkpoint_meta__free_unpacked(cm, NULL);
        goto fail;
    }
    monolith__v1__checkpoint_meta__free_unpacked(cm, NULL);
    *dense_len = mlen - 4 - cml;
    *dense = malloc(*dense_len ? *dense_len : 1);
    if (!*dense) {
        rc = MT_NOMEM;
        goto fail;
    }
    memcpy(*dense, m + 4 + cml, *dense_len);
    mt_table_stats_t ts;
    mt_table_stats(*table, &ts);
    d->last_id = id;
    mt_log(MT_LOG_INFO, WHO, "restored snapshot %llu: %llu rows in %.3f s", (unsigned long long)id,
           (unsigned long long)ts.rows, mt_mono_s() - t0);
    free(meta);
    return MT_OK;
fail:
    mt_log(MT_LOG_ERROR, WHO, "cannot restore from %s: %s%s%s", d->cfg.ps.snapshot_dir,
           mt_strerror(rc), *err ? ": " : "", err);
    mt_table_destroy(*table);
    *table = NULL;
    free(meta);
    return rc;
}

/* ---------------- metrics ---------------- */

static int render(void *ud, const char *path, char **body, size_t *len) {
    daemon_t *d = ud;
    if (!strcmp(path, "/healthz")) {
        *body = strdup("ok\n");
        *len = *body ? 3 : 0;
        return 200;
    }
    if (strcmp(path, "/metrics") != 0) return 404;
    char extra[1024];
    pthread_mutex_lock(&d->snap_lock);
    snprintf(extra, sizeof(extra),
             "# HELP monolith_ps_snapshots_total Snapshots written.\n"
             "# TYPE monolith_ps_snapshots_total counter\n"
             "monolith_ps_snapshots_total{shard=\"%u\"} %llu\n"
             "# HELP monolith_ps_snapshot_failures_total Snapshots that failed.\n"
             "# TYPE monolith_ps_snapshot_failures_total counter\n"
             "monolith_ps_snapshot_failures_total{shard=\"%u\"} %llu\n"
             "# HELP monolith_ps_snapshot_seconds Duration of the last snapshot.\n"
             "# TYPE monolith_ps_snapshot_seconds gauge\n"
             "monolith_ps_snapshot_seconds{shard=\"%u\"} %.6f\n"
             "# HELP monolith_ps_last_checkpoint_id Id of the last snapshot written or restored.\n"
             "# TYPE monolith_ps_last_checkpoint_id gauge\n"
             "monolith_ps_last_checkpoint_id{shard=\"%u\"} %llu\n"
             "# HELP monolith_ps_uptime_seconds Seconds since start.\n"
             "# TYPE monolith_ps_uptime_seconds gauge\n"
             "monolith_ps_uptime_seconds{shard=\"%u\"} %lld\n",
             d->cfg.ps.shard, (unsigned long long)d->snapshots, d->cfg.ps.shard,
             (unsigned long long)d->snapshot_failures, d->cfg.ps.shard, d->last_snap_s,
             d->cfg.ps.shard, (unsigned long long)d->last_id, d->cfg.ps.shard,
             (long long)(time(NULL) - d->started));
    pthread_mutex_unlock(&d->snap_lock);
    return mt_ps_render_metrics(d->ps, extra, body, len) == MT_OK ? 200 : 500;
}

/* ---------------- main ---------------- */

int main(int argc, char **argv) {
    daemon_t d;
    memset(&d, 0, sizeof(d));
    d.started = time(NULL);
    pthread_mutex_init(&d.snap_lock, NULL);
    char err[1024];
    const char *config = NULL, *port_file = NULL;
    int rc = 2, check_only = 0;
    mt_rpc_server_t *srv = NULL;
    mt_http_t *http = NULL;
    mt_table_t *table = NULL;
    uint8_t *dense = NULL;
    size_t dense_len = 0;
    if (mt_config_init(&d.cfg) != MT_OK) return 1;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        mt_err_t e = MT_OK;
        if (!strcmp(a, "--config-reference")) {
            mt_config_write_reference(stdout);
            mt_config_free(&d.cfg);
            return 0;
        } else if (!strcmp(a, "--check")) {
            check_only = 1;
            continue;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            mt_config_free(&d.cfg);
            return 0;
        } else if (!v) {
            fprintf(stderr, "monolith-ps: %s needs a value\n", a);
            usage(stderr);
            goto out;
        } else if (!strcmp(a, "--config")) {
            config = v;
        } else if (!strcmp(a, "--port-file")) {
            port_file = v;
        } else if (!strcmp(a, "--log-level")) {
            mt_log_level_t lv;
            if (mt_log_parse_level(v, &lv) != 0) {
                fprintf(stderr, "monolith-ps: --log-level: '%s' is not debug, info, warn, error\n",
                        v);
                goto out;
            }
            mt_log_set_level(lv);
        } else if (strcmp(a, "--shard") && strcmp(a, "--num-shards") && strcmp(a, "--listen") &&
                   strcmp(a, "--set")) {
            fprintf(stderr, "monolith-ps: unknown option %s\n", a);
            usage(stderr);
            goto out;
        }
        (void)e;
        i++;
    }
    if (!config) {
        fprintf(stderr, "monolith-ps: --config FILE is required\n");
        usage(stderr);
        goto out;
    }
    if (mt_config_load_file(&d.cfg, config, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-ps: %s\n", err);
        goto out;
    }
    /* Command-line overrides, after the file, in order. */
    for (int i = 1; i + 1 < argc; i++) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "--check")) continue; /* the one option without a value here */
        i++;
        mt_err_t e = MT_OK;
        if (!strcmp(a, "--shard"))
            e = mt_config_set(&d.cfg, "ps.shard", v, err, sizeof(err));
        else if (!strcmp(a, "--num-shards"))
            e = mt_config_set(&d.cfg, "cluster.num_shards", v, err, sizeof(err));
        else if (!strcmp(a, "--listen"))
            e = mt_config_set(&d.cfg, "ps.listen", v, err, sizeof(err));
        else if (!strcmp(a, "--set"))
            e = mt_config_set_arg(&d.cfg, v, err, sizeof(err));
        if (e) {
            fprintf(stderr, "monolith-ps: %s %s: %s\n", a, v, err);
            goto out;
        }
    }
    /* the table slots of the trainer's model, when the file configures one ([trainer]) */
    if (mt_config_derive_trainer_slots(&d.cfg, NULL, NULL, err, sizeof(err)) != MT_OK ||
        mt_config_validate(&d.cfg, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-ps: %s: %s\n", config, err);
        goto out;
    }
    if (check_only) {
        printf("%s: ok (%zu slots)\n", config, d.cfg.nslots);
        rc = 0;
        goto out;
    }

    /* Signals are taken by the main loop only: block them before any thread starts. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    rc = 1;
    mt_ps_config_t pc;
    mt_ps_config_init(&pc);
    pc.shard = d.cfg.ps.shard;
    pc.num_shards = d.cfg.cluster.num_shards
                        ? d.cfg.cluster.num_shards
                        : (d.cfg.cluster.nps ? (uint32_t)d.cfg.cluster.nps : 1);
    mt_config_table(&d.cfg, &pc.table);
    pc.dense.opt = d.cfg.dense.opt;
    pc.dense.lr = d.cfg.dense.lr;
    pc.dense.beta1 = d.cfg.dense.beta1;
    pc.dense.beta2 = d.cfg.dense.beta2;
    pc.dense.eps = d.cfg.dense.eps;
    pc.dense.init_accum = d.cfg.dense.init_accum;
    pc.max_batch_fids = d.cfg.ps.max_batch_fids;
    pc.sync_chunk_fids = d.cfg.ps.sync_chunk_fids;
    pc.admin_token = d.cfg.ps.admin_token;

    /* Serve at once, answering UNAVAILABLE (Health: NOT_SERVING) while a snapshot loads. */
    mt_err_t e = mt_ps_create(&pc, NULL, &d.ps);
    if (e) {
        mt_log(MT_LOG_ERROR, WHO, "cannot create the shard: %s", mt_strerror(e));
        goto out;
    }
    mt_ps_set_restoring(d.ps, 1);
    mt_rpc_server_config_t rcfg;
    mt_rpc_server_config_init(&rcfg);
    rcfg.listen = d.cfg.ps.listen;
    rcfg.threads = d.cfg.ps.threads;
    rcfg.max_message_bytes = (uint32_t)d.cfg.ps.max_message_bytes;
    int port = 0;
    if ((e = mt_rpc_server_create(&rcfg, &srv)) != MT_OK ||
        (e = mt_ps_register(d.ps, srv)) != MT_OK) {
        mt_log(MT_LOG_ERROR, WHO, "cannot serve on %s: %s", d.cfg.ps.listen, mt_strerror(e));
        goto out;
    }
    mt_rpc_server_set_serving(srv, 0);
    if ((e = mt_rpc_server_start(srv, &port)) != MT_OK) {
        mt_log(MT_LOG_ERROR, WHO, "cannot serve on %s: %s", d.cfg.ps.listen, mt_strerror(e));
        goto out;
    }
    if (*d.cfg.ps.snapshot_dir) {
        mt_store_config_t sc;
        mt_store_config_init(&sc);
        sc.keep = d.cfg.ps.snapshot_keep;
        if (mt_store_open(d.cfg.ps.snapshot_dir, &sc, &d.store, err, sizeof(err)) != MT_OK) {
            mt_log(MT_LOG_ERROR, WHO, "cannot open snapshot store %s: %s", d.cfg.ps.snapshot_dir,
                   err);
            goto out;
        }
        if (restore(&d, &pc.table, &table, &dense, &dense_len) != MT_OK) goto out;
        if (table && mt_ps_replace_table(d.ps, table) != MT_OK) goto out;
        table = NULL; /* owned by the service now */
        if (dense && mt_ps_dense_load(d.ps, dense, dense_len) != MT_OK) {
            mt_log(MT_LOG_ERROR, WHO, "snapshot %llu: dense parameters are corrupt",
                   (unsigned long long)d.last_id);
            goto out;
        }
        mt_ps_set_snapshot_fn(d.ps, snapshot_hook, &d);
    }
    mt_ps_set_restoring(d.ps, 0);
    mt_rpc_server_set_serving(srv, 1);
    if (*d.cfg.ps.metrics_listen) {
        int mport = 0;
        if (mt_http_start(d.cfg.ps.metrics_listen, render, &d, &mport, &http) != MT_OK) {
            mt_log(MT_LOG_ERROR, WHO, "cannot serve metrics on %s", d.cfg.ps.metrics_listen);
            goto out;
        }
        mt_log(MT_LOG_INFO, WHO, "metrics on port %d", mport);
    }
    mt_log(MT_LOG_INFO, WHO, "shard %u of %u serving on port %d", pc.shard, pc.num_shards, port);
    if (port_file) {
        FILE *f = fopen(port_file, "w");
        if (!f || fprintf(f, "%d\n", port) < 0 || fclose(f) != 0) {
            mt_log(MT_LOG_ERROR, WHO, "cannot write %s: %s", port_file, strerror(errno));
            goto out;
        }
    }

    /* The clocks: expiry ticks and periodic snapshots, until SIGTERM/SIGINT. */
    double next_expire = mt_mono_s(), next_snap = mt_mono_s() + d.cfg.ps.snapshot_interval_s;
    int sig = 0;
    while (!sig) {
        struct timespec wait = {0, 100 * 1000000L};
        int s = sigtimedwait(&sigs, NULL, &wait);
        if (s == SIGTERM || s == SIGINT) {
            sig = s;
            break;
        }
        double t = mt_mono_s();
        if (d.cfg.ps.expire_interval_ms && t >= next_expire) {
            uint64_t ev = mt_ps_expire_tick(d.ps, (uint32_t)time(NULL),
                                            (size_t)d.cfg.ps.expire_buckets_per_tick);
            if (ev) mt_log(MT_LOG_DEBUG, WHO, "expired %llu rows", (unsigned long long)ev);
            next_expire = t + d.cfg.ps.expire_interval_ms / 1000.0;
        }
        if (d.store && d.cfg.ps.snapshot_interval_s && t >= next_snap) {
            snapshot(&d, 0, NULL, NULL, NULL, NULL);
            next_snap = mt_mono_s() + d.cfg.ps.snapshot_interval_s;
        }
    }
    mt_log(MT_LOG_INFO, WHO, "%s: finishing in-flight calls",
           sig == SIGTERM ? "SIGTERM" : "SIGINT");
    mt_rpc_server_shutdown(srv);
    rc = 0;
    if (d.store && snapshot(&d, 0, NULL, NULL, NULL, NULL) != MT_OK) rc = 1;
    mt_log(MT_LOG_INFO, WHO, "stopped");
out:
    mt_http_stop(http);
    mt_rpc_server_destroy(srv);
    mt_ps_destroy(d.ps);
    mt_table_destroy(table);
    mt_store_close(d.store);
    free(dense);
    mt_config_free(&d.cfg);
    pthread_mutex_destroy(&d.snap_lock);
    return rc;
}
