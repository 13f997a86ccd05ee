/*
 * online.c - the online loop of monolith-trainer (mt/trainer_run.h): a member of the
 * consumer group on the examples topic, at least once (offsets committed after the PS
 * applied the updates) or exactly once with cluster checkpoints (mt/coord.h), pipelined
 * steps included; one of many trainers (trainer.idempotent) goes to online_marks.c.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mt/clock.h"
#include "mt/coord.h"
#include "mt/log.h"
#include "run_int.h"

/* ---------------- online mode ---------------- */

static int commit(mt_trainer_run_t *d, mt_kafka_consumer_t *kc) {
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
    return mt__trainer_stopping(ud);
}

/* The one line a fenced trainer ends with: "stopping: fenced: <why>". */
static void log_fenced(const char *why) {
    mt_log(MT_LOG_ERROR, WHO, "stopping: %s%s", strncmp(why, "fenced", 6) ? "fenced: " : "", why);
}

/* A recovery that failed for another reason may have met another trainer's takeover (its
 * restores and checkpoints race ours): @returns MT_TRAINER_EXIT_FENCED if a shard has seen a higher
 * coordinator epoch (logged), else 1. */
static int gave_up(mt_coord_t *co) {
    char why[512] = "";
    if (mt_coord_epoch(co) && mt_coord_check(co, why, sizeof(why)) == MT_FENCED) {
        log_fenced(why);
        return MT_TRAINER_EXIT_FENCED;
    }
    return 1;
}

/* Rolls the shards and the consumer back to the last complete checkpoint and resets the
 * dense copy. @returns 0, 1 (gave up: the trainer exits and a restart recovers) or
 * MT_TRAINER_EXIT_FENCED (another trainer took over: stop for good). */
static int recover(mt_trainer_run_t *d, mt_coord_t *co, mt_kafka_consumer_t *kc) {
    char err[512] = "";
    atomic_fetch_add(&d->ctr.recoveries, 1);
    for (int attempt = 0; attempt < 5 && !mt__trainer_stopping(d); attempt++) {
        mt_coord_point_t pt;
        mt_err_t e = mt_coord_recover(co, &pt, err, sizeof(err));
        if (e == MT_FENCED) {
            log_fenced(err);
            return MT_TRAINER_EXIT_FENCED;
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
            return MT_TRAINER_EXIT_FENCED;
        }
        mt_log(MT_LOG_WARN, WHO, "recovery: %s (again)", err);
        sleep(1);
    }
    mt_log(MT_LOG_ERROR, WHO, "recovery did not finish: %s", err);
    return gave_up(co);
}

/* A cluster checkpoint of everything applied (nothing is in flight: one thread). On success
 * its positions are committed to Kafka (for lag monitoring and tools: recovery reads the
 * checkpoint's own). @returns 0, 1 (the caller recovers) or MT_TRAINER_EXIT_FENCED (stop). */
static int checkpoint(mt_trainer_run_t *d, mt_coord_t *co, mt_kafka_consumer_t *kc) {
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
        return MT_TRAINER_EXIT_FENCED;
    }
    mt_log(MT_LOG_WARN, WHO, "checkpoint failed: %s%s%s", mt_strerror(e), *err ? ": " : "", err);
    return 1;
}

/* ---- pipelined steps: the messages of the step in flight ---- */

/* Marks the messages of the step in flight, now applied. */
void mt__trainer_inflight_mark(mt__trainer_inflight_t *f, mt_kafka_consumer_t *kc) {
    for (size_t i = 0; i < f->n; i++)
        mt_kafka_consumer_mark(kc, &f->msg[i]);
    f->n = 0;
    f->busy = 0;
}

/* The step in flight (if any) answered: marked on success. @returns the number of messages
 * marked, or -1 on error (nothing in flight afterwards, nothing marked). */
long mt__trainer_inflight_confirm(mt__trainer_inflight_t *f, mt_trainer_run_t *d,
                                  mt_kafka_consumer_t *kc) {
    if (!f->on || !f->busy) return 0;
    mt_err_t e = mt_trainer_wait(d->tr, NULL);
    long n = (long)f->n;
    if (e) {
        atomic_fetch_add(&d->ctr.ps_errors, 1);
        /* exactly-once: the caller recovers from the last checkpoint (said as a training
         * step says it: operators and the checkpoint test look for "recovering") */
        mt_log(MT_LOG_WARN, WHO, "pipelined step: %s%s", mt_strerror(e),
               d->exact ? ": recovering" : "");
        f->n = 0;
        f->busy = 0;
        return -1;
    }
    mt__trainer_inflight_mark(f, kc);
    return n;
}

/* The messages of a step just handed over. @returns 0 or 1 (out of memory). */
int mt__trainer_inflight_set(mt__trainer_inflight_t *f, const mt_kafka_msg_t *msgs, size_t n) {
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

/* Pipelined steps that failed are dropped unmarked: the exactly-once mode recovers from its
 * last checkpoint, the at-least-once mode seeks back to its marks. @returns 0 or the status
 * to stop with (recover()'s). */
static int drop_steps(mt_trainer_run_t *d, mt_coord_t *co, mt_kafka_consumer_t *kc) {
    if (d->exact) return recover(d, co, kc);
    char err[512] = "";
    if (mt_kafka_consumer_reseek(kc, err, sizeof(err))) mt_log(MT_LOG_WARN, WHO, "%s", err);
    return 0;
}

int mt_trainer_run_online(mt_trainer_run_t *d, uint64_t max_examples, double duration_s,
                          int until_caught_up) {
    char bootstrap[8192], berr[512] = "";
    if (mt_config_kafka_bootstrap(d->cfg, bootstrap, sizeof(bootstrap), berr, sizeof(berr))) {
        mt_log(MT_LOG_ERROR, WHO, "%s", berr);
        return 1;
    }
    char session[64];
    snprintf(session, sizeof(session), "session.timeout.ms=%u", d->cfg->kafka.session_timeout_ms);
    const char *conf[] = {session, NULL};
    const char *topics[] = {d->cfg->kafka.examples_topic};
    mt_kafka_consumer_t *kc = NULL;
    char err[512] = "";
    if (mt_kafka_consumer_create(bootstrap, d->cfg->kafka.group, topics, 1, conf, &kc, err,
                                 sizeof(err))) {
        mt_log(MT_LOG_ERROR, WHO, "Kafka consumer on %s: %s", bootstrap, err);
        return 1;
    }
    mt_log(MT_LOG_INFO, WHO, "consuming %s from %s as group %s%s", d->cfg->kafka.examples_topic,
           bootstrap, d->cfg->kafka.group,
           d->cfg->trainer.idempotent ? " (one of many trainers: covered steps)" : "");
    if (d->cfg->trainer.idempotent) {
        int mrc = mt__trainer_run_online_marks(d, kc, max_examples, duration_s, until_caught_up);
        mt_kafka_consumer_destroy(kc);
        return mrc;
    }
    size_t bs = d->cfg->trainer.batch_size;
    mt_kafka_msg_t *msgs = calloc(bs, sizeof(*msgs));
    float *probs = malloc(bs * d->ntasks * sizeof(float));
    mt_batch_t b = {0};
    mt_coord_t *co = NULL;
    int rc = 0;
    if (!msgs || !probs || mt__trainer_batch_init(d, &b)) {
        rc = 1;
        goto out;
    }
    uint64_t since_ckpt = 0; /* messages marked since the last checkpoint */
    double ckpt_period = d->cfg->trainer.checkpoint_interval_s;
    mt__trainer_inflight_t fl = {0};
    if (d->cfg->trainer.pipelined && d->psc) {
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
        cc.token = d->cfg->ps.admin_token;
        cc.recovery_timeout_s = d->cfg->trainer.recovery_timeout_s;
        cc.stop = stop_cb;
        cc.stop_ud = d;
        if (mt_coord_create(d->psc, &cc, &co) != MT_OK) {
            rc = 1;
            goto out;
        }
        if ((rc = recover(d, co, kc)) != 0) goto out;
    }
    mt__trainer_pass_t res = {0};
    double t0 = mt_mono_s();
    mt__trainer_progress_t pr = {t0 + d->cfg->trainer.progress_interval_ms / 1000.0, t0, 0};
    double next_commit = t0 + d->cfg->trainer.commit_interval_ms / 1000.0;
    double next_lag = t0, next_ckpt = t0 + ckpt_period;
    size_t last_n = 1;        /* messages of the last poll (none yet: not caught up) */
    uint64_t uncommitted = 0; /* messages marked since the last commit that succeeded */
    double last_msg = t0;     /* when the last poll with messages returned */
    uint64_t seen_gen = 0;    /* the consumer's generation at last_msg */
    while (!mt__trainer_stopping(d)) {
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
        /* Messages behind (lag) and none for MT__TRAINER_STALL_S: a partition's fetch stopped (a seek
         * lost inside librdkafka, its issue #2256). Nothing is held unmarked here. */
        double tpoll = mt_mono_s();
        uint64_t g = mt_kafka_consumer_generation(kc);
        if (n || g != seen_gen) { /* an assignment starts the clock again */
            last_msg = tpoll;
            seen_gen = g;
        } else if (tpoll - last_msg > MT__TRAINER_STALL_S && atomic_load(&d->ctr.kafka_lag) > 0) {
            atomic_fetch_add(&d->ctr.consumer_stalls, 1);
            mt_log(MT_LOG_WARN, WHO,
                   "no message for %.0f s with %" PRId64 " behind: seeking to the positions again",
                   tpoll - last_msg, (int64_t)atomic_load(&d->ctr.kafka_lag));
            long k = mt__trainer_inflight_confirm(&fl, d,
                                                  kc); /* its messages marked, or to be re-read */
            if (k > 0) since_ckpt += (uint64_t)k, uncommitted += (uint64_t)k;
            if (mt_kafka_consumer_reseek(kc, err, sizeof(err))) mt_log(MT_LOG_WARN, WHO, "%s", err);
            last_msg = tpoll;
            continue;
        }
        /* decode; garbage is marked (skipped for good) */
        for (size_t i = 0; i < n; i++) {
            if (mt__trainer_decode(d, &msgs[i], &b) == MT_NOMEM) {
                rc = 1;
                goto out;
            }
        }
        int handed = 0; /* pipelined: this poll's step went in flight */
        uint64_t marked = 0;
        if (b.n) {
            int previous = 0;
            int t = fl.on ? mt__trainer_train_step(d, &b, probs, &res.loss_sum, &previous)
                          : mt__trainer_train_batch(d, &b, probs, &res.loss_sum);
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
                    mt__trainer_inflight_mark(&fl, kc);
                }
                if (mt__trainer_inflight_set(&fl, msgs, n)) {
                    rc = 1;
                    break;
                }
                handed = 1;
            }
        }
        double now = mt_mono_s();
        int due = (d->exact && now >= next_ckpt) ||
                  (!d->exact && (d->cfg->trainer.commit_interval_ms == 0 || now >= next_commit));
        /* The step in flight must land first before a checkpoint or a commit (they hold only
         * what was applied) and before the messages of a poll of garbage only are marked
         * behind it. */
        if (fl.busy && (due || (!handed && n))) {
            long k = mt__trainer_inflight_confirm(&fl, d, kc);
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
            if (bad == MT_TRAINER_EXIT_FENCED) {
                rc = bad;
                break;
            }
            if (bad && (rc = recover(d, co, kc)) != 0) break;
            since_ckpt = 0;
            next_ckpt = mt_mono_s() + ckpt_period;
        } else if (!d->exact && (uncommitted += n) > 0 &&
                   (d->cfg->trainer.commit_interval_ms == 0 || now >= next_commit)) {
            /* idle polls commit too: the last messages of a burst are committed within an
             * interval, not when the next message comes (the group's lag would stay) */
            next_commit = now + d->cfg->trainer.commit_interval_ms / 1000.0;
            if (!commit(d, kc)) uncommitted = 0;
        }
        mt__trainer_progress(d, kc, res.examples, now, 0, &pr);
    }
    if (fl.on && !rc) { /* the last step in flight: marked if it landed */
        long k = mt__trainer_inflight_confirm(&fl, d, kc);
        if (k > 0) since_ckpt += (uint64_t)k;
        if (k < 0 && d->exact) rc = 1; /* the next run recovers from the last checkpoint */
    }
    if (fl.on) mt_trainer_set_pipelined(d->tr, 0);
    free(fl.msg);
    int last = d->exact && !rc && since_ckpt ? checkpoint(d, co, kc) : 0;
    if (last == MT_TRAINER_EXIT_FENCED) {
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
    mt__trainer_eval_results(d, d->eval, &res);
    if (mt__trainer_write_report(d, "online", &res, 1, NULL, 0)) rc = 1;
out:
    mt_batch_free(&b);
    free(msgs);
    free(probs);
    mt_coord_destroy(co);
    mt_kafka_consumer_destroy(kc);
    return rc;
}
