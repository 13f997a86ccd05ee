/*
 * run.c - a run of monolith-trainer (mt/trainer_run.h): creation (the trainer over a local
 * table or the PS shards, the dense parameters on shard 0), /metrics, the training step
 * with its retries, and batch mode (files, progressive validation, eval, the report). The
 * online loops are in online.c and online_marks.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mt/clock.h"
#include "mt/config_input.h"
#include "mt/config_rpc.h"
#include "mt/example_pb.h"
#include "mt/log.h"
#include "mt/metrics.h"
#include "mt/readers.h"
#include "run_int.h"

int mt__trainer_stopping(mt_trainer_run_t *d) {
    return d->stop && d->stop(d->stop_ud);
}

void mt__trainer_store_double(_Atomic uint64_t *a, double v) {
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

int mt_trainer_run_render(void *ud, const char *path, char **body, size_t *len) {
    mt_trainer_run_t *d = ud;
    if (strcmp(path, "/metrics") != 0) return 404;
    mt_metrics_page_t pg;
    if (mt_metrics_page_open(&pg, "monolith_trainer_") != MT_OK) return 500;
    FILE *f = mt_metrics_page_file(&pg);
    mt__trainer_counters_t *c = &d->ctr;
#define C(name, help, v) mt_metrics_counter(&pg, name, help, (uint64_t)(v))
#define G(name, help, v) mt_metrics_gauge(&pg, name, help, (double)(v))
    C("examples_total", "Examples trained on.", atomic_load(&c->examples));
    C("batches_total", "Training steps.", atomic_load(&c->batches));
    C("pipelined_steps_total",
      "Training steps that ran while the previous step's apply was in flight (trainer.pipelined).",
      atomic_load(&c->overlapped));
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
    if (d->ntasks > 1) { /* a multi-task model: each task's, the click's first */
        fprintf(f, "# HELP monolith_trainer_task_window_auc Progressive-validation AUC of each "
                   "task over the window.\n# TYPE monolith_trainer_task_window_auc gauge\n");
        for (uint32_t k = 0; k < d->ntasks; k++)
            fprintf(f, "monolith_trainer_task_window_auc{task=\"%u\"} %.6f\n", k,
                    load_double(&c->task_auc_bits[k]));
    }
    G("consumer_lag_messages",
      "Online: examples behind the high watermarks of the assigned partitions (-1: unknown).",
      atomic_load(&c->kafka_lag));
    fprintf(f, "# HELP monolith_trainer_step_seconds_total Wall-clock seconds of the training "
               "steps in each phase (ids: dedup; lookup; model: forward, backward, scatter; apply: "
               "the sparse update; dense: Adam or the dense store's rounds with the PS).\n"
               "# TYPE monolith_trainer_step_seconds_total counter\n");
    for (int p = 0; p < MT_TRAINER_NPHASES; p++)
        fprintf(f, "monolith_trainer_step_seconds_total{phase=\"%s\"} %.6f\n",
                mt_trainer_phase_name((mt_trainer_phase_t)p),
                (double)atomic_load(&c->phase_ns[p]) * 1e-9);
    G("uptime_seconds", "Seconds since start.", mt_mono_s() - d->started);
#undef C
#undef G
    return mt_metrics_page_close(&pg, (double)time(NULL) - (mt_mono_s() - d->started), body, len);
}

/* ---------------- the model ---------------- */

static int setup_trainer(mt_trainer_run_t *d) {
    const mt_config_trainer_t *t = &d->cfg->trainer;
    mt_trainer_config_t tc;
    mt_trainer_config_init(&tc);
    tc.nslots = (uint32_t)d->nslots;
    memcpy(tc.slot_ids, d->slots, d->nslots * sizeof(uint16_t));
    char err[256];
    if (mt_config_mean_slots(d->cfg, d->slots, d->nslots, tc.slot_mean, err, sizeof(err))) {
        mt_log(MT_LOG_ERROR, WHO, "%s", err);
        return 2;
    }
    mt_model_config_t mc;
    if (mt_config_slot_hash_buckets(d->cfg, d->slots, d->nslots, tc.slot_hash_buckets, err,
                                    sizeof(err)) ||
        mt_config_model(d->cfg, d->slots, d->nslots, tc.slot_dim, &mc, err, sizeof(err))) {
        mt_log(MT_LOG_ERROR, WHO, "%s", err);
        return 2;
    }
    tc.dim = mc.dim;
    tc.nhidden = mc.nhidden;
    memcpy(tc.hidden, mc.hidden, sizeof(tc.hidden));
    mt_model_family_get(&mc, &tc.family);
    tc.seed = mc.init_seed;
    tc.sparse_opt = t->sparse_opt;
    tc.sparse_lr = t->sparse_lr;
    tc.init_scale = t->init_scale;
    tc.min_count = t->min_count;
    tc.dense_lr = t->dense_lr;
    if (d->cfg->dense.opt == MT_OPT_ADAM) { /* [dense]'s Adam: the PS's and the local step's */
        tc.dense_beta1 = d->cfg->dense.beta1;
        tc.dense_beta2 = d->cfg->dense.beta2;
        tc.dense_eps = d->cfg->dense.eps;
    }
    tc.hash_buckets = t->hash_buckets;
    tc.cowclip_ratio = t->cowclip_ratio;
    tc.cowclip_zeta = t->cowclip_zeta;
    tc.table_initial_rows = t->table_initial_rows;
    mt_trainer_backend_t be;
    if (d->cfg->cluster.nps) {
        mt_psc_config_t pc;
        mt_psc_config_init(&pc);
        pc.addrs = (const char *const *)d->cfg->cluster.ps;
        pc.num_shards = (uint32_t)d->cfg->cluster.nps;
        mt_config_rpc_tls(d->cfg, &pc.rpc.tls);
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
            if (attempt == 30 || mt__trainer_stopping(d)) {
                mt_log(MT_LOG_ERROR, WHO, "dense parameters on the PS: %s", err);
                return 1;
            }
            mt_log(MT_LOG_WARN, WHO, "dense parameters on the PS: %s (retrying)", err);
            sleep(1);
        }
        mt_log(MT_LOG_INFO, WHO, "dense parameters on PS shard 0 (version %" PRIu64 ")",
               mt_trainer_dense_sync_version(d->dense));
    }
    d->ntasks = mt_trainer_ntasks(d->tr);
    for (uint32_t k = 0; k < d->ntasks; k++)
        if ((e = mt_eval_create(t->auc_window, &d->eval[k]))) return 1;
    return 0;
}

void mt__trainer_store_tasks(mt_trainer_run_t *d, mt_eval_t *const *ev, double auc0, char *line,
                             size_t len) {
    if (d->ntasks < 2) return;
    mt__trainer_store_double(&d->ctr.task_auc_bits[0], auc0);
    for (uint32_t k = 1, o = 0; k < d->ntasks; k++) {
        mt_eval_result_t r;
        mt_eval_result(ev[k], &r);
        mt__trainer_store_double(&d->ctr.task_auc_bits[k], r.window_auc);
        if (line && o < len)
            o +=
                (uint32_t)snprintf(line + o, len - o, "%s%.4f", k == 1 ? " / " : " ", r.window_auc);
    }
}

void mt__trainer_eval_results(const mt_trainer_run_t *d, mt_eval_t *const *ev,
                              mt__trainer_pass_t *res) {
    for (uint32_t k = 0; k < d->ntasks; k++)
        mt_eval_result(ev[k], &res->task_ev[k]);
}

mt_err_t mt__trainer_batch_init(const mt_trainer_run_t *d, mt_batch_t *b) {
    mt_err_t e = mt_batch_init(b, d->slots, (uint32_t)d->nslots);
    if (!e && (e = mt_batch_set_tasks(b, d->ntasks)) != MT_OK) mt_batch_free(b);
    return e;
}

mt_err_t mt__trainer_dense_step(mt_trainer_run_t *d, const mt_psc_range_t *cover, size_t ncover,
                                char *errbuf, size_t errlen) {
    if (!d->dense) return MT_OK;
    if (ncover) mt_trainer_dense_sync_set_cover(d->dense, cover, ncover);
    int synced = 0;
    double t = mt_mono_s();
    mt_err_t e = mt_trainer_dense_sync_step(d->dense, &synced, errbuf, errlen);
    atomic_fetch_add(&d->ctr.phase_ns[MT_TRAINER_PHASE_DENSE], (uint64_t)((mt_mono_s() - t) * 1e9));
    if (!e && synced) atomic_fetch_add(&d->ctr.dense_syncs, 1);
    return e;
}

void mt__trainer_count_step(mt_trainer_run_t *d, const mt_batch_t *b, const float *probs,
                            const mt_trainer_step_t *st, double *loss_sum) {
    for (uint32_t k = 0; k < d->ntasks; k++)
        mt_eval_add_task(d->eval[k], probs, b->labels, b->n, d->ntasks, k);
    *loss_sum += (double)st->loss * (double)b->n;
    for (int p = 0; p < MT_TRAINER_NPHASES; p++)
        atomic_fetch_add(&d->ctr.phase_ns[p], (uint64_t)(st->seconds[p] * 1e9));
    atomic_fetch_add(&d->ctr.examples, b->n);
    atomic_fetch_add(&d->ctr.batches, 1);
    if (st->previous) atomic_fetch_add(&d->ctr.overlapped, 1);
}

mt_err_t mt__trainer_decode(mt_trainer_run_t *d, const mt_kafka_msg_t *m, mt_batch_t *b) {
    uint32_t ignored = 0;
    char why[256] = "";
    mt_err_t e = mt_example_decode(m->value, m->len, b, &ignored, why, sizeof(why));
    if (e == MT_NOMEM) return e;
    if (e) {
        atomic_fetch_add(&d->ctr.bad_messages, 1);
        if (d->bad_logged++ < MT__TRAINER_BAD_LOG_MAX)
            mt_log(MT_LOG_WARN, WHO, "%s/%d@%" PRId64 ": bad message skipped: %s", m->topic,
                   (int)m->partition, m->offset, why);
    }
    if (ignored) atomic_fetch_add(&d->ctr.ignored_slots, ignored);
    return MT_OK;
}

void mt__trainer_progress(mt_trainer_run_t *d, mt_kafka_consumer_t *kc, uint64_t examples,
                          double now, int skipped, mt__trainer_progress_t *pr) {
    if (!d->cfg->trainer.progress_interval_ms || now < pr->next) return;
    pr->next = now + d->cfg->trainer.progress_interval_ms / 1000.0;
    mt_eval_result_t er;
    mt_eval_result(d->eval[0], &er);
    mt__trainer_store_double(&d->ctr.window_auc_bits, er.window_auc);
    mt__trainer_store_double(&d->ctr.window_loss_bits, er.window_logloss);
    char tasks[128] = ""; /* a multi-task model's other tasks' window AUCs */
    mt__trainer_store_tasks(d, d->eval, er.window_auc, tasks, sizeof(tasks));
    char sk[48] = "";
    if (skipped) snprintf(sk, sizeof(sk), "  skipped %" PRIu64, atomic_load(&d->ctr.steps_skipped));
    fprintf(stderr,
            "online  %" PRIu64 " ex  %.0f ex/s  window(%zu) loss %.4f  auc %.4f%s  "
            "partitions %zu  lag %" PRId64 "%s  bad %" PRIu64 "\n",
            examples, (double)(examples - pr->last_examples) / (now - pr->last_t), er.window_n,
            er.window_logloss, er.window_auc, tasks, mt_kafka_consumer_assigned(kc),
            (int64_t)atomic_load(&d->ctr.kafka_lag), sk, atomic_load(&d->ctr.bad_messages));
    pr->last_examples = examples;
    pr->last_t = now;
}

int mt__trainer_train_batch(mt_trainer_run_t *d, const mt_batch_t *b, float *probs,
                            double *loss_sum) {
    return mt__trainer_train_step(d, b, probs, loss_sum, NULL);
}

int mt__trainer_train_step(mt_trainer_run_t *d, const mt_batch_t *b, float *probs, double *loss_sum,
                           int *previous) {
    uint32_t now_s = (uint32_t)time(NULL);
    for (int attempt = 0;; attempt++) {
        mt_trainer_step_t st;
        mt_err_t e = mt_trainer_train(d->tr, b, now_s, probs, &st);
        if (previous) *previous = st.previous;
        char err[512] = "";
        if (!e) e = mt__trainer_dense_step(d, NULL, 0, err, sizeof(err));
        if (!e) {
            mt__trainer_count_step(d, b, probs, &st, loss_sum);
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
        if (attempt == 20 || mt__trainer_stopping(d)) {
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
    mt_trainer_run_t *d;
    const char *path;
} bad_ctx_t;

static void on_bad_line(void *opaque, uint64_t line, const char *reason) {
    bad_ctx_t *b = opaque;
    atomic_fetch_add(&b->d->ctr.bad_lines, 1);
    if (b->d->bad_logged++ < MT__TRAINER_BAD_LOG_MAX)
        mt_log(MT_LOG_WARN, WHO, "%s:%" PRIu64 ": bad line skipped: %s", b->path, line, reason);
    else if (b->d->bad_logged == MT__TRAINER_BAD_LOG_MAX + 1)
        mt_log(MT_LOG_WARN, WHO, "more bad lines: counting them only (see the report)");
}

/* Opens a reader of @p path on @p in as [input] says. @returns 0, 1 (I/O), 2 (config). */
static int open_reader(mt_trainer_run_t *d, const char *path, FILE *in, mt_reader_t **r) {
    const mt_config_input_t *ic = &d->cfg->input;
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
        e = mt_config_input_csv(d->cfg, &cc, err, sizeof(err));
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
static int check_reader_slots(mt_trainer_run_t *d, const mt_reader_t *r, const char *path) {
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

/* A pipelined batch pass (trainer.pipelined): the next batch's lookup and this step's apply
 * run on the trainer's pipeline thread while the next step computes (one step stale:
 * docs/trainer.md, "The pipelined step"). @returns 1 if the pipeline is on. */
static int pipeline_on(mt_trainer_run_t *d) {
    if (mt_trainer_set_pipelined(d->tr, 1) == MT_OK) return 1;
    mt_log(MT_LOG_WARN, WHO, "pipelined steps: no pipeline thread: steps one after another");
    return 0;
}

/* Ends a pipelined pass: the apply in flight lands; @returns 1 if it failed. */
static int pipeline_off(mt_trainer_run_t *d) {
    mt_err_t e = mt_trainer_wait(d->tr, NULL);
    mt_trainer_set_pipelined(d->tr, 0);
    if (!e) return 0;
    atomic_fetch_add(&d->ctr.ps_errors, 1);
    mt_log(MT_LOG_ERROR, WHO, "pipelined steps: the last step's apply: %s", mt_strerror(e));
    return 1;
}

/* One step of a pipelined pass. A failure of the step or of the previous step's apply (which
 * comes back from this step) turns the pipeline off (*pipe = 0): the previous step's update
 * is lost, as an unpipelined step's would be on an error that is not retried, and this batch
 * is trained again one step at a time with the usual retries. @returns 0, or 1 (the run
 * fails: the retries failed too, or the error is not one a retry mends). */
static int pipelined_step(mt_trainer_run_t *d, const mt_batch_t *b, float *probs, double *loss_sum,
                          int *pipe) {
    int previous = 0, t = mt__trainer_train_step(d, b, probs, loss_sum, &previous);
    if (t != 3) return t ? 1 : 0;       /* 3: a retryable error of a pipelined step */
    mt_trainer_set_pipelined(d->tr, 0); /* drops the next batch's prefetch */
    *pipe = 0;
    mt_log(MT_LOG_WARN, WHO, "pipelined steps: off for the rest of the pass after that error");
    return mt__trainer_train_batch(d, b, probs, loss_sum) ? 1 : 0;
}

/* One pass over @p path: training (progressive) or scoring only. @returns 0, 1, 2. */
static int run_pass(mt_trainer_run_t *d, const char *path, int train, uint32_t epoch,
                    uint32_t epochs, mt__trainer_pass_t *res) {
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
    mt_eval_t **ev = d->eval;
    mt_eval_t *own[MT_BATCH_MAX_TASKS] = {0};
    const uint32_t T = d->ntasks;
    if (!train) {
        for (uint32_t k = 0; k < T; k++)
            if (mt_eval_create(d->cfg->trainer.auc_window, &own[k])) rc = 1;
        ev = own;
    } else {
        for (uint32_t k = 0; k < T; k++)
            mt_eval_reset(ev[k]);
    }
    /* two batches, each the step's or the next one (read ahead by a pipelined pass: a
     * prefetch belongs to its batch's address, so the batches take turns, never copied) */
    mt_batch_t bt[2] = {{0}, {0}}, *b = &bt[0], *nb = &bt[1];
    float *probs = NULL;
    if (rc || mt_reader_batch_init(r, b) || mt_reader_batch_init(r, nb)) {
        rc = 1;
        goto done;
    }
    if (b->ntasks != T) { /* one label per task: the model's and the input's must agree */
        fprintf(stderr,
                "monolith-trainer: %s: the input gives %u label%s per example (input.label, "
                "input.task_labels) but the model has %u task%s (model.type, model.tasks)\n",
                path, b->ntasks, b->ntasks == 1 ? "" : "s", T, T == 1 ? "" : "s");
        rc = 2;
        goto done;
    }
    size_t bs = d->cfg->trainer.batch_size;
    probs = malloc(bs * T * sizeof(float));
    if (!probs) {
        rc = 1;
        goto done;
    }
    double t0 = mt_mono_s(), next_progress = t0 + d->cfg->trainer.progress_interval_ms / 1000.0;
    int pipe = train && d->cfg->trainer.pipelined && pipeline_on(d);
    mt_err_t e = mt_reader_next(r, b, bs);
    while (e == MT_OK) {
        int ahead = pipe; /* nb holds the next batch (read before this step), ne its result */
        mt_err_t ne = MT_OK;
        if (ahead) { /* hand its lookup over before this step (failed: its step looks up) */
            mt_batch_clear(nb);
            if ((ne = mt_reader_next(r, nb, bs)) == MT_OK)
                (void)mt_trainer_prefetch(d->tr, nb, (uint32_t)time(NULL));
        }
        if (train) {
            int t = pipe ? pipelined_step(d, b, probs, &res->loss_sum, &pipe)
                         : mt__trainer_train_batch(d, b, probs, &res->loss_sum);
            if (t) {
                rc = 1;
                break;
            }
        } else {
            if ((e = mt_trainer_predict(d->tr, b, probs))) break;
            for (uint32_t k = 0; k < T; k++)
                mt_eval_add_task(ev[k], probs, b->labels, b->n, T, k);
        }
        res->examples += b->n;
        mt_batch_clear(b);
        if (mt__trainer_stopping(d)) {
            mt_log(MT_LOG_WARN, WHO, "stopping as asked (a signal) after %" PRIu64 " examples",
                   res->examples);
            rc = 1;
            break;
        }
        double now = mt_mono_s();
        if (d->cfg->trainer.progress_interval_ms && now >= next_progress) {
            next_progress = now + d->cfg->trainer.progress_interval_ms / 1000.0;
            mt_eval_result_t er;
            mt_eval_result(ev[0], &er);
            if (train) mt__trainer_store_tasks(d, ev, er.window_auc, NULL, 0);
            mt__trainer_store_double(&d->ctr.window_auc_bits, er.window_auc);
            mt__trainer_store_double(&d->ctr.window_loss_bits, er.window_logloss);
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
        if (ahead) { /* the next batch becomes this one */
            mt_batch_t *tmp = b;
            b = nb;
            nb = tmp;
            e = ne;
        } else {
            e = mt_reader_next(r, b, bs);
        }
    }
    if (e != MT_OK && e != MT_NOT_FOUND && !rc) {
        mt_log(MT_LOG_ERROR, WHO, "%s: %s", path, mt_strerror(e));
        rc = 1;
    }
    if (pipe && pipeline_off(d) && !rc) rc = 1; /* the last step's apply lands (or fails) */
    res->seconds = mt_mono_s() - t0;
    mt__trainer_eval_results(d, ev, res);
    if (!train) res->loss_sum = res->task_ev[0].logloss * (double)res->task_ev[0].n;
done:
    free(probs);
    mt_batch_free(&bt[0]);
    mt_batch_free(&bt[1]);
    for (uint32_t k = 0; k < T; k++)
        mt_eval_destroy(own[k]);
out:
    mt_reader_destroy(r);
    fclose(in);
    return rc;
}

/* A JSON number, or null for NaN and infinities. */
static void json_value(FILE *f, double v) {
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

static void json_num(FILE *f, const char *key, double v, int last) {
    fprintf(f, "\"%s\": ", key);
    json_value(f, v);
    fputs(last ? "" : ", ", f);
}

/* "key": [the tasks' AUCs], */
static void json_tasks(FILE *f, const char *key, const mt__trainer_pass_t *p, uint32_t ntasks) {
    fprintf(f, "\"%s\": [", key);
    for (uint32_t k = 0; k < ntasks; k++) {
        fputs(k ? ", " : "", f);
        json_value(f, p->task_ev[k].auc);
    }
    fprintf(f, "], ");
}

int mt__trainer_write_report(mt_trainer_run_t *d, const char *mode, const mt__trainer_pass_t *tr,
                             uint32_t epochs, const mt__trainer_pass_t *ev, int have_eval) {
    printf("== monolith-trainer report (%s) ==\n", mode);
    if (!strcmp(mode, "batch"))
        printf("examples trained   %" PRIu64 " per epoch (%u epoch%s)\n", tr->examples, epochs,
               epochs == 1 ? "" : "s");
    else
        printf("examples trained   %" PRIu64 "\n", tr->examples);
    printf("examples/s         %.0f\n", tr->seconds > 0 ? tr->examples / tr->seconds : 0.0);
    printf("progressive AUC    %.4f   (%s; last %zu examples: %.4f)\n", tr->task_ev[0].auc,
           strcmp(mode, "batch") ? "all examples" : "last epoch", tr->task_ev[0].window_n,
           tr->task_ev[0].window_auc);
    printf("progressive logloss %.4f\n", tr->task_ev[0].logloss);
    if (have_eval)
        printf("eval AUC           %.4f   logloss %.4f   (%" PRIu64 " examples)\n",
               ev->task_ev[0].auc, ev->task_ev[0].logloss, ev->examples);
    for (uint32_t k = 1; k < d->ntasks; k++) { /* a multi-task model's other tasks */
        printf("task %u progressive AUC %.4f   logloss %.4f", k, tr->task_ev[k].auc,
               tr->task_ev[k].logloss);
        if (have_eval)
            printf("   eval AUC %.4f   logloss %.4f", ev->task_ev[k].auc, ev->task_ev[k].logloss);
        printf("\n");
    }
    printf("step seconds      ");
    for (int p = 0; p < MT_TRAINER_NPHASES; p++)
        printf(" %s %.3f", mt_trainer_phase_name((mt_trainer_phase_t)p),
               (double)atomic_load(&d->ctr.phase_ns[p]) * 1e-9);
    printf("\n");
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
    json_num(f, "progressive_auc", tr->task_ev[0].auc, 0);
    json_num(f, "progressive_logloss", tr->task_ev[0].logloss, 0);
    json_num(f, "window_auc", tr->task_ev[0].window_auc, 0);
    if (have_eval) {
        json_num(f, "eval_auc", ev->task_ev[0].auc, 0);
        json_num(f, "eval_logloss", ev->task_ev[0].logloss, 0);
        fprintf(f, "\"eval_examples\": %" PRIu64 ", ", ev->examples);
    }
    fprintf(f, "\"tasks\": %u, ", d->ntasks);
    if (d->ntasks > 1) { /* every task's, the click's first */
        json_tasks(f, "task_progressive_auc", tr, d->ntasks);
        if (have_eval) json_tasks(f, "task_eval_auc", ev, d->ntasks);
    }
    fprintf(f, "\"step_seconds\": {"); /* the run's steps by phase (mt_trainer_phase_t) */
    for (int p = 0; p < MT_TRAINER_NPHASES; p++)
        fprintf(f, "%s\"%s\": %.6f", p ? ", " : "", mt_trainer_phase_name((mt_trainer_phase_t)p),
                (double)atomic_load(&d->ctr.phase_ns[p]) * 1e-9);
    fprintf(f, "}, ");
    fprintf(f,
            "\"bad_lines\": %" PRIu64 ", \"bad_messages\": %" PRIu64 ", \"batches\": %" PRIu64
            ", \"pipelined_steps\": %" PRIu64 ", \"dense_syncs\": %" PRIu64
            ", \"commits\": %" PRIu64 ", \"checkpoints\": %" PRIu64 ", \"recoveries\": %" PRIu64
            ", \"last_checkpoint\": %" PRIu64 "}\n",
            atomic_load(&d->ctr.bad_lines), atomic_load(&d->ctr.bad_messages),
            atomic_load(&d->ctr.batches), atomic_load(&d->ctr.overlapped),
            atomic_load(&d->ctr.dense_syncs), atomic_load(&d->ctr.commits),
            atomic_load(&d->ctr.checkpoints), atomic_load(&d->ctr.recoveries),
            atomic_load(&d->ctr.last_checkpoint));
    if (fclose(f) != 0 || rename(tmp, d->report_path) != 0) {
        mt_log(MT_LOG_ERROR, WHO, "%s: %s", d->report_path, strerror(errno));
        return 1;
    }
    return 0;
}

int mt_trainer_run_batch(mt_trainer_run_t *d, const char *train, const char *eval,
                         uint32_t epochs) {
    mt__trainer_pass_t tr = {0}, ev = {0};
    int rc = 0;
    for (uint32_t ep = 1; ep <= epochs && !rc; ep++) {
        if ((rc = run_pass(d, train, 1, ep, epochs, &tr))) break;
        mt_log(MT_LOG_INFO, WHO,
               "epoch %u: %" PRIu64 " examples, %.0f ex/s, progressive auc %.4f logloss %.4f", ep,
               tr.examples, tr.seconds > 0 ? tr.examples / tr.seconds : 0.0, tr.task_ev[0].auc,
               tr.task_ev[0].logloss);
        if (eval) {
            if ((rc = run_pass(d, eval, 0, ep, epochs, &ev))) break;
            mt_log(MT_LOG_INFO, WHO, "epoch %u: eval auc %.4f logloss %.4f (%" PRIu64 " examples)",
                   ep, ev.task_ev[0].auc, ev.task_ev[0].logloss, ev.examples);
        }
    }
    if (!rc && d->dense) {
        char err[512];
        if (mt_trainer_dense_sync_flush(d->dense, err, sizeof(err))) {
            mt_log(MT_LOG_ERROR, WHO, "final dense push: %s", err);
            rc = 1;
        }
    }
    if (!rc) rc = mt__trainer_write_report(d, "batch", &tr, epochs, &ev, eval != NULL);
    return rc;
}

/* ---------------- creation and checks ---------------- */

mt_err_t mt_trainer_run_check(const mt_config_t *cfg, int online, char *errbuf, size_t errlen) {
    if (cfg->trainer.pipelined && online && !cfg->cluster.nps) {
        snprintf(errbuf, errlen,
                 "trainer.pipelined needs the PS shards (cluster.ps) online (a batch run "
                 "pipelines its own table too)");
        return MT_CONFIG;
    }
    if (cfg->trainer.idempotent && (!cfg->cluster.nps || cfg->trainer.dense_sync_batches != 1 ||
                                    cfg->trainer.checkpoint_interval_s)) {
        snprintf(errbuf, errlen,
                 "trainer.idempotent needs the PS shards (cluster.ps), "
                 "trainer.dense_sync_batches = 1 and trainer.checkpoint_interval_s = 0");
        return MT_CONFIG;
    }
    if (online && cfg->trainer.checkpoint_interval_s > 0 &&
        (!cfg->cluster.nps || !cfg->trainer.dense_sync_batches)) {
        snprintf(errbuf, errlen,
                 "trainer.checkpoint_interval_s needs the PS shards (cluster.ps) to hold every "
                 "parameter (trainer.dense_sync_batches > 0)");
        return MT_CONFIG;
    }
    return MT_OK;
}

int mt_trainer_run_create(const mt_trainer_run_config_t *rc, mt_trainer_run_t **out) {
    *out = NULL;
    if (!rc->cfg || !rc->slots || rc->nslots < 1 || rc->nslots > 256) return MT_TRAINER_EXIT_CONFIG;
    char err[512];
    if (mt_trainer_run_check(rc->cfg, rc->online, err, sizeof(err))) {
        mt_log(MT_LOG_ERROR, WHO, "%s", err);
        return MT_TRAINER_EXIT_CONFIG;
    }
    mt_trainer_run_t *d = calloc(1, sizeof(*d));
    if (!d) return MT_TRAINER_EXIT_FAILED;
    *out = d;
    d->cfg = rc->cfg;
    memcpy(d->slots, rc->slots, rc->nslots * sizeof(uint16_t));
    d->nslots = rc->nslots;
    d->report_path = rc->report_path;
    d->stop = rc->stop;
    d->stop_ud = rc->stop_ud;
    d->started = mt_mono_s();
    atomic_store(&d->ctr.kafka_lag, -1);
    d->exact = rc->online && rc->cfg->trainer.checkpoint_interval_s > 0;
    return setup_trainer(d);
}

int mt_trainer_run_on_ps(const mt_trainer_run_t *r) {
    return r->psc != NULL;
}

void mt_trainer_run_destroy(mt_trainer_run_t *r) {
    if (!r) return;
    mt_trainer_dense_sync_destroy(r->dense);
    mt_trainer_destroy(r->tr);
    mt_psc_destroy(r->psc);
    for (uint32_t k = 0; k < MT_BATCH_MAX_TASKS; k++)
        mt_eval_destroy(r->eval[k]);
    free(r);
}
