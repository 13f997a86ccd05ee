/*
 * monolith-ps - one parameter-server shard.
 *
 *   monolith-ps --config FILE [--shard I] [--num-shards N] [--listen ADDR]
 *               [--set section.key=value]... [--port-file PATH] [--log-level LEVEL] [--check]
 *   monolith-ps --config-reference        prints every configuration key (Markdown)
 *
 * --check reads and checks the configuration (with the overrides) and exits: 0 if good.
 * --drop-checkpoint ID deletes checkpoint ID and every one above it from ps.snapshot_dir
 * (the shard must be stopped) and exits: the way past a damaged checkpoint, which the shard
 * refuses to start from (the refusal names the checkpoint and this command; docs/ps.md).
 *
 * Start-up: read and check the configuration (any error names the key and exits 2), start
 * serving monolith.v1.ParameterServer and grpc.health.v1.Health on ps.listen (every method
 * answers UNAVAILABLE and Health NOT_SERVING meanwhile), restore the newest complete
 * snapshot from ps.snapshot_dir if there is one, then take calls; Prometheus metrics on
 * ps.metrics_listen. The main thread handles signals and the clocks: an expiry
 * tick every ps.expire_interval_ms (bounded work) and a snapshot every
 * ps.snapshot_interval_s. SIGTERM or SIGINT: stop taking calls, let in-flight ones finish,
 * write a last snapshot, exit 0. A shard that takes part in cluster checkpoints
 * (mt_ps_coordinated(): a trainer writes and restores them, docs/checkpoint.md) writes no
 * periodic or last snapshot of its own: they would push the cluster's checkpoints out of
 * ps.snapshot_keep, and a restart comes back to the last cluster checkpoint anyway. The
 * service logs when and why the shard became coordinated, and a SIGTERM that writes no
 * snapshot logs it too, with a warning when something changed since the last checkpoint.
 *
 * Checkpoints (layout, restore while running): ps/src/ckpt.c. The store commits a
 * checkpoint only once all of it is durable, so a crash mid-snapshot leaves the previous
 * one in place (see store/include/mt/store.h).
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
#include "mt/config_cli.h"
#include "mt/config_rpc.h"
#include "mt/http.h"
#include "mt/jemalloc_conf.h"
#include "mt/log.h"
#include "mt/process.h"
#include "mt/ps.h"
#include "mt/rpc.h"
#include "mt/store.h"

#define WHO "ps"

/* Daemon state: lives in main's frame; the snapshot hook and the metrics thread borrow it. */
typedef struct daemon {
    mt_config_t cfg;
    mt_ps_t *ps;
    mt_store_t *store;
    mt_rpc_server_t *srv;   /* for /metrics (admission counters); set before the http thread */
    mt_ps_publisher_t *pub; /* ps.publish_ms > 0: the change stream on Kafka; else NULL */
    time_t started;
} daemon_t;

static void usage(FILE *f) {
    fprintf(f, "usage: monolith-ps --config FILE [--shard I] [--num-shards N] [--listen ADDR]\n"
               "                   [--set section.key=value]... [--port-file PATH]\n"
               "                   [--log-level debug|info|warn|error] [--check]\n"
               "       monolith-ps --config FILE [--shard I] [--set ...] --drop-checkpoint ID\n"
               "       monolith-ps --config-reference\n");
}

/* ---------------- snapshots ---------------- */

/* A local snapshot (timer; @p last: the shutdown's) unless a coordinator owns the shard's
 * checkpoints. A skipped last one is logged: what it does not save is the coordinator's to
 * redo, and a plain SIGTERM must never lose work silently. */
static mt_err_t local_snapshot(daemon_t *d, int last) {
    mt_ps_snapshot_req_t req = {.local = 1};
    mt_ps_ckpt_result_t res;
    char why[400] = "";
    mt_err_t e = mt_ps_snapshot(d->ps, &req, &res, why, sizeof(why)); /* logged by the service */
    if (e || !res.skipped) return e;
    if (!last)
        mt_log(MT_LOG_DEBUG, WHO, "periodic snapshot skipped: %s", why);
    else if (res.unsaved)
        mt_log(MT_LOG_WARN, WHO,
               "shard %u: no last snapshot: %s. What changed since checkpoint %llu is not saved "
               "here: the coordinator's recovery redoes it from its last cluster checkpoint "
               "(`monolith snapshot` before the stop keeps it as a local snapshot)",
               d->cfg.ps.shard, why, (unsigned long long)res.last_id);
    else
        mt_log(MT_LOG_INFO, WHO,
               "shard %u: no last snapshot: %s; nothing changed since checkpoint %llu",
               d->cfg.ps.shard, why, (unsigned long long)res.last_id);
    return e;
}

/* ---------------- damaged checkpoints ---------------- */

/* @p argv as a shell command line (arguments quoted where needed), into @p buf. */
static void command_line(int argc, char **argv, char *buf, size_t len) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < argc && n + 1 < len; i++) {
        const char *a = argv[i];
        int plain = *a != 0;
        for (const char *p = a; *p && plain; p++)
            plain =
                strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./=:,@+-",
                       *p) != NULL;
        int w = snprintf(buf + n, len - n, plain ? "%s%s" : "%s'%s'", i ? " " : "", a);
        if (w < 0) break;
        n += (size_t)w < len - n ? (size_t)w : len - n - 1;
    }
}

/*
 * The refusal to start from a damaged newest checkpoint (@p err: the restore's message):
 * one log line naming it, the previous complete checkpoint, and the command that drops the
 * damaged one (this daemon's command line with --drop-checkpoint).
 */
static void refuse_damaged(daemon_t *d, int argc, char **argv, mt_err_t code, const char *err) {
    uint64_t cur = 0, prev = 0;
    mt_store_info_t infos[64];
    size_t n = 0;
    if (code != MT_CORRUPT && code != MT_TRUNCATED) { /* not damage: no checkpoint to drop */
        mt_log(MT_LOG_ERROR, WHO, "cannot restore from %s: %s", d->cfg.ps.snapshot_dir, err);
        return;
    }
    int listed = mt_store_list(d->store, infos, 64, &n, NULL, 0) == MT_OK;
    if (mt_store_current(d->store, &cur, NULL, 0) != MT_OK && listed && n && n <= 64)
        cur = infos[n - 1].checkpoint_id; /* `current` itself is damaged: the newest record */
    for (size_t i = 0; listed && i < n && i < 64; i++)
        if (infos[i].checkpoint_id < cur) prev = infos[i].checkpoint_id;
    if (!cur) { /* nothing to name: the store's own message is all there is */
        mt_log(MT_LOG_ERROR, WHO,
               "cannot restore from %s: %s. The shard does not start from a damaged store "
               "(docs/ps.md, \"A damaged checkpoint\")",
               d->cfg.ps.snapshot_dir, err);
        return;
    }
    char cmd[2048], from[96];
    command_line(argc, argv, cmd, sizeof(cmd));
    if (prev)
        snprintf(from, sizeof(from), "checkpoint %llu, the previous complete one",
                 (unsigned long long)prev);
    else
        snprintf(from, sizeof(from), "the empty state (no older checkpoint)");
    mt_log(MT_LOG_ERROR, WHO,
           "cannot restore from %s: %s. The shard does not start from a damaged checkpoint: to "
           "start from %s, stop it and drop checkpoint %llu (and any above it): %s "
           "--drop-checkpoint %llu (docs/ps.md, \"A damaged checkpoint\")",
           d->cfg.ps.snapshot_dir, err, from, (unsigned long long)cur, cmd,
           (unsigned long long)cur);
}

/* --drop-checkpoint ID: @returns the exit status (0 dropped, 1 failed, 2 bad usage). */
static int drop_checkpoint(daemon_t *d, const char *arg) {
    char *end = NULL, err[1024] = "";
    errno = 0;
    unsigned long long id = strtoull(arg, &end, 10);
    if (errno || !*arg || *end || id == 0) {
        fprintf(stderr, "monolith-ps: --drop-checkpoint '%s': a checkpoint id (> 0)\n", arg);
        return 2;
    }
    if (!*d->cfg.ps.snapshot_dir) {
        fprintf(stderr, "monolith-ps: --drop-checkpoint: ps.snapshot_dir is not set\n");
        return 2;
    }
    mt_store_config_t sc;
    mt_store_config_init(&sc);
    sc.keep = d->cfg.ps.snapshot_keep;
    sc.create_if_missing = 0;
    if (mt_store_open(d->cfg.ps.snapshot_dir, &sc, &d->store, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-ps: cannot open snapshot store %s: %s (is the shard stopped?)\n",
                d->cfg.ps.snapshot_dir, err);
        return 1;
    }
    uint64_t cur = 0, dropped = 0;
    if (mt_store_drop(d->store, id, &cur, &dropped, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-ps: %s: --drop-checkpoint %llu: %s\n", d->cfg.ps.snapshot_dir, id,
                err);
        return 1;
    }
    char now[64] = "no checkpoint: it starts empty";
    if (cur) snprintf(now, sizeof(now), "it starts from checkpoint %llu", (unsigned long long)cur);
    mt_log(MT_LOG_WARN, WHO, "shard %u: dropped checkpoint %llu (%llu deleted in all) from %s: %s",
           d->cfg.ps.shard, id, (unsigned long long)dropped, d->cfg.ps.snapshot_dir, now);
    printf("dropped checkpoint %llu (%llu deleted in all) from %s: %s\n", id,
           (unsigned long long)dropped, d->cfg.ps.snapshot_dir, now);
    return 0;
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
    char extra[8192];
    snprintf(extra, sizeof(extra),
             "# HELP monolith_ps_uptime_seconds Seconds since start.\n"
             "# TYPE monolith_ps_uptime_seconds gauge\n"
             "monolith_ps_uptime_seconds{shard=\"%u\"} %lld\n"
             "# HELP monolith_ps_snapshot_interval_seconds How often the shard snapshots itself "
             "(ps.snapshot_interval_s; 0: it does not).\n"
             "# TYPE monolith_ps_snapshot_interval_seconds gauge\n"
             "monolith_ps_snapshot_interval_seconds{shard=\"%u\"} %u\n",
             d->cfg.ps.shard, (long long)(time(NULL) - d->started), d->cfg.ps.shard,
             d->store ? (unsigned)d->cfg.ps.snapshot_interval_s : 0u);
    size_t n = strlen(extra);
    mt_process_render_metrics((double)d->started, extra + n, sizeof(extra) - n);
    n = strlen(extra);
    char lbl[32];
    snprintf(lbl, sizeof(lbl), "shard=\"%u\"", d->cfg.ps.shard);
    mt_rpc_server_render_metrics(d->srv, "monolith_ps", lbl, extra + n, sizeof(extra) - n);
    n = strlen(extra);
    mt_ps_publisher_render_metrics(d->pub, extra + n, sizeof(extra) - n);
    return mt_ps_render_metrics(d->ps, extra, body, len) == MT_OK ? 200 : 500;
}

/* ---------------- main ---------------- */

int main(int argc, char **argv) {
    daemon_t d;
    memset(&d, 0, sizeof(d));
    d.started = time(NULL);
    char err[1024];
    const char *port_file = NULL, *drop = NULL;
    int rc = 2;
    mt_rpc_server_t *srv = NULL;
    mt_http_t *http = NULL;
    if (mt_config_init(&d.cfg) != MT_OK) return 1;

    const mt_config_cli_opt_t opts[] = {
        {"--port-file", NULL, &port_file, NULL},
        {"--shard", NULL, NULL, "ps.shard"},
        {"--num-shards", NULL, NULL, "cluster.num_shards"},
        {"--listen", NULL, NULL, "ps.listen"},
        {"--drop-checkpoint", NULL, &drop, NULL},
    };
    mt_config_cli_t cli = {"monolith-ps", usage, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0};
    if ((rc = mt_config_cli(&cli, &d.cfg, argc, argv)) != MT_CONFIG_CLI_OK) goto out;
    rc = 2;
    const char *config = cli.config;
    int check_only = cli.check;
    /* the table slots of the trainer's model, when the file configures one ([trainer]); the
     * TLS files, as the server will read them: exit 2, with --check or without */
    if (mt_config_derive_trainer_slots(&d.cfg, NULL, NULL, err, sizeof(err)) != MT_OK ||
        mt_config_validate(&d.cfg, err, sizeof(err)) != MT_OK ||
        mt_config_rpc_check_tls(&d.cfg, 1, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-ps: %s: %s\n", config, err);
        goto out;
    }
    if (check_only) {
        printf("%s: ok (%zu slots)\n", config, d.cfg.nslots);
        rc = 0;
        goto out;
    }
    if (drop) {
        rc = drop_checkpoint(&d, drop);
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
    pc.sync_follow_max_s = d.cfg.ps.sync_follow_max_s;
    pc.sync_max_followers = d.cfg.ps.sync_max_followers; /* < max_streams (validated) */
    pc.admin_token = d.cfg.ps.admin_token;
    pc.max_message_bytes = (uint32_t)d.cfg.ps.max_message_bytes; /* the server's (below) */
    pc.snapshot_full_every = d.cfg.ps.snapshot_full_every;

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
    rcfg.max_queued = d.cfg.ps.max_queued_calls;
    rcfg.max_streams = d.cfg.ps.max_streams;
    mt_config_rpc_tls(&d.cfg, &rcfg.tls);
    int port = 0;
    if ((e = mt_rpc_server_create(&rcfg, &srv)) != MT_OK ||
        (e = mt_ps_register(d.ps, srv)) != MT_OK) {
        mt_log(MT_LOG_ERROR, WHO, "cannot serve on %s: %s", d.cfg.ps.listen, mt_strerror(e));
        goto out;
    }
    d.srv = srv;
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
        /* the newest complete checkpoint, if any (logged by the service) */
        mt_ps_set_store(d.ps, d.store);
        if ((e = mt_ps_restore(d.ps, MT_PS_NEWEST, NULL, err, sizeof(err))) != MT_OK) {
            refuse_damaged(&d, argc, argv, e, err);
            goto out;
        }
    }
    mt_ps_set_restoring(d.ps, 0);
    mt_rpc_server_set_serving(srv, 1);
    if (d.cfg.ps.publish_ms) {
        /* the change stream for replicas following through Kafka (docs/serving.md) */
        char bootstrap[8192];
        if (mt_config_kafka_bootstrap(&d.cfg, bootstrap, sizeof(bootstrap), err, sizeof(err))) {
            mt_log(MT_LOG_ERROR, WHO, "ps.publish_ms: %s", err);
            goto out;
        }
        mt_ps_publish_config_t pcfg;
        mt_ps_publish_config_init(&pcfg);
        pcfg.bootstrap = bootstrap;
        pcfg.topic = d.cfg.kafka.params_topic;
        pcfg.interval_ms = d.cfg.ps.publish_ms;
        if ((e = mt_ps_publisher_start(d.ps, &pcfg, &d.pub, err, sizeof(err))) != MT_OK) {
            mt_log(MT_LOG_ERROR, WHO, "cannot publish to %s on %s: %s", pcfg.topic, bootstrap, err);
            goto out;
        }
    }
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
            local_snapshot(&d, 0);
            next_snap = mt_mono_s() + d.cfg.ps.snapshot_interval_s;
        }
    }
    mt_log(MT_LOG_INFO, WHO, "%s: finishing in-flight calls",
           sig == SIGTERM ? "SIGTERM" : "SIGINT");
    mt_ps_stop_streams(d.ps); /* replicas get their last chunk instead of a cut */
    mt_rpc_server_shutdown(srv);
    rc = 0;
    if (d.store && local_snapshot(&d, 1) != MT_OK) rc = 1;
    mt_log(MT_LOG_INFO, WHO, "stopped");
out:
    mt_http_stop(http);
    mt_ps_publisher_stop(d.pub); /* before the shard it reads */
    mt_rpc_server_destroy(srv);
    mt_ps_destroy(d.ps); /* before the store it borrows */
    mt_store_close(d.store);
    mt_config_free(&d.cfg);
    return rc;
}
