/*
 * monolith-trainer - trains the CTR model from files (batch) or from Kafka (online).
 *
 *   monolith-trainer --config FILE --train FILE [--eval FILE] [--epochs N]
 *                    [--report FILE] [--set section.key=value]... [--log-level LEVEL]
 *   monolith-trainer --config FILE --online [--max-examples N] [--duration-s S]
 *                    [--until-caught-up] [--report FILE] [--set ...]
 *   monolith-trainer --config FILE --check
 *
 * Parameters: with cluster.ps addresses the sparse parameters live on those PS shards
 * (routing and dedup in psclient) and, with trainer.dense_sync_batches > 0, the dense ones
 * on shard 0 (mt_trainer_dense_sync); without addresses the trainer keeps a local table.
 *
 * Batch mode: reads --train ([input] says how) trainer.epochs times (--epochs overrides),
 * scoring each batch before training on it (progressive validation). A progress line every
 * trainer.progress_interval_ms on stderr: epoch, examples, examples/s, window log loss and
 * AUC, bytes read and ETA. After each epoch, --eval is scored (no training). The final
 * report on stdout: examples, examples/s, progressive AUC and log loss, eval AUC and log
 * loss, bad lines; --report FILE also writes it as one JSON object. Bad lines are logged
 * (file:line: reason; the first 100, then a count) and skipped.
 *
 * Online mode: a member of the consumer group kafka.group on kafka.examples_topic (N
 * trainers split the partitions). Messages are decoded as monolith.v1.Example; garbage is
 * counted, logged with topic/partition/offset and skipped. Each batch (trainer.batch_size
 * examples, or fewer when the topic is idle for a moment) is scored, trained and applied;
 * only then are its messages marked, and marked offsets are committed every
 * trainer.commit_interval_ms, at exit and when partitions are revoked: a crash replays at
 * most the uncommitted batches (at-least-once). Runs until SIGTERM/SIGINT, --max-examples,
 * --duration-s, or with --until-caught-up once every assigned partition is consumed up to its
 * high watermark and a poll finds nothing more (a catch-up job over what the topic holds).
 *
 * Exactly-once online mode (trainer.checkpoint_interval_s > 0, docs/checkpoint.md): the
 * trainer coordinates cluster checkpoints (mt/coord.h). At start, and after any failure of a
 * step against the PS (a shard killed, restarting, restored) or a checkpoint, it recovers:
 * every shard goes back to the last complete checkpoint and the consumer to its offsets
 * (caller-owned positions: committed offsets are not read), the dense copy is reset, and the
 * batch in hand is dropped. Every checkpoint_interval_s, between steps, it pushes the pending
 * dense gradients and writes a checkpoint with the positions of everything applied; only
 * then are those positions committed to Kafka. On exit it writes a last one. Progressive AUC over the last trainer.auc_window examples on the
 * progress line and /metrics (trainer.metrics_listen).
 *
 * Exit status: 0 done, 1 runtime failure (input unreadable, PS unreachable after retries,
 * Kafka unusable), 2 bad command line or configuration, 3 fenced: another exactly-once
 * trainer took the cluster's checkpoints over (docs/checkpoint.md; do not restart it).
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mt/clock.h"
#include "mt/config.h"
#include "mt/config_cli.h"
#include "mt/config_input.h"
#include "mt/coord.h"
#include "mt/cover.h"
#include "mt/config_rpc.h"
#include "mt/eval.h"
#include "mt/example_pb.h"
#include "mt/http.h"
#include "mt/jemalloc_conf.h"
#include "mt/kafka.h"
#include "mt/log.h"
#include "mt/psclient.h"
#include "mt/readers.h"
#include "mt/trainer.h"

#define WHO         "trainer"
#define BAD_LOG_MAX 100 /* bad lines / messages logged one by one; then only counted */

/* Counters shown by /metrics (written by the training thread, read by the HTTP thread). */
typedef struct counters {
    _Atomic uint64_t examples, batches, bad_lines, bad_messages, ignored_slots, ps_errors, commits,
        commit_failures, dense_syncs;
    /* exactly-once mode (trainer.checkpoint_interval_s) */
    _Atomic uint64_t checkpoints, checkpoint_failures, recoveries, last_checkpoint;
    /* many trainers (trainer.idempotent) */
    _Atomic uint64_t steps_skipped, out_of_order, resets, retention_errors, consumer_gaps,
        consumer_stalls;

    _Atomic uint64_t window_auc_bits, window_loss_bits; /* doubles */
    _Atomic int64_t kafka_lag;                          /* online: -1 unknown */
} counters_t;

typedef struct daemon {
    mt_config_t cfg;
    uint16_t slots[256];
    size_t nslots;
    mt_trainer_t *tr;
    mt_psc_t *psc;
    mt_trainer_dense_sync_t *dense;
    mt_eval_t *eval;
    counters_t ctr;
    sigset_t sigs;
    double started;
    const char *report_path;
    uint64_t bad_logged;
    int exact; /* online with checkpoints: a PS failure means recover, never retry a step */
} daemon_t;

static void usage(FILE *f) {
    fprintf(f,
            "usage: monolith-trainer --config FILE --train FILE [--eval FILE] [--epochs N]\n"
            "                        [--report FILE] [--set section.key=value]...\n"
            "                        [--log-level debug|info|warn|error]\n"
            "       monolith-trainer --config FILE --online [--max-examples N] [--duration-s S]\n"
            "                        [--until-caught-up] [--report FILE] [--set ...]\n"
            "       monolith-trainer --config FILE --check\n"
            "       monolith-trainer --config-reference\n");
}

/* SIGTERM / SIGINT seen by a thread that does not block them: OpenBLAS starts its worker
 * threads when the library loads, before main() can block the signals, and the default
 * action there would kill the trainer mid-step (no last checkpoint, no report). */
static volatile sig_atomic_t g_stop_signal;

static void on_stop_signal(int sig) {
    g_stop_signal = sig;
}

static int stop_requested(daemon_t *d) {
    (void)d;
    if (g_stop_signal) return 1;
    sigset_t pend;
    sigpending(&pend);
    return sigismember(&pend, SIGTERM) || sigismember(&pend, SIGINT);
}

static void store_double(_Atomic uint64_t *a, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof(bits));
    atomic_store(a, bits);
}

static double load_double(_Atomic uint64_t *a) {
    uint64_t bits = atomic_load(a);
    double v;
    memcpy(&v, &bits, sizeof(v));
    return v;
}

/* ---------------- metrics ---------------- */

static int render(void *ud, const char *path, char **body, size_t *len) {
    daemon_t *d = ud;
    if (strcmp(path, "/metrics") != 0) return 404;
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return 500;
    counters_t *c = &d->ctr;
#define C(name, help, v)                                                               \
    fprintf(f,                                                                         \
            "# HELP monolith_trainer_" name " " help "\n# TYPE monolith_trainer_" name \
            " counter\nmonolith_trainer_" name " %" PRIu64 "\n",                       \
            (uint64_t)(v))
#define G(name, help, v)                                                               \
    fprintf(f,                                                                         \
            "# HELP monolith_trainer_" name " " help "\n# TYPE monolith_trainer_" name \
            " gauge\nmonolith_trainer_" name " %.6f\n",                                \
            (double)(v))
    C("examples_total", "Examples trained on.", atomic_load(&c->examples));
    C("batches_total", "Training steps.", atomic_load(&c->batches));
    C("bad_lines_total", "Input lines skipped as bad.", atomic_load(&c->bad_lines));
    C("bad_messages_total", "Kafka messages skipped as not a valid Example.",
      atomic_load(&c->bad_messages));
    C("ignored_slots_total", "Example slots the model does not have.",
      atomic_load(&c->ignored_slots));
    C("ps_errors_total", "Training steps that failed against the PS (retried).",
      atomic_load(&c->ps_errors));
    C("commits_total", "Kafka offset commits.", atomic_load(&c->commits));
    C("commit_failures_total", "Kafka offset commits that failed.",
      atomic_load(&c->commit_failures));
    C("dense_syncs_total", "Dense parameter push/pull rounds with the PS.",
      atomic_load(&c->dense_syncs));
    C("checkpoints_total", "Cluster checkpoints written (exactly-once mode).",
      atomic_load(&c->checkpoints));
    C("checkpoint_failures_total", "Cluster checkpoints that failed (each followed by a recovery).",
      atomic_load(&c->checkpoint_failures));
    C("recoveries_total", "Returns of every PS shard and the consumer to the last checkpoint.",
      atomic_load(&c->recoveries));
    G("last_checkpoint_id", "The last complete cluster checkpoint written or restored.",
      atomic_load(&c->last_checkpoint));
    C("steps_skipped_total",
      "Covered steps (trainer.idempotent) every shard had applied before (replays).",
      atomic_load(&c->steps_skipped));
    C("out_of_order_total",
      "Covered steps a shard refused: its marks moved (a restart, a rebalance).",
      atomic_load(&c->out_of_order));
    C("resets_total", "Starts from the shards' marks (assignments and refusals).",
      atomic_load(&c->resets));
    C("consumer_gaps_total",
      "Messages past their partition's next offset (the consumer skipped some): seek again.",
      atomic_load(&c->consumer_gaps));
    C("consumer_stalls_total", "Seeks again after no message came for 5 s with some behind.",
      atomic_load(&c->consumer_stalls));
    C("retention_errors_total",
      "Partitions whose examples Kafka dropped before a shard applied them (the trainer stops).",
      atomic_load(&c->retention_errors));
    G("window_auc", "Progressive-validation AUC over the last trainer.auc_window examples.",
      load_double(&c->window_auc_bits));
    G("window_logloss", "Progressive-validation log loss over the window.",
      load_double(&c->window_loss_bits));
    G("consumer_lag_messages",
      "Online: examples behind the high watermarks of the assigned partitions (-1: unknown).",
      atomic_load(&c->kafka_lag));
    G("uptime_seconds", "Seconds since start.", mt_mono_s() - d->started);
#undef C
#undef G
    if (fclose(f) != 0) {
        free(buf);
        return 500;
    }
    *body = buf;
    *len = n;
    return 200;
}

/* ---------------- the model ---------------- */

static int setup_trainer(daemon_t *d) {
    const mt_config_trainer_t *t = &d->cfg.trainer;
    mt_trainer_config_t tc;
    mt_trainer_config_init(&tc);
    tc.nslots = (uint32_t)d->nslots;
    memcpy(tc.slot_ids, d->slots, d->nslots * sizeof(uint16_t));
    tc.dim = t->dim;
    uint64_t hidden[8];
    size_t nh = 0;
    char err[256];
    if (mt_config_parse_uint_list(t->hidden, 1, 65536, hidden, 8, &nh, err, sizeof(err))) {
        fprintf(stderr, "monolith-trainer: trainer.hidden: %s\n", err);
        return 2;
    }
    tc.nhidden = (uint32_t)nh;
    for (size_t i = 0; i < nh; i++)
        tc.hidden[i] = (uint32_t)hidden[i];
    tc.seed = t->seed;
    tc.sparse_opt = t->sparse_opt;
    tc.sparse_lr = t->sparse_lr;
    tc.init_scale = t->init_scale;
    tc.min_count = t->min_count;
    tc.dense_lr = t->dense_lr;
    tc.hash_buckets = t->hash_buckets;
    tc.table_initial_rows = t->table_initial_rows;
    mt_trainer_backend_t be;
    if (d->cfg.cluster.nps) {
        mt_psc_config_t pc;
        mt_psc_config_init(&pc);
        pc.addrs = (const char *const *)d->cfg.cluster.ps;
        pc.num_shards = (uint32_t)d->cfg.cluster.nps;
        mt_config_rpc_tls(&d->cfg, &pc.rpc.tls);
        /* Exactly once: no transport retries. A retry after a lost response would apply the
         * step a second time on a shard that had applied it; a failed call starts recovery
         * (back to the last complete checkpoint) instead. */
        if (d->exact) pc.rpc.retries = 0;
        mt_err_t e = mt_psc_create(&pc, &d->psc);
        if (e) {
            mt_log(MT_LOG_ERROR, WHO, "PS client: %s", mt_strerror(e));
            return 1;
        }
        mt_trainer_backend_psc(d->psc, &be);
        tc.backend = &be;
    }
    mt_err_t e = mt_trainer_create(&tc, &d->tr);
    if (e) {
        mt_log(MT_LOG_ERROR, WHO, "cannot create the trainer: %s", mt_strerror(e));
        return e == MT_CONFIG ? 2 : 1;
    }
    if (d->psc && t->dense_sync_batches) {
        /* the PS may still be starting: retry for a while */
        for (int attempt = 0;; attempt++) {
            e = mt_trainer_dense_sync_create(d->tr, d->psc, t->dense_sync_batches, &d->dense, err,
                                             sizeof(err));
            if (!e) break;
            if (attempt == 30 || stop_requested(d)) {
                mt_log(MT_LOG_ERROR, WHO, "dense parameters on the PS: %s", err);
                return 1;
            }
            mt_log(MT_LOG_WARN, WHO, "dense parameters on the PS: %s (retrying)", err);
            sleep(1);
        }
        mt_log(MT_LOG_INFO, WHO, "dense parameters on PS shard 0 (version %" PRIu64 ")",
               mt_trainer_dense_sync_version(d->dense));
    }
    if ((e = mt_eval_create(t->auc_window, &d->eval))) return 1;
    return 0;
}

/* One training step with retries against the PS; the batch's scores (before the update)
 * go to the evaluator. @returns 0, or 1 after giving up (the PS stayed unreachable), or in
 * exact mode 2 at the first PS failure (a retry could apply part of the step twice: the
 * caller recovers instead). */
static int train_step(daemon_t *d, const mt_batch_t *b, float *probs, double *loss_sum,
                      int *previous);

/* One step, retried in the at-least-once mode. @returns 0, 1 (stop) or 2 (recover). */
static int train_batch(daemon_t *d, const mt_batch_t *b, float *probs, double *loss_sum) {
    return train_step(d, b, probs, loss_sum, NULL);
}

/* One step. With @p previous (pipelined steps): no retry, since an error may be the previous
 * step's: 3 (drop both, seek back to the marks) in the at-least-once mode; *previous = 1 when
 * the step confirmed the previous one. @returns 0, 1 (stop), 2 (recover) or 3. */
static int train_step(daemon_t *d, const mt_batch_t *b, float *probs, double *loss_sum,
                      int *previous) {
    uint32_t now_s = (uint32_t)time(NULL);
    for (int attempt = 0;; attempt++) {
        mt_trainer_step_t st;
        mt_err_t e = mt_trainer_train(d->tr, b, now_s, probs, &st);
        if (previous) *previous = st.previous;
        char err[512] = "";
        if (!e && d->dense) {
            int synced = 0;
            e = mt_trainer_dense_sync_step(d->dense, &synced, err, sizeof(err));
            if (!e && synced) atomic_fetch_add(&d->ctr.dense_syncs, 1);
        }
        if (!e) {
            mt_eval_add(d->eval, probs, b->labels, b->n);
            *loss_sum += (double)st.loss * (double)b->n;
            atomic_fetch_add(&d->ctr.examples, b->n);
            atomic_fetch_add(&d->ctr.batches, 1);
            return 0;
        }
        atomic_fetch_add(&d->ctr.ps_errors, 1);
        const char *sep = err[0] ? ": " : "";
        if (e == MT_MISMATCH || e == MT_INVALID || e == MT_NOMEM) {
            mt_log(MT_LOG_ERROR, WHO, "training step: %s%s%s", mt_strerror(e), sep, err);
            return 1;
        }
        if (d->exact) {
            mt_log(MT_LOG_WARN, WHO, "training step: %s%s%s: recovering", mt_strerror(e), sep, err);
            return 2;
        }
        if (previous) {
            mt_log(MT_LOG_WARN, WHO, "pipelined step: %s%s%s: back to the marked positions",
                   mt_strerror(e), sep, err);
            return 3;
        }
        if (attempt == 20 || stop_requested(d)) {
            mt_log(MT_LOG_ERROR, WHO, "training step failed %d times: %s%s%s", attempt + 1,
                   mt_strerror(e), sep, err);
            return 1;
        }
        mt_log(MT_LOG_WARN, WHO, "training step: %s %s (retrying)", mt_strerror(e), err);
        usleep(100000u << (attempt < 4 ? attempt : 4));
    }
}

/* ---------------- batch mode ---------------- */

typedef struct bad_ctx {
    daemon_t *d;
    const char *path;
} bad_ctx_t;

static void on_bad_line(void *opaque, uint64_t line, const char *reason) {
    bad_ctx_t *b = opaque;
    atomic_fetch_add(&b->d->ctr.bad_lines, 1);
    if (b->d->bad_logged++ < BAD_LOG_MAX)
        mt_log(MT_LOG_WARN, WHO, "%s:%" PRIu64 ": bad line skipped: %s", b->path, line, reason);
    else if (b->d->bad_logged == BAD_LOG_MAX + 1)
        mt_log(MT_LOG_WARN, WHO, "more bad lines: counting them only (see the report)");
}

/* Opens a reader of @p path on @p in as [input] says. @returns 0, 1 (I/O), 2 (config). */
static int open_reader(daemon_t *d, const char *path, FILE *in, mt_reader_t **r) {
    const mt_config_input_t *ic = &d->cfg.input;
    mt_err_t e;
    char err[512] = "";
    switch (ic->format) {
    case MT_INPUT_CRITEO: e = mt_reader_criteo_open(NULL, path, in, r); break;
    case MT_INPUT_MOVIELENS_100K:
    case MT_INPUT_MOVIELENS_LATEST: {
        mt_movielens_config_t mc;
        mt_movielens_config_init(&mc);
        mc.format = ic->format == MT_INPUT_MOVIELENS_100K ? MT_MOVIELENS_100K : MT_MOVIELENS_LATEST;
        mc.users_path = *ic->users_file ? ic->users_file : NULL;
        mc.items_path = *ic->items_file ? ic->items_file : NULL;
        e = mt_reader_movielens_open(&mc, path, in, r);
        break;
    }
    default: {
        mt_config_csv_t cc;
        e = mt_config_input_csv(&d->cfg, &cc, err, sizeof(err));
        if (!e) e = mt_reader_csv_open(&cc.csv, path, in, r, err, sizeof(err));
        mt_config_csv_free(&cc);
        break;
    }
    }
    if (e) {
        fprintf(stderr, "monolith-trainer: %s: %s%s%s\n", path, mt_strerror(e), *err ? ": " : "",
                err);
        return e == MT_CONFIG ? 2 : 1;
    }
    return 0;
}

/* The model's slots must be the reader's, in the reader's order. */
static int check_reader_slots(daemon_t *d, const mt_reader_t *r, const char *path) {
    uint32_t n;
    const uint16_t *s = mt_reader_slots(r, &n);
    if (n == d->nslots && !memcmp(s, d->slots, n * sizeof(uint16_t))) return 0;
    char have[512] = "", want[512] = "";
    for (uint32_t i = 0, o = 0; i < n && o < sizeof(have) - 8; i++)
        o += (uint32_t)snprintf(have + o, sizeof(have) - o, "%s%u", i ? "," : "", s[i]);
    for (size_t i = 0, o = 0; i < d->nslots && o < sizeof(want) - 8; i++)
        o += (size_t)snprintf(want + o, sizeof(want) - o, "%s%u", i ? "," : "", d->slots[i]);
    fprintf(stderr,
            "monolith-trainer: %s: the input has slots %s but trainer.slots is %s (list them in "
            "the input's order, or leave trainer.slots empty: the format's or input.columns')\n",
            path, have, want);
    return 2;
}

static void fmt_eta(double s, char *out, size_t len) {
    if (!(s >= 0) || s > 360000) {
        snprintf(out, len, "--:--:--");
        return;
    }
    unsigned t = (unsigned)s;
    snprintf(out, len, "%02u:%02u:%02u", t / 3600, t / 60 % 60, t % 60);
}

typedef struct pass_result {
    uint64_t examples;
    double seconds, loss_sum;
    mt_eval_result_t ev;
} pass_result_t;

/* One pass over @p path: training (progressive) or scoring only. @returns 0, 1, 2. */
static int run_pass(daemon_t *d, const char *path, int train, uint32_t epoch, uint32_t epochs,
                    pass_result_t *res) {
    memset(res, 0, sizeof(*res));
    FILE *in = fopen(path, "r");
    if (!in) {
        fprintf(stderr, "monolith-trainer: %s: %s\n", path, strerror(errno));
        return 1;
    }
    struct stat sb;
    double size = fstat(fileno(in), &sb) == 0 ? (double)sb.st_size : 0;
    mt_reader_t *r = NULL;
    int rc = open_reader(d, path, in, &r);
    if (rc) {
        fclose(in);
        return rc;
    }
    if ((rc = check_reader_slots(d, r, path))) goto out;
    bad_ctx_t bc = {d, path};
    mt_reader_set_bad_line_cb(r, on_bad_line, &bc);
    mt_eval_t *ev = d->eval;
    mt_eval_t *own = NULL;
    if (!train) {
        if (mt_eval_create(d->cfg.trainer.auc_window, &own)) {
            rc = 1;
            goto out;
        }
        ev = own;
    } else {
        mt_eval_reset(ev);
    }
    mt_batch_t b = {0};
    mt_reader_batch_init(r, &b);
    size_t bs = d->cfg.trainer.batch_size;
    float *probs = malloc(bs * sizeof(float));
    if (!probs) {
        rc = 1;
        goto done;
    }
    double t0 = mt_mono_s(), next_progress = t0 + d->cfg.trainer.progress_interval_ms / 1000.0;
    mt_err_t e;
    while ((e = mt_reader_next(r, &b, bs)) == MT_OK) {
        if (train) {
            if (train_batch(d, &b, probs, &res->loss_sum)) {
                rc = 1;
                break;
            }
        } else {
            if ((e = mt_trainer_predict(d->tr, &b, probs))) break;
            mt_eval_add(ev, probs, b.labels, b.n);
        }
        res->examples += b.n;
        mt_batch_clear(&b);
        if (stop_requested(d)) {
            mt_log(MT_LOG_WARN, WHO, "stopping on a signal after %" PRIu64 " examples",
                   res->examples);
            rc = 1;
            break;
        }
        double now = mt_mono_s();
        if (d->cfg.trainer.progress_interval_ms && now >= next_progress) {
            next_progress = now + d->cfg.trainer.progress_interval_ms / 1000.0;
            mt_eval_result_t er;
            mt_eval_result(ev, &er);
            store_double(&d->ctr.window_auc_bits, er.window_auc);
            store_double(&d->ctr.window_loss_bits, er.window_logloss);
            double pos = (double)ftello(in), rate = (double)res->examples / (now - t0);
            double eta = pos > 0 && size > 0 ? (now - t0) * (size - pos) / pos : -1;
            if (train && epochs > 1 && eta >= 0) eta += (now - t0) * size / pos * (epochs - epoch);
            char etas[16];
            fmt_eta(eta, etas, sizeof(etas));
            fprintf(stderr,
                    "%s %u/%u  %" PRIu64 " ex  %.0f ex/s  loss %.4f  auc %.4f  %.0f%%  ETA %s\n",
                    train ? "epoch" : "eval", epoch, epochs, res->examples, rate, er.window_logloss,
                    er.window_auc, size > 0 ? 100.0 * pos / size : 0.0, etas);
        }
    }
    if (e != MT_OK && e != MT_NOT_FOUND && !rc) {
        mt_log(MT_LOG_ERROR, WHO, "%s: %s", path, mt_strerror(e));
        rc = 1;
    }
    res->seconds = mt_mono_s() - t0;
    mt_eval_result(ev, &res->ev);
    if (!train) res->loss_sum = res->ev.logloss * (double)res->ev.n;
    free(probs);
done:
    mt_batch_free(&b);
    mt_eval_destroy(own);
out:
    mt_reader_destroy(r);
    fclose(in);
    return rc;
}

static void json_num(FILE *f, const char *key, double v, int last) {
    if (isfinite(v))
        fprintf(f, "\"%s\": %.6g%s", key, v, last ? "" : ", ");
    else
        fprintf(f, "\"%s\": null%s", key, last ? "" : ", ");
}

static int write_report(daemon_t *d, const char *mode, const pass_result_t *tr, uint32_t epochs,
                        const pass_result_t *ev, int have_eval) {
    printf("== monolith-trainer report (%s) ==\n", mode);
    if (!strcmp(mode, "batch"))
        printf("examples trained   %" PRIu64 " per epoch (%u epoch%s)\n", tr->examples, epochs,
               epochs == 1 ? "" : "s");
    else
        printf("examples trained   %" PRIu64 "\n", tr->examples);
    printf("examples/s         %.0f\n", tr->seconds > 0 ? tr->examples / tr->seconds : 0.0);
    printf("progressive AUC    %.4f   (%s; last %zu examples: %.4f)\n", tr->ev.auc,
           strcmp(mode, "batch") ? "all examples" : "last epoch", tr->ev.window_n,
           tr->ev.window_auc);
    printf("progressive logloss %.4f\n", tr->ev.logloss);
    if (have_eval)
        printf("eval AUC           %.4f   logloss %.4f   (%" PRIu64 " examples)\n", ev->ev.auc,
               ev->ev.logloss, ev->examples);
    printf("bad lines          %" PRIu64 "\n", atomic_load(&d->ctr.bad_lines));
    printf("bad messages       %" PRIu64 "\n", atomic_load(&d->ctr.bad_messages));
    fflush(stdout);
    if (!d->report_path) return 0;
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", d->report_path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        mt_log(MT_LOG_ERROR, WHO, "%s: %s", tmp, strerror(errno));
        return 1;
    }
    fprintf(f, "{\"mode\": \"%s\", \"examples\": %" PRIu64 ", \"epochs\": %u, ", mode, tr->examples,
            epochs);
    json_num(f, "examples_per_s", tr->seconds > 0 ? tr->examples / tr->seconds : 0, 0);
    json_num(f, "progressive_auc", tr->ev.auc, 0);
    json_num(f, "progressive_logloss", tr->ev.logloss, 0);
    json_num(f, "window_auc", tr->ev.window_auc, 0);
    if (have_eval) {
        json_num(f, "eval_auc", ev->ev.auc, 0);
        json_num(f, "eval_logloss", ev->ev.logloss, 0);
        fprintf(f, "\"eval_examples\": %" PRIu64 ", ", ev->examples);
    }
    fprintf(f,
            "\"bad_lines\": %" PRIu64 ", \"bad_messages\": %" PRIu64 ", \"batches\": %" PRIu64
            ", \"dense_syncs\": %" PRIu64 ", \"commits\": %" PRIu64 ", \"checkpoints\": %" PRIu64
            ", \"recoveries\": %" PRIu64 ", \"last_checkpoint\": %" PRIu64 "}\n",
            atomic_load(&d->ctr.bad_lines), atomic_load(&d->ctr.bad_messages),
            atomic_load(&d->ctr.batches), atomic_load(&d->ctr.dense_syncs),
            atomic_load(&d->ctr.commits), atomic_load(&d->ctr.checkpoints),
            atomic_load(&d->ctr.recoveries), atomic_load(&d->ctr.last_checkpoint));
    if (fclose(f) != 0 || rename(tmp, d->report_path) != 0) {
        mt_log(MT_LOG_ERROR, WHO, "%s: %s", d->report_path, strerror(errno));
        return 1;
    }
    return 0;
}

static int run_batch(daemon_t *d, const char *train, const char *eval, uint32_t epochs) {
    pass_result_t tr = {0}, ev = {0};
    int rc = 0;
    for (uint32_t ep = 1; ep <= epochs && !rc; ep++) {
        if ((rc = run_pass(d, train, 1, ep, epochs, &tr))) break;
        mt_log(MT_LOG_INFO, WHO,
               "epoch %u: %" PRIu64 " examples, %.0f ex/s, progressive auc %.4f logloss %.4f", ep,
               tr.examples, tr.seconds > 0 ? tr.examples / tr.seconds : 0.0, tr.ev.auc,
               tr.ev.logloss);
        if (eval) {
            if ((rc = run_pass(d, eval, 0, ep, epochs, &ev))) break;
            mt_log(MT_LOG_INFO, WHO, "epoch %u: eval auc %.4f logloss %.4f (%" PRIu64 " examples)",
                   ep, ev.ev.auc, ev.ev.logloss, ev.examples);
        }
    }
    if (!rc && d->dense) {
        char err[512];
        if (mt_trainer_dense_sync_flush(d->dense, err, sizeof(err))) {
            mt_log(MT_LOG_ERROR, WHO, "final dense push: %s", err);
            rc = 1;
        }
    }
    if (!rc) rc = write_report(d, "batch", &tr, epochs, &ev, eval != NULL);
    return rc;
}

/* ---------------- online mode ---------------- */

static int commit(daemon_t *d, mt_kafka_consumer_t *kc) {
    mt_err_t e = mt_kafka_consumer_commit(kc);
    if (e) {
        atomic_fetch_add(&d->ctr.commit_failures, 1);
        mt_log(MT_LOG_WARN, WHO, "offset commit failed: %s (kept for the next one)",
               mt_strerror(e));
        return 1;
    }
    atomic_fetch_add(&d->ctr.commits, 1);
    return 0;
}

/* ---- exactly-once mode: checkpoints and recovery (mt/coord.h) ---- */

static int stop_cb(void *ud) {
    return stop_requested(ud);
}

/* The exit status of a trainer another one took over from (fencing, docs/checkpoint.md):
 * distinct so that supervisors do not restart it (systemd: RestartPreventExitStatus=3). */
#define EXIT_FENCED 3

/* The one line a fenced trainer ends with: "stopping: fenced: <why>". */
static void log_fenced(const char *why) {
    mt_log(MT_LOG_ERROR, WHO, "stopping: %s%s", strncmp(why, "fenced", 6) ? "fenced: " : "", why);
}

/* A recovery that failed for another reason may have met another trainer's takeover (its
 * restores and checkpoints race ours): @returns EXIT_FENCED if a shard has seen a higher
 * coordinator epoch (logged), else 1. */
static int gave_up(mt_coord_t *co) {
    char why[512] = "";
    if (mt_coord_epoch(co) && mt_coord_check(co, why, sizeof(why)) == MT_FENCED) {
        log_fenced(why);
        return EXIT_FENCED;
    }
    return 1;
}

/* Rolls the shards and the consumer back to the last complete checkpoint and resets the
 * dense copy. @returns 0, 1 (gave up: the trainer exits and a restart recovers) or
 * EXIT_FENCED (another trainer took over: stop for good). */
static int recover(daemon_t *d, mt_coord_t *co, mt_kafka_consumer_t *kc) {
    char err[512] = "";
    atomic_fetch_add(&d->ctr.recoveries, 1);
    for (int attempt = 0; attempt < 5 && !stop_requested(d); attempt++) {
        mt_coord_point_t pt;
        mt_err_t e = mt_coord_recover(co, &pt, err, sizeof(err));
        if (e == MT_FENCED) {
            log_fenced(err);
            return EXIT_FENCED;
        }
        if (e) {
            mt_log(MT_LOG_ERROR, WHO, "recovery failed: %s", err);
            return gave_up(co);
        }
        mt_kafka_position_t *pos = calloc(pt.noffsets ? pt.noffsets : 1, sizeof(*pos));
        if (!pos) {
            mt_coord_point_free(&pt);
            return 1;
        }
        for (size_t i = 0; i < pt.noffsets; i++)
            pos[i] = (mt_kafka_position_t){pt.offsets[i].topic, pt.offsets[i].partition,
                                           pt.offsets[i].offset};
        e = mt_kafka_consumer_set_positions(kc, pos, pt.noffsets, err, sizeof(err));
        free(pos);
        int fresh = pt.checkpoint_id == 0;
        atomic_store(&d->ctr.last_checkpoint, pt.checkpoint_id);
        mt_coord_point_free(&pt);
        if (e == MT_OK) e = mt_trainer_dense_sync_reset(d->dense, fresh, err, sizeof(err));
        if (e == MT_OK) return 0;
        if (e == MT_FENCED) {
            log_fenced(err);
            return EXIT_FENCED;
        }
        mt_log(MT_LOG_WARN, WHO, "recovery: %s (again)", err);
        sleep(1);
    }
    mt_log(MT_LOG_ERROR, WHO, "recovery did not finish: %s", err);
    return gave_up(co);
}

/* A cluster checkpoint of everything applied (nothing is in flight: one thread). On success
 * its positions are committed to Kafka (for lag monitoring and tools: recovery reads the
 * checkpoint's own). @returns 0, 1 (the caller recovers) or EXIT_FENCED (stop). */
static int checkpoint(daemon_t *d, mt_coord_t *co, mt_kafka_consumer_t *kc) {
    char err[512] = "";
    mt_err_t e = mt_trainer_dense_sync_flush(d->dense, err, sizeof(err));
    mt_kafka_position_t *pos = NULL;
    mt_psc_offset_t *offs = NULL;
    size_t n = 0;
    if (e == MT_OK) {
        mt_kafka_consumer_positions(kc, NULL, 0, &n);
        pos = calloc(n ? n : 1, sizeof(*pos));
        offs = calloc(n ? n : 1, sizeof(*offs));
        if (!pos || !offs) e = MT_NOMEM;
    }
    if (e == MT_OK) {
        mt_kafka_consumer_positions(kc, pos, n, &n); /* the same: only this thread marks */
        for (size_t i = 0; i < n; i++)
            offs[i] = (mt_psc_offset_t){(char *)pos[i].topic, pos[i].partition, pos[i].offset};
        uint64_t id = 0, examples = 0;
        e = mt_coord_checkpoint(co, offs, n, &id, &examples, err, sizeof(err));
        if (e == MT_OK) {
            atomic_fetch_add(&d->ctr.checkpoints, 1);
            atomic_store(&d->ctr.last_checkpoint, id);
            if (mt_kafka_consumer_commit_positions(kc, pos, n) == MT_OK)
                atomic_fetch_add(&d->ctr.commits, 1);
            else
                atomic_fetch_add(&d->ctr.commit_failures, 1); /* logged by the consumer */
        }
    }
    free(pos);
    free(offs);
    if (e == MT_OK) return 0;
    atomic_fetch_add(&d->ctr.checkpoint_failures, 1);
    if (e == MT_FENCED) {
        log_fenced(*err ? err : mt_strerror(e));
        return EXIT_FENCED;
    }
    mt_log(MT_LOG_WARN, WHO, "checkpoint failed: %s%s%s", mt_strerror(e), *err ? ": " : "", err);
    return 1;
}

/* ---- many trainers: covered steps (trainer.idempotent; docs/checkpoint.md, mt/cover.h) ---- */

/* The lists of marks a trainer starts from, out of every shard's Stats (@p sm): each
 * shard's sparse marks, and shard 0's dense ones when the dense parameters are on the PS.
 * @p lists has room for num_shards + 1. @returns how many. */
static size_t marks_lists(daemon_t *d, const mt_psc_shard_ckpt_t *sm, mt_cover_marks_t *lists) {
    size_t nl = 0;
    for (uint32_t s = 0; s < mt_psc_num_shards(d->psc); s++)
        lists[nl++] = (mt_cover_marks_t){sm[s].marks[MT_PSC_MARKS], sm[s].nmarks[MT_PSC_MARKS]};
    if (d->dense)
        lists[nl++] =
            (mt_cover_marks_t){sm[0].marks[MT_PSC_DENSE_MARKS], sm[0].nmarks[MT_PSC_DENSE_MARKS]};
    return nl;
}

/* Reads every shard's marks and the log starts of the partitions assigned now, and moves the
 * consumer to where this trainer's steps start (mt_cover_reset). Waits (retrying) while a
 * shard does not answer. @returns 0, or 1: stop (requested, or Kafka's retention dropped
 * examples a shard never applied: said and counted). */
static int marks_reset(daemon_t *d, mt_kafka_consumer_t *kc, mt_cover_t *cv, uint64_t *gen) {
    uint32_t ns = mt_psc_num_shards(d->psc);
    atomic_fetch_add(&d->ctr.resets, 1);
    for (unsigned attempt = 0; !stop_requested(d); attempt++) {
        if (attempt) usleep(200000u);
        char err[512] = "";
        uint64_t g = mt_kafka_consumer_generation(kc);
        size_t n = 0;
        mt_kafka_consumer_assignment(kc, NULL, 0, &n);
        size_t cap = n + 16; /* room for an assignment growing meanwhile (then: again) */
        mt_kafka_position_t *as = calloc(cap, sizeof(*as)), *pos = calloc(cap, sizeof(*pos));
        mt_cover_pos_t *own = calloc(cap, sizeof(*own)), *st = calloc(cap, sizeof(*st));
        mt_psc_shard_ckpt_t *sm = calloc(ns, sizeof(*sm));
        mt_cover_marks_t *lists = calloc(ns + 1, sizeof(*lists));
        mt_err_t e = as && pos && own && st && sm && lists ? MT_OK : MT_NOMEM;
        if (!e) mt_kafka_consumer_assignment(kc, as, cap, &n);
        if (!e && n > cap) e = MT_UNAVAILABLE; /* it grew: again */
        for (size_t i = 0; i < n && !e; i++) {
            own[i] = (mt_cover_pos_t){as[i].topic, as[i].partition, 0};
            e = mt_kafka_consumer_log_start(kc, as[i].topic, as[i].partition, 5000, &own[i].offset,
                                            err, sizeof(err));
        }
        if (!e && (e = mt_psc_marks(d->psc, 10000, sm)) != MT_OK) {
            for (uint32_t s = 0; s < ns; s++)
                if (sm[s].err) snprintf(err, sizeof(err), "shard %u: %s", s, sm[s].st.message);
        }
        if (!e) {
            size_t nl = marks_lists(d, sm, lists);
            e = mt_cover_reset(cv, own, n, lists, nl, st, err, sizeof(err));
        }
        if (!e) {
            for (size_t i = 0; i < n; i++)
                pos[i] = (mt_kafka_position_t){st[i].topic, st[i].partition, st[i].offset};
            e = mt_kafka_consumer_set_positions(kc, pos, n, err, sizeof(err));
        }
        if (!e) {
            char line[1024] = "";
            size_t len = 0;
            for (size_t i = 0; i < n && len + 64 < sizeof(line); i++)
                len += (size_t)snprintf(line + len, sizeof(line) - len, " %s/%d@%" PRId64,
                                        st[i].topic, (int)st[i].partition, st[i].offset);
            if (mt_kafka_consumer_generation(kc) == g) {
                mt_log(MT_LOG_INFO, WHO, "partitions (%zu):%s%s", n, n ? line : " none",
                       mt_cover_catching_up(cv) ? "; catching up (a shard is behind)" : "");
                *gen = g;
            } else {
                e = MT_UNAVAILABLE; /* the assignment changed meanwhile: again */
            }
        }
        free(as);
        free(pos);
        free(own);
        free(st);
        if (sm) mt_psc_shard_ckpt_free(sm, ns);
        free(sm);
        free(lists);
        if (e == MT_OK) return 0;
        if (e == MT_LIMIT) {
            atomic_fetch_add(&d->ctr.retention_errors, 1);
            mt_log(MT_LOG_ERROR, WHO, "stopping: %s", err);
            return 1;
        }
        if (e == MT_NOMEM) return 1;
        if (attempt % 25 == 0 && *err)
            mt_log(MT_LOG_WARN, WHO, "reading the shards' marks: %s (again)", err);
    }
    return 1;
}

/* Commits to Kafka, for lag monitoring and tools only (nothing reads them back), the lowest
 * durable mark of each assigned partition: what every shard holds in its last snapshot
 * (with the dense marks of shard 0). A partition a shard holds no durable mark of is left
 * alone. @returns 0, or 1 when the marks could not be read or the commit failed (counted). */
static int commit_durable(daemon_t *d, mt_kafka_consumer_t *kc) {
    uint32_t ns = mt_psc_num_shards(d->psc);
    size_t n = 0;
    mt_kafka_consumer_assignment(kc, NULL, 0, &n);
    mt_kafka_position_t *as = calloc(n + 1, sizeof(*as));
    mt_psc_shard_ckpt_t *sm = calloc(ns, sizeof(*sm));
    int rc = 1;
    if (!as || !sm || mt_psc_marks(d->psc, 10000, sm) != MT_OK) goto out;
    mt_kafka_consumer_assignment(kc, as, n, &n);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t lo = -1;
        int all = 1;
        for (uint32_t s = 0; s < ns + (d->dense ? 1u : 0u) && all; s++) {
            int list = s < ns ? MT_PSC_DURABLE_MARKS : MT_PSC_DURABLE_DENSE_MARKS;
            const mt_psc_shard_ckpt_t *o = &sm[s < ns ? s : 0];
            int64_t m = -1;
            for (size_t j = 0; j < o->nmarks[list]; j++)
                if (o->marks[list][j].partition == as[i].partition &&
                    !strcmp(o->marks[list][j].topic, as[i].topic))
                    m = o->marks[list][j].offset;
            if (m < 0) all = 0;
            if (lo < 0 || m < lo) lo = m;
        }
        if (all && lo >= 0) as[k++] = (mt_kafka_position_t){as[i].topic, as[i].partition, lo};
    }
    rc = k && mt_kafka_consumer_commit_positions(kc, as, k) != MT_OK;
out:
    atomic_fetch_add(rc ? &d->ctr.commit_failures : &d->ctr.commits, 1);
    if (sm) mt_psc_shard_ckpt_free(sm, ns);
    free(sm);
    free(as);
    return rc;
}

#define STALL_S      5.0 /* a consumer with messages behind and none delivered that long: seek */
#define IDLE_CHECK_S 2.0 /* an idle trainer looks at the shards' marks this often */

/* 1 if a shard is behind this trainer on one of its partitions (it restarted from an older
 * snapshot and no step told it yet: the trainer is idle), 0 if not or unknown. */
static int shards_behind(daemon_t *d, const mt_cover_t *cv) {
    uint32_t ns = mt_psc_num_shards(d->psc);
    mt_psc_shard_ckpt_t *sm = calloc(ns, sizeof(*sm));
    mt_cover_marks_t *lists = calloc(ns + 1, sizeof(*lists));
    int behind = 0;
    if (sm && lists && mt_psc_marks(d->psc, 10000, sm) == MT_OK) {
        behind = mt_cover_behind(cv, lists, marks_lists(d, sm, lists));
    }
    if (sm) mt_psc_shard_ckpt_free(sm, ns);
    free(sm);
    free(lists);
    return behind;
}

/* Pipelined steps in the online loop (trainer.pipelined): the messages whose step's apply is
 * in flight, marked once a later step or a wait confirms it (mt_trainer_wait). */
typedef struct inflight {
    int on;              /* the trainer's steps are pipelined */
    int busy;            /* a step is in flight */
    mt_kafka_msg_t *msg; /* its messages (topic, partition and offset only: marks need no more) */
    size_t n, cap;
} inflight_t;

/* Marks the messages of the step in flight, now applied. */
static void inflight_mark(inflight_t *f, mt_kafka_consumer_t *kc) {
    for (size_t i = 0; i < f->n; i++)
        mt_kafka_consumer_mark(kc, &f->msg[i]);
    f->n = 0;
    f->busy = 0;
}

/* The step in flight (if any) answered: marked on success. @returns the number of messages
 * marked, or -1 on error (nothing in flight afterwards, nothing marked). */
static long inflight_confirm(inflight_t *f, daemon_t *d, mt_kafka_consumer_t *kc) {
    if (!f->on || !f->busy) return 0;
    mt_err_t e = mt_trainer_wait(d->tr, NULL);
    long n = (long)f->n;
    if (e) {
        atomic_fetch_add(&d->ctr.ps_errors, 1);
        mt_log(MT_LOG_WARN, WHO, "pipelined step: %s", mt_strerror(e));
        f->n = 0;
        f->busy = 0;
        return -1;
    }
    inflight_mark(f, kc);
    return n;
}

/* The messages of a step just handed over. @returns 0 or 1 (out of memory). */
static int inflight_set(inflight_t *f, const mt_kafka_msg_t *msgs, size_t n) {
    if (n > f->cap) {
        mt_kafka_msg_t *m = realloc(f->msg, n * sizeof(*m));
        if (!m) return 1;
        f->msg = m;
        f->cap = n;
    }
    for (size_t i = 0; i < n; i++)
        f->msg[i] = (mt_kafka_msg_t){
            .topic = msgs[i].topic, .partition = msgs[i].partition, .offset = msgs[i].offset};
    f->n = n;
    f->busy = 1;
    return 0;
}

/* A pipelined covered step (@p b holds examples): hands its apply, with its cover, to the
 * trainer's apply thread; the step in flight before it is confirmed by it (its messages
 * marked), and this one's messages @p held wait in @p fl. Any error drops both steps (the
 * library has nothing in flight after one; an error of the dense push, after this step's
 * apply went in flight, waits for it): the caller resets to the shards' marks, which re-feeds
 * what either step did not apply everywhere, each shard skipping what it did. No retry here:
 * the error may be the previous step's. @returns 0, 2 (reset) or 1 (stop). */
static int covered_step_pipelined(daemon_t *d, mt_cover_t *cv, mt_batch_t *b, float *probs,
                                  double *loss_sum, inflight_t *fl, mt_kafka_consumer_t *kc,
                                  const mt_kafka_msg_t *held, size_t nheld) {
    const mt_psc_range_t *r;
    size_t nr = mt_cover_ranges(cv, &r);
    char err[512] = "";
    mt_trainer_step_t st = {0};
    mt_trainer_set_cover(d->tr, r, nr);
    mt_err_t e = mt_trainer_train(d->tr, b, (uint32_t)time(NULL), probs, &st);
    int in_flight = e == MT_OK; /* this step's apply */
    if (!e && d->dense) {
        mt_trainer_dense_sync_set_cover(d->dense, r, nr);
        int synced = 0;
        e = mt_trainer_dense_sync_step(d->dense, &synced, err, sizeof(err));
        if (!e && synced) atomic_fetch_add(&d->ctr.dense_syncs, 1);
    }
    if (!e) {
        mt_eval_add(d->eval, probs, b->labels, b->n);
        *loss_sum += (double)st.loss * (double)b->n;
        atomic_fetch_add(&d->ctr.examples, b->n);
        atomic_fetch_add(&d->ctr.batches, 1);
        if (st.previous && st.skipped_shards == mt_psc_num_shards(d->psc))
            atomic_fetch_add(&d->ctr.steps_skipped, 1);
        if (fl->busy) inflight_mark(fl, kc); /* confirmed by this step */
        if (inflight_set(fl, held, nheld)) return 1;
        mt_cover_commit(cv);
        return 0;
    }
    if (in_flight) (void)mt_trainer_wait(d->tr, NULL); /* nothing in flight after */
    fl->n = 0;
    fl->busy = 0;
    mt_cover_abort(cv);
    if (e == MT_OUT_OF_ORDER) {
        atomic_fetch_add(&d->ctr.out_of_order, 1);
        mt_log(MT_LOG_INFO, WHO,
               "a shard refused the step (%s; pipelined: the step after it dropped too): reading "
               "the marks again",
               *err ? err : "out of order");
        return 2;
    }
    atomic_fetch_add(&d->ctr.ps_errors, 1);
    if (e == MT_MISMATCH || e == MT_INVALID || e == MT_NOMEM) {
        mt_log(MT_LOG_ERROR, WHO, "training step: %s%s%s", mt_strerror(e), *err ? ": " : "", err);
        return 1;
    }
    mt_log(MT_LOG_WARN, WHO,
           "pipelined step: %s%s%s: both steps dropped, back to the shards' marks", mt_strerror(e),
           *err ? ": " : "", err);
    return stop_requested(d) ? 1 : 2;
}

/* Trains the step the cover holds (@p b its examples, possibly none: a range up to a cut
 * with no message in it), retrying while a shard does not answer (a retry is skipped where
 * it was applied); marks its messages @p held once applied. With pipelined steps (@p fl on)
 * a step with examples goes in flight (covered_step_pipelined); one without waits for the
 * step in flight first (its range follows that step's). @returns 0 (applied or skipped by
 * every shard, or in flight), 2 (a shard refused it, or a pipelined step failed: the caller
 * resets), or 1 (stop). */
static int covered_step(daemon_t *d, mt_cover_t *cv, mt_batch_t *b, float *probs, double *loss_sum,
                        inflight_t *fl, mt_kafka_consumer_t *kc, const mt_kafka_msg_t *held,
                        size_t nheld) {
    const mt_psc_range_t *r;
    size_t nr = mt_cover_ranges(cv, &r);
    if (!nr) return 0;
    if (fl->on && b->n)
        return covered_step_pipelined(d, cv, b, probs, loss_sum, fl, kc, held, nheld);
    if (inflight_confirm(fl, d, kc) < 0) {
        mt_cover_abort(cv);
        return stop_requested(d) ? 1 : 2;
    }
    for (unsigned attempt = 0;; attempt++) {
        char err[512] = "";
        mt_trainer_step_t st = {0};
        uint32_t now_s = (uint32_t)time(NULL);
        mt_err_t e;
        if (b->n) {
            mt_trainer_set_cover(d->tr, r, nr);
            e = mt_trainer_train(d->tr, b, now_s, probs, &st);
        } else {
            mt_rpc_status_t rs = {0};
            e = mt_psc_apply_cover(d->psc, NULL, 0, NULL, 0, now_s, 0, 0, r, nr, &st.skipped_shards,
                                   NULL, NULL, &rs);
            if (e) snprintf(err, sizeof(err), "%s", rs.message);
        }
        if (!e && d->dense) {
            if (b->n) {
                mt_trainer_dense_sync_set_cover(d->dense, r, nr);
                int synced = 0;
                e = mt_trainer_dense_sync_step(d->dense, &synced, err, sizeof(err));
                if (!e && synced) atomic_fetch_add(&d->ctr.dense_syncs, 1);
            } else {
                mt_rpc_status_t rs = {0};
                e = mt_psc_push_dense_cover(d->psc, NULL, NULL, 0, 0, r, nr, NULL, NULL, &rs);
                if (e) snprintf(err, sizeof(err), "%s", rs.message);
            }
        }
        if (!e) {
            if (b->n) {
                mt_eval_add(d->eval, probs, b->labels, b->n);
                *loss_sum += (double)st.loss * (double)b->n;
                atomic_fetch_add(&d->ctr.examples, b->n);
                atomic_fetch_add(&d->ctr.batches, 1);
            }
            if (st.skipped_shards == mt_psc_num_shards(d->psc))
                atomic_fetch_add(&d->ctr.steps_skipped, 1);
            mt_cover_commit(cv);
            for (size_t k = 0; k < nheld; k++)
                mt_kafka_consumer_mark(kc, &held[k]);
            return 0;
        }
        if (e == MT_OUT_OF_ORDER) {
            atomic_fetch_add(&d->ctr.out_of_order, 1);
            mt_log(MT_LOG_INFO, WHO, "a shard refused the step (%s): reading the marks again",
                   *err ? err : "out of order");
            mt_cover_abort(cv);
            return 2;
        }
        atomic_fetch_add(&d->ctr.ps_errors, 1);
        if (e == MT_MISMATCH || e == MT_INVALID || e == MT_NOMEM || stop_requested(d)) {
            mt_log(MT_LOG_ERROR, WHO, "training step: %s%s%s", mt_strerror(e), *err ? ": " : "",
                   err);
            return 1;
        }
        if (attempt % 10 == 0)
            mt_log(MT_LOG_WARN, WHO, "training step: %s%s%s (retrying: a retry is applied once)",
                   mt_strerror(e), *err ? ": " : "", err);
        usleep(100000u << (attempt < 3 ? attempt : 3));
    }
}

/* The online loop of a trainer among many (trainer.idempotent): the partitions Kafka gives
 * it, each from the lowest mark of the shards, in covered steps. It records nothing of its
 * own; its Kafka commits (for lag monitoring) are the lowest durable marks. */
static int run_online_marks(daemon_t *d, mt_kafka_consumer_t *kc, uint64_t max_examples,
                            double duration_s, int until_caught_up) {
    size_t bs = d->cfg.trainer.batch_size;
    mt_kafka_msg_t *msgs = calloc(bs, sizeof(*msgs));
    mt_kafka_msg_t *held = calloc(bs, sizeof(*held)); /* the step's messages, to mark */
    float *probs = malloc(bs * sizeof(float));
    mt_batch_t b = {0};
    mt_cover_t *cv = NULL;
    int rc = 0;
    uint64_t gen = 0;
    if (!msgs || !held || !probs || mt_batch_init(&b, d->slots, (uint32_t)d->nslots) ||
        mt_cover_create(&cv)) {
        rc = 1;
        goto out;
    }
    pass_result_t res = {0};
    double t0 = mt_mono_s(), next_progress = t0 + d->cfg.trainer.progress_interval_ms / 1000.0;
    double next_commit = t0 + d->cfg.trainer.commit_interval_ms / 1000.0, next_lag = t0;
    uint64_t last_examples = 0;
    double last_t = t0;
    size_t last_n = 1, nheld = 0;
    int need_reset = 1;
    double last_msg = t0, next_idle_check = t0 + IDLE_CHECK_S;
    inflight_t fl = {0};
    if (d->cfg.trainer.pipelined) {
        if (mt_trainer_set_pipelined(d->tr, 1) == MT_OK) {
            fl.on = 1;
            mt_log(MT_LOG_INFO, WHO,
                   "pipelined covered steps: one apply in flight while the next step computes");
        } else
            mt_log(MT_LOG_WARN, WHO, "pipelined steps: no apply thread: steps one after another");
    }
    while (!stop_requested(d)) {
        if (max_examples && res.examples >= max_examples) break;
        if (duration_s > 0 && mt_mono_s() - t0 >= duration_s) break;
        if (until_caught_up && !last_n && !need_reset && mt_kafka_consumer_assigned(kc) &&
            mt_kafka_consumer_lag(kc) == 0)
            break;
        if (mt_mono_s() >= next_lag) {
            atomic_store(&d->ctr.kafka_lag, mt_kafka_consumer_lag(kc));
            next_lag = mt_mono_s() + 1.0;
        }
        uint64_t g0 = mt_kafka_consumer_generation(kc);
        if (need_reset || g0 != gen) {
            /* the step in flight lands (or fails) before the marks are read: either way the
             * marks then say where every shard is */
            (void)inflight_confirm(&fl, d, kc);
            mt_cover_abort(cv);
            mt_batch_clear(&b);
            nheld = 0;
            if ((rc = marks_reset(d, kc, cv, &gen)) != 0) break;
            need_reset = 0;
            continue;
        }
        size_t n = mt_kafka_consumer_poll(kc, msgs, bs, 200);
        last_n = n;
        if (mt_kafka_consumer_generation(kc) != gen) { /* partitions moved during the poll */
            need_reset = 1;
            continue;
        }
        /* A seek right after an assignment can be lost inside librdkafka (its issue #2256):
         * the partition then fetches nothing. Messages behind (lag) and none for
         * STALL_S: seek again. */
        double tnow = mt_mono_s();
        if (n) {
            last_msg = tnow;
        } else if (tnow >= next_idle_check) {
            next_idle_check = tnow + IDLE_CHECK_S;
            if (shards_behind(d, cv)) {
                mt_log(MT_LOG_INFO, WHO,
                       "a shard is behind this trainer's partitions (it restarted): re-feeding it");
                need_reset = 1;
                continue;
            }
        }
        if (n) {
            /* messages: no stall */
        } else if (tnow - last_msg > STALL_S && atomic_load(&d->ctr.kafka_lag) > 0) {
            atomic_fetch_add(&d->ctr.consumer_stalls, 1);
            mt_log(MT_LOG_WARN, WHO,
                   "no message for %.0f s with %" PRId64 " behind: seeking to the marks again",
                   tnow - last_msg, (int64_t)atomic_load(&d->ctr.kafka_lag));
            last_msg = tnow;
            need_reset = 1;
            continue;
        }
        for (size_t i = 0; i < n && !need_reset && !rc; i++) {
            /* (a step never outgrows the batch: a poll brings at most bs messages) */
            int a = mt_cover_add(cv, msgs[i].topic, msgs[i].partition, msgs[i].offset);
            if (a == MT_COVER_CLOSE) {
                int t = covered_step(d, cv, &b, probs, &res.loss_sum, &fl, kc, held, nheld);
                if (t == 1) rc = 1;
                if (t == 2) need_reset = 1;
                if (t) break;
                res.examples += b.n;
                mt_batch_clear(&b);
                nheld = 0;
                a = mt_cover_add(cv, msgs[i].topic, msgs[i].partition, msgs[i].offset);
            }
            if (a == MT_COVER_GAP) { /* the consumer skipped messages: drop the step, seek */
                atomic_fetch_add(&d->ctr.consumer_gaps, 1);
                mt_log(MT_LOG_WARN, WHO,
                       "%s/%d@%" PRId64 ": past the next offset of the partition (the consumer "
                       "skipped messages): seeking back to the shards' marks",
                       msgs[i].topic, (int)msgs[i].partition, msgs[i].offset);
                need_reset = 1;
                break;
            }
            if (a != MT_COVER_ADDED) continue; /* not ours, or delivered twice */
            held[nheld++] = msgs[i];
            uint32_t ignored = 0;
            char why[256] = "";
            mt_err_t e =
                mt_example_decode(msgs[i].value, msgs[i].len, &b, &ignored, why, sizeof(why));
            if (e == MT_NOMEM) {
                rc = 1;
                break;
            }
            if (e) { /* in the step's range all the same: consumed, no example */
                atomic_fetch_add(&d->ctr.bad_messages, 1);
                if (d->bad_logged++ < BAD_LOG_MAX)
                    mt_log(MT_LOG_WARN, WHO, "%s/%d@%" PRId64 ": bad message skipped: %s",
                           msgs[i].topic, (int)msgs[i].partition, msgs[i].offset, why);
            }
            if (ignored) atomic_fetch_add(&d->ctr.ignored_slots, ignored);
        }
        if (rc) break;
        if (need_reset) continue;
        /* the rest of the poll */
        int t = covered_step(d, cv, &b, probs, &res.loss_sum, &fl, kc, held, nheld);
        if (t == 1) {
            rc = 1;
            break;
        }
        if (t == 2) {
            need_reset = 1;
            continue;
        }
        res.examples += b.n;
        mt_batch_clear(&b);
        nheld = 0;
        double now = mt_mono_s();
        if (n && now >= next_commit) { /* at least a second apart: a Stats round trip */
            unsigned ms =
                d->cfg.trainer.commit_interval_ms > 1000 ? d->cfg.trainer.commit_interval_ms : 1000;
            next_commit = now + ms / 1000.0;
            commit_durable(d, kc);
        }
        if (d->cfg.trainer.progress_interval_ms && now >= next_progress) {
            next_progress = now + d->cfg.trainer.progress_interval_ms / 1000.0;
            mt_eval_result_t er;
            mt_eval_result(d->eval, &er);
            store_double(&d->ctr.window_auc_bits, er.window_auc);
            store_double(&d->ctr.window_loss_bits, er.window_logloss);
            fprintf(stderr,
                    "online  %" PRIu64 " ex  %.0f ex/s  window(%zu) loss %.4f  auc %.4f  "
                    "partitions %zu  lag %" PRId64 "  skipped %" PRIu64 "  bad %" PRIu64 "\n",
                    res.examples, (double)(res.examples - last_examples) / (now - last_t),
                    er.window_n, er.window_logloss, er.window_auc, mt_kafka_consumer_assigned(kc),
                    (int64_t)atomic_load(&d->ctr.kafka_lag), atomic_load(&d->ctr.steps_skipped),
                    atomic_load(&d->ctr.bad_messages));
            last_examples = res.examples;
            last_t = now;
        }
    }
    if (fl.on) { /* the last step in flight: a failure leaves it to the marks (a next run) */
        if (inflight_confirm(&fl, d, kc) < 0 && !rc) {
            mt_log(MT_LOG_ERROR, WHO,
                   "the last pipelined step failed: the shards' marks hold "
                   "what a next run re-feeds");
            rc = 1;
        }
        mt_trainer_set_pipelined(d->tr, 0);
    }
    free(fl.msg);
    res.seconds = mt_mono_s() - t0;
    mt_eval_result(d->eval, &res.ev);
    if (write_report(d, "online", &res, 1, NULL, 0)) rc = 1;
out:
    mt_cover_destroy(cv);
    mt_batch_free(&b);
    free(msgs);
    free(held);
    free(probs);
    return rc;
}

/* Pipelined steps that failed are dropped unmarked: the exactly-once mode recovers from its
 * last checkpoint, the at-least-once mode seeks back to its marks. @returns 0 or the status
 * to stop with (recover()'s). */
static int drop_steps(daemon_t *d, mt_coord_t *co, mt_kafka_consumer_t *kc) {
    if (d->exact) return recover(d, co, kc);
    char err[512] = "";
    if (mt_kafka_consumer_reseek(kc, err, sizeof(err))) mt_log(MT_LOG_WARN, WHO, "%s", err);
    return 0;
}

static int run_online(daemon_t *d, uint64_t max_examples, double duration_s, int until_caught_up) {
    char bootstrap[8192], berr[512] = "";
    if (mt_config_kafka_bootstrap(&d->cfg, bootstrap, sizeof(bootstrap), berr, sizeof(berr))) {
        mt_log(MT_LOG_ERROR, WHO, "%s", berr);
        return 1;
    }
    char session[64];
    snprintf(session, sizeof(session), "session.timeout.ms=%u", d->cfg.kafka.session_timeout_ms);
    const char *conf[] = {session, NULL};
    const char *topics[] = {d->cfg.kafka.examples_topic};
    mt_kafka_consumer_t *kc = NULL;
    char err[512] = "";
    if (mt_kafka_consumer_create(bootstrap, d->cfg.kafka.group, topics, 1, conf, &kc, err,
                                 sizeof(err))) {
        mt_log(MT_LOG_ERROR, WHO, "Kafka consumer on %s: %s", bootstrap, err);
        return 1;
    }
    mt_log(MT_LOG_INFO, WHO, "consuming %s from %s as group %s%s", d->cfg.kafka.examples_topic,
           bootstrap, d->cfg.kafka.group,
           d->cfg.trainer.idempotent ? " (one of many trainers: covered steps)" : "");
    if (d->cfg.trainer.idempotent) {
        int mrc = run_online_marks(d, kc, max_examples, duration_s, until_caught_up);
        mt_kafka_consumer_destroy(kc);
        return mrc;
    }
    size_t bs = d->cfg.trainer.batch_size;
    mt_kafka_msg_t *msgs = calloc(bs, sizeof(*msgs));
    float *probs = malloc(bs * sizeof(float));
    mt_batch_t b = {0};
    mt_coord_t *co = NULL;
    int rc = 0;
    if (!msgs || !probs || mt_batch_init(&b, d->slots, (uint32_t)d->nslots)) {
        rc = 1;
        goto out;
    }
    uint64_t since_ckpt = 0; /* messages marked since the last checkpoint */
    double ckpt_period = d->cfg.trainer.checkpoint_interval_s;
    inflight_t fl = {0};
    if (d->cfg.trainer.pipelined && d->psc) {
        if (mt_trainer_set_pipelined(d->tr, 1) == MT_OK) {
            fl.on = 1;
            mt_log(MT_LOG_INFO, WHO,
                   "pipelined steps: one apply in flight while the next step "
                   "computes (its messages marked once it is confirmed)");
        } else
            mt_log(MT_LOG_WARN, WHO, "pipelined steps: no apply thread: steps one after another");
    }
    if (d->exact) {
        mt_coord_config_t cc;
        mt_coord_config_init(&cc);
        cc.token = d->cfg.ps.admin_token;
        cc.recovery_timeout_s = d->cfg.trainer.recovery_timeout_s;
        cc.stop = stop_cb;
        cc.stop_ud = d;
        if (mt_coord_create(d->psc, &cc, &co) != MT_OK) {
            rc = 1;
            goto out;
        }
        if ((rc = recover(d, co, kc)) != 0) goto out;
    }
    pass_result_t res = {0};
    double t0 = mt_mono_s(), next_progress = t0 + d->cfg.trainer.progress_interval_ms / 1000.0;
    double next_commit = t0 + d->cfg.trainer.commit_interval_ms / 1000.0;
    uint64_t last_examples = 0;
    double last_t = t0, next_lag = t0, next_ckpt = t0 + ckpt_period;
    size_t last_n = 1;        /* messages of the last poll (none yet: not caught up) */
    uint64_t uncommitted = 0; /* messages marked since the last commit that succeeded */
    double last_msg = t0;     /* when the last poll with messages returned */
    uint64_t seen_gen = 0;    /* the consumer's generation at last_msg */
    while (!stop_requested(d)) {
        if (max_examples && res.examples >= max_examples) break;
        if (duration_s > 0 && mt_mono_s() - t0 >= duration_s) break;
        /* caught up: an empty poll, partitions assigned, every one at its high watermark */
        if (until_caught_up && !last_n && mt_kafka_consumer_assigned(kc) &&
            mt_kafka_consumer_lag(kc) == 0)
            break;
        if (mt_mono_s() >= next_lag) { /* a few librdkafka calls: once a second */
            atomic_store(&d->ctr.kafka_lag, mt_kafka_consumer_lag(kc));
            next_lag = mt_mono_s() + 1.0;
        }
        size_t want = bs;
        if (max_examples && max_examples - res.examples < want)
            want = (size_t)(max_examples - res.examples);
        size_t n = mt_kafka_consumer_poll(kc, msgs, want, 200);
        last_n = n;
        /* Messages behind (lag) and none for STALL_S: a partition's fetch stopped (a seek
         * lost inside librdkafka, its issue #2256). Nothing is held unmarked here. */
        double tpoll = mt_mono_s();
        uint64_t g = mt_kafka_consumer_generation(kc);
        if (n || g != seen_gen) { /* an assignment starts the clock again */
            last_msg = tpoll;
            seen_gen = g;
        } else if (tpoll - last_msg > STALL_S && atomic_load(&d->ctr.kafka_lag) > 0) {
            atomic_fetch_add(&d->ctr.consumer_stalls, 1);
            mt_log(MT_LOG_WARN, WHO,
                   "no message for %.0f s with %" PRId64 " behind: seeking to the positions again",
                   tpoll - last_msg, (int64_t)atomic_load(&d->ctr.kafka_lag));
            long k = inflight_confirm(&fl, d, kc); /* its messages marked, or to be re-read */
            if (k > 0) since_ckpt += (uint64_t)k, uncommitted += (uint64_t)k;
            if (mt_kafka_consumer_reseek(kc, err, sizeof(err))) mt_log(MT_LOG_WARN, WHO, "%s", err);
            last_msg = tpoll;
            continue;
        }
        /* decode; garbage is marked (skipped for good) */
        for (size_t i = 0; i < n; i++) {
            uint32_t ignored = 0;
            char why[256] = "";
            mt_err_t e =
                mt_example_decode(msgs[i].value, msgs[i].len, &b, &ignored, why, sizeof(why));
            if (e == MT_NOMEM) {
                rc = 1;
                goto out;
            }
            if (e) {
                atomic_fetch_add(&d->ctr.bad_messages, 1);
                if (d->bad_logged++ < BAD_LOG_MAX)
                    mt_log(MT_LOG_WARN, WHO, "%s/%d@%" PRId64 ": bad message skipped: %s",
                           msgs[i].topic, (int)msgs[i].partition, msgs[i].offset, why);
            }
            if (ignored) atomic_fetch_add(&d->ctr.ignored_slots, ignored);
        }
        int handed = 0; /* pipelined: this poll's step went in flight */
        uint64_t marked = 0;
        if (b.n) {
            int previous = 0;
            int t = fl.on ? train_step(d, &b, probs, &res.loss_sum, &previous)
                          : train_batch(d, &b, probs, &res.loss_sum);
            if (t == 0 && fl.on && fl.busy && !previous) t = d->exact ? 2 : 3; /* cannot be */
            if (t == 2 || t == 3) {
                /* this batch (and the one in flight) dropped unmarked */
                mt_batch_clear(&b);
                if (fl.on) (void)mt_trainer_wait(d->tr, NULL); /* nothing in flight after */
                fl.n = 0;
                fl.busy = 0;
                if ((rc = drop_steps(d, co, kc)) != 0) break;
                if (d->exact) { /* back at the last checkpoint */
                    since_ckpt = 0;
                    next_ckpt = mt_mono_s() + ckpt_period;
                }
                continue;
            }
            if (t) {
                rc = 1; /* nothing of this batch is marked: it is replayed after a restart */
                break;
            }
            res.examples += b.n;
            mt_batch_clear(&b);
            if (fl.on) {
                if (fl.busy) { /* confirmed by this step: applied */
                    marked += fl.n;
                    inflight_mark(&fl, kc);
                }
                if (inflight_set(&fl, msgs, n)) {
                    rc = 1;
                    break;
                }
                handed = 1;
            }
        }
        double now = mt_mono_s();
        int due = (d->exact && now >= next_ckpt) ||
                  (!d->exact && (d->cfg.trainer.commit_interval_ms == 0 || now >= next_commit));
        /* The step in flight must land first before a checkpoint or a commit (they hold only
         * what was applied) and before the messages of a poll of garbage only are marked
         * behind it. */
        if (fl.busy && (due || (!handed && n))) {
            long k = inflight_confirm(&fl, d, kc);
            if (k < 0) {
                if ((rc = drop_steps(d, co, kc)) != 0) break;
                if (d->exact) { /* back at the last checkpoint */
                    since_ckpt = 0;
                    next_ckpt = mt_mono_s() + ckpt_period;
                }
                continue;
            }
            marked += (uint64_t)k;
        }
        /* the updates of every message up to here are applied on the PS: mark them (with
         * pipelined steps, those of a step in flight once it is confirmed) */
        if (!handed) {
            for (size_t i = 0; i < n; i++)
                mt_kafka_consumer_mark(kc, &msgs[i]);
            marked += n;
        }
        n = (size_t)marked; /* what the bookkeeping below counts */
        since_ckpt += n;
        if (d->exact && now >= next_ckpt) {
            /* a checkpoint of what was applied; with nothing new, a look at the incarnations
             * (an idle trainer still notices a shard that restarted) */
            char why[512] = "";
            int bad = since_ckpt ? checkpoint(d, co, kc) : mt_coord_check(co, why, sizeof(why));
            if (!since_ckpt && bad) mt_log(MT_LOG_WARN, WHO, "%s: recovering", why);
            if (bad == EXIT_FENCED) {
                rc = bad;
                break;
            }
            if (bad && (rc = recover(d, co, kc)) != 0) break;
            since_ckpt = 0;
            next_ckpt = mt_mono_s() + ckpt_period;
        } else if (!d->exact && (uncommitted += n) > 0 &&
                   (d->cfg.trainer.commit_interval_ms == 0 || now >= next_commit)) {
            /* idle polls commit too: the last messages of a burst are committed within an
             * interval, not when the next message comes (the group's lag would stay) */
            next_commit = now + d->cfg.trainer.commit_interval_ms / 1000.0;
            if (!commit(d, kc)) uncommitted = 0;
        }
        if (d->cfg.trainer.progress_interval_ms && now >= next_progress) {
            next_progress = now + d->cfg.trainer.progress_interval_ms / 1000.0;
            mt_eval_result_t er;
            mt_eval_result(d->eval, &er);
            store_double(&d->ctr.window_auc_bits, er.window_auc);
            store_double(&d->ctr.window_loss_bits, er.window_logloss);
            fprintf(stderr,
                    "online  %" PRIu64 " ex  %.0f ex/s  window(%zu) loss %.4f  auc %.4f  "
                    "partitions %zu  lag %" PRId64 "  bad %" PRIu64 "\n",
                    res.examples, (double)(res.examples - last_examples) / (now - last_t),
                    er.window_n, er.window_logloss, er.window_auc, mt_kafka_consumer_assigned(kc),
                    (int64_t)atomic_load(&d->ctr.kafka_lag), atomic_load(&d->ctr.bad_messages));
            last_examples = res.examples;
            last_t = now;
        }
    }
    if (fl.on && !rc) { /* the last step in flight: marked if it landed */
        long k = inflight_confirm(&fl, d, kc);
        if (k > 0) since_ckpt += (uint64_t)k;
        if (k < 0 && d->exact) rc = 1; /* the next run recovers from the last checkpoint */
    }
    if (fl.on) mt_trainer_set_pipelined(d->tr, 0);
    free(fl.msg);
    int last = d->exact && !rc && since_ckpt ? checkpoint(d, co, kc) : 0;
    if (last == EXIT_FENCED) {
        rc = last; /* logged: another trainer took over */
    } else if (last) {
        mt_log(MT_LOG_ERROR, WHO,
               "last checkpoint failed: the next run redoes what followed checkpoint %" PRIu64,
               mt_coord_last(co));
        rc = gave_up(co);
    }
    if (!d->exact && d->dense && mt_trainer_dense_sync_flush(d->dense, err, sizeof(err))) {
        mt_log(MT_LOG_ERROR, WHO, "final dense push: %s", err);
        rc = 1;
    }
    if (!d->exact && commit(d, kc)) rc = 1;
    res.seconds = mt_mono_s() - t0;
    mt_eval_result(d->eval, &res.ev);
    if (write_report(d, "online", &res, 1, NULL, 0)) rc = 1;
out:
    mt_batch_free(&b);
    free(msgs);
    free(probs);
    mt_coord_destroy(co);
    mt_kafka_consumer_destroy(kc);
    return rc;
}

/* ---------------- main ---------------- */

int main(int argc, char **argv) {
    daemon_t d;
    memset(&d, 0, sizeof(d));
    d.started = mt_mono_s();
    atomic_store(&d.ctr.kafka_lag, -1);
    int rc = 2;
    const char *train = NULL, *eval = NULL;
    int online = 0, until_caught_up = 0;
    uint32_t epochs = 0;
    uint64_t max_examples = 0;
    double duration_s = 0;
    char err[512] = "";
    mt_http_t *http = NULL;
    if (mt_config_init(&d.cfg) != MT_OK) return 1;
    const char *epochs_s = NULL, *max_examples_s = NULL, *duration_s_s = NULL;
    const mt_config_cli_opt_t opts[] = {
        {"--online", &online, NULL, NULL},
        {"--train", NULL, &train, NULL},
        {"--eval", NULL, &eval, NULL},
        {"--report", NULL, &d.report_path, NULL},
        {"--epochs", NULL, &epochs_s, NULL},
        {"--max-examples", NULL, &max_examples_s, NULL},
        {"--duration-s", NULL, &duration_s_s, NULL},
        {"--until-caught-up", &until_caught_up, NULL, NULL},
    };
    mt_config_cli_t cli = {
        "monolith-trainer", usage, opts, sizeof(opts) / sizeof(opts[0]), NULL, 0};
    if ((rc = mt_config_cli(&cli, &d.cfg, argc, argv)) != MT_CONFIG_CLI_OK) goto out;
    rc = 2;
    const char *config = cli.config;
    int check_only = cli.check;
    char *end = NULL;
    if (epochs_s) {
        unsigned long x = strtoul(epochs_s, &end, 10);
        if (*end || x < 1 || x > 1000) {
            fprintf(stderr, "monolith-trainer: --epochs %s: expected 1..1000\n", epochs_s);
            goto out;
        }
        epochs = (uint32_t)x;
    }
    if (max_examples_s) {
        unsigned long long x = strtoull(max_examples_s, &end, 10);
        if (*end || x < 1) {
            fprintf(stderr, "monolith-trainer: --max-examples %s: expected >= 1\n", max_examples_s);
            goto out;
        }
        max_examples = x;
    }
    if (duration_s_s) {
        duration_s = strtod(duration_s_s, &end);
        if (*end || !(duration_s > 0)) {
            fprintf(stderr, "monolith-trainer: --duration-s %s: expected > 0\n", duration_s_s);
            goto out;
        }
    }
    d.nslots = 256;
    if (mt_config_derive_trainer_slots(&d.cfg, d.slots, &d.nslots, err, sizeof(err)) != MT_OK ||
        mt_config_validate(&d.cfg, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-trainer: %s: %s\n", config, err);
        goto out;
    }
    if (d.nslots == 0) {
        fprintf(stderr,
                "monolith-trainer: %s: trainer.slots: no feature slots: list them, or map "
                "columns to slots in input.columns (format tsv / csv; a [slot.N] section of a "
                "slot the columns do not name keeps theirs from being used)\n",
                config);
        goto out;
    }
    /* the TLS files of its PS channels, as they will be read: exit 2, with --check or not */
    if (d.cfg.cluster.nps && mt_config_rpc_check_tls(&d.cfg, 0, err, sizeof(err)) != MT_OK) {
        fprintf(stderr, "monolith-trainer: %s: %s\n", config, err);
        goto out;
    }
    if (d.cfg.trainer.pipelined && !d.cfg.cluster.nps) {
        fprintf(stderr,
                "monolith-trainer: %s: trainer.pipelined needs the PS shards (cluster.ps)\n",
                config);
        rc = 2;
        goto out;
    }
    if (d.cfg.trainer.idempotent && (!d.cfg.cluster.nps || d.cfg.trainer.dense_sync_batches != 1 ||
                                     d.cfg.trainer.checkpoint_interval_s)) {
        fprintf(stderr,
                "monolith-trainer: %s: trainer.idempotent needs the PS shards (cluster.ps), "
                "trainer.dense_sync_batches = 1 and trainer.checkpoint_interval_s = 0\n",
                config);
        rc = 2;
        goto out;
    }
    if (check_only) {
        printf("%s: ok (%zu feature slots, %zu table slots)\n", config, d.nslots, d.cfg.nslots);
        rc = 0;
        goto out;
    }
    if (online == (train != NULL)) {
        fprintf(stderr, "monolith-trainer: give either --train FILE or --online\n");
        usage(stderr);
        goto out;
    }
    if (!train && (eval || epochs)) {
        fprintf(stderr, "monolith-trainer: --eval and --epochs are for --train\n");
        goto out;
    }
    if (train && (max_examples || duration_s > 0 || until_caught_up)) {
        fprintf(stderr, "monolith-trainer: --max-examples, --duration-s and --until-caught-up "
                        "are for --online\n");
        goto out;
    }
    if (!epochs) epochs = d.cfg.trainer.epochs;

    sigemptyset(&d.sigs);
    sigaddset(&d.sigs, SIGTERM);
    sigaddset(&d.sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &d.sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    struct sigaction stop_sa;
    memset(&stop_sa, 0, sizeof(stop_sa));
    stop_sa.sa_handler = on_stop_signal;
    sigemptyset(&stop_sa.sa_mask);
    sigaction(SIGTERM, &stop_sa, NULL);
    sigaction(SIGINT, &stop_sa, NULL);

    d.exact = online && d.cfg.trainer.checkpoint_interval_s > 0;
    if (d.exact && (!d.cfg.cluster.nps || !d.cfg.trainer.dense_sync_batches)) {
        fprintf(stderr, "monolith-trainer: trainer.checkpoint_interval_s needs the PS shards "
                        "(cluster.ps) to hold every parameter (trainer.dense_sync_batches > 0)\n");
        rc = 2;
        goto out;
    }
    rc = setup_trainer(&d);
    if (rc) goto out;
    if (*d.cfg.trainer.metrics_listen) {
        int port = 0;
        if (mt_http_start(d.cfg.trainer.metrics_listen, render, &d, &port, &http) != MT_OK) {
            mt_log(MT_LOG_ERROR, WHO, "cannot serve metrics on %s", d.cfg.trainer.metrics_listen);
            rc = 1;
            goto out;
        }
        mt_log(MT_LOG_INFO, WHO, "metrics on port %d", port);
    }
    mt_log(MT_LOG_INFO, WHO, "%zu feature slots, dim %u, MLP %s, parameters %s", d.nslots,
           d.cfg.trainer.dim, *d.cfg.trainer.hidden ? d.cfg.trainer.hidden : "(none)",
           d.psc ? "on the PS" : "local");
    rc = online ? run_online(&d, max_examples, duration_s, until_caught_up)
                : run_batch(&d, train, eval, epochs);
out:
    mt_http_stop(http);
    mt_trainer_dense_sync_destroy(d.dense);
    mt_trainer_destroy(d.tr);
    mt_psc_destroy(d.psc);
    mt_eval_destroy(d.eval);
    mt_config_free(&d.cfg);
    return rc;
}
