/*
 * online_marks.c - one of many trainers (trainer.idempotent; docs/checkpoint.md, "Many
 * trainers: idempotent applies"; mt/cover.h): the partitions Kafka assigns, each from the
 * lowest mark of the shards, in covered steps that every shard applies exactly once.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mt/clock.h"
#include "mt/cover.h"
#include "mt/log.h"
#include "run_int.h"

/* ---- many trainers: covered steps (trainer.idempotent; docs/checkpoint.md, mt/cover.h) ---- */

/* The lists of marks a trainer starts from, out of every shard's Stats (@p sm): each
 * shard's sparse marks, and shard 0's dense ones when the dense parameters are on the PS.
 * @p lists has room for num_shards + 1. @returns how many. */
static size_t marks_lists(mt_trainer_run_t *d, const mt_psc_shard_ckpt_t *sm,
                          mt_cover_marks_t *lists) {
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
static int marks_reset(mt_trainer_run_t *d, mt_kafka_consumer_t *kc, mt_cover_t *cv,
                       uint64_t *gen) {
    uint32_t ns = mt_psc_num_shards(d->psc);
    atomic_fetch_add(&d->ctr.resets, 1);
    for (unsigned attempt = 0; !mt__trainer_stopping(d); attempt++) {
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
static int commit_durable(mt_trainer_run_t *d, mt_kafka_consumer_t *kc) {
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

#define IDLE_CHECK_S 2.0 /* an idle trainer looks at the shards' marks this often */

/* 1 if a shard is behind this trainer on one of its partitions (it restarted from an older
 * snapshot and no step told it yet: the trainer is idle), 0 if not or unknown. */
static int shards_behind(mt_trainer_run_t *d, const mt_cover_t *cv) {
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

/* A pipelined covered step (@p b holds examples): hands its apply, with its cover, to the
 * trainer's apply thread; the step in flight before it is confirmed by it (its messages
 * marked), and this one's messages @p held wait in @p fl. Any error drops both steps (the
 * library has nothing in flight after one; an error of the dense push, after this step's
 * apply went in flight, waits for it): the caller resets to the shards' marks, which re-feeds
 * what either step did not apply everywhere, each shard skipping what it did. No retry here:
 * the error may be the previous step's. @returns 0, 2 (reset) or 1 (stop). */
static int covered_step_pipelined(mt_trainer_run_t *d, mt_cover_t *cv, mt_batch_t *b, float *probs,
                                  double *loss_sum, mt__trainer_inflight_t *fl,
                                  mt_kafka_consumer_t *kc, const mt_kafka_msg_t *held,
                                  size_t nheld) {
    const mt_psc_range_t *r;
    size_t nr = mt_cover_ranges(cv, &r);
    char err[512] = "";
    mt_trainer_step_t st = {0};
    mt_trainer_set_cover(d->tr, r, nr);
    mt_err_t e = mt_trainer_train(d->tr, b, (uint32_t)time(NULL), probs, &st);
    int in_flight = e == MT_OK; /* this step's apply */
    if (!e) e = mt__trainer_dense_step(d, r, nr, err, sizeof(err));
    if (!e) {
        mt__trainer_count_step(d, b, probs, &st, loss_sum);
        if (st.previous && st.skipped_shards == mt_psc_num_shards(d->psc))
            atomic_fetch_add(&d->ctr.steps_skipped, 1);
        if (fl->busy) mt__trainer_inflight_mark(fl, kc); /* confirmed by this step */
        if (mt__trainer_inflight_set(fl, held, nheld)) return 1;
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
    return mt__trainer_stopping(d) ? 1 : 2;
}

/* Trains the step the cover holds (@p b its examples, possibly none: a range up to a cut
 * with no message in it), retrying while a shard does not answer (a retry is skipped where
 * it was applied); marks its messages @p held once applied. With pipelined steps (@p fl on)
 * a step with examples goes in flight (covered_step_pipelined); one without waits for the
 * step in flight first (its range follows that step's). @returns 0 (applied or skipped by
 * every shard, or in flight), 2 (a shard refused it, or a pipelined step failed: the caller
 * resets), or 1 (stop). */
static int covered_step(mt_trainer_run_t *d, mt_cover_t *cv, mt_batch_t *b, float *probs,
                        double *loss_sum, mt__trainer_inflight_t *fl, mt_kafka_consumer_t *kc,
                        const mt_kafka_msg_t *held, size_t nheld) {
    const mt_psc_range_t *r;
    size_t nr = mt_cover_ranges(cv, &r);
    if (!nr) return 0;
    if (fl->on && b->n)
        return covered_step_pipelined(d, cv, b, probs, loss_sum, fl, kc, held, nheld);
    if (mt__trainer_inflight_confirm(fl, d, kc) < 0) {
        mt_cover_abort(cv);
        return mt__trainer_stopping(d) ? 1 : 2;
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
                e = mt__trainer_dense_step(d, r, nr, err, sizeof(err));
            } else {
                mt_rpc_status_t rs = {0};
                e = mt_psc_push_dense_cover(d->psc, NULL, NULL, 0, 0, r, nr, NULL, NULL, &rs);
                if (e) snprintf(err, sizeof(err), "%s", rs.message);
            }
        }
        if (!e) {
            if (b->n) mt__trainer_count_step(d, b, probs, &st, loss_sum);
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
        if (e == MT_MISMATCH || e == MT_INVALID || e == MT_NOMEM || mt__trainer_stopping(d)) {
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
int mt__trainer_run_online_marks(mt_trainer_run_t *d, mt_kafka_consumer_t *kc,
                                 uint64_t max_examples, double duration_s, int until_caught_up) {
    size_t bs = d->cfg->trainer.batch_size;
    mt_kafka_msg_t *msgs = calloc(bs, sizeof(*msgs));
    mt_kafka_msg_t *held = calloc(bs, sizeof(*held)); /* the step's messages, to mark */
    float *probs = malloc(bs * d->ntasks * sizeof(float));
    mt_batch_t b = {0};
    mt_cover_t *cv = NULL;
    int rc = 0;
    uint64_t gen = 0;
    if (!msgs || !held || !probs || mt__trainer_batch_init(d, &b) || mt_cover_create(&cv)) {
        rc = 1;
        goto out;
    }
    mt__trainer_pass_t res = {0};
    double t0 = mt_mono_s();
    mt__trainer_progress_t pr = {t0 + d->cfg->trainer.progress_interval_ms / 1000.0, t0, 0};
    double next_commit = t0 + d->cfg->trainer.commit_interval_ms / 1000.0, next_lag = t0;
    size_t last_n = 1, nheld = 0;
    int need_reset = 1;
    double last_msg = t0, next_idle_check = t0 + IDLE_CHECK_S;
    mt__trainer_inflight_t fl = {0};
    if (d->cfg->trainer.pipelined) {
        if (mt_trainer_set_pipelined(d->tr, 1) == MT_OK) {
            fl.on = 1;
            mt_log(MT_LOG_INFO, WHO,
                   "pipelined covered steps: one apply in flight while the next step computes");
        } else
            mt_log(MT_LOG_WARN, WHO, "pipelined steps: no apply thread: steps one after another");
    }
    while (!mt__trainer_stopping(d)) {
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
            (void)mt__trainer_inflight_confirm(&fl, d, kc);
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
         * MT__TRAINER_STALL_S: seek again. */
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
        } else if (tnow - last_msg > MT__TRAINER_STALL_S && atomic_load(&d->ctr.kafka_lag) > 0) {
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
            /* a bad message is in the step's range all the same: consumed, no example */
            if (mt__trainer_decode(d, &msgs[i], &b) == MT_NOMEM) {
                rc = 1;
                break;
            }
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
            unsigned ms = d->cfg->trainer.commit_interval_ms > 1000
                              ? d->cfg->trainer.commit_interval_ms
                              : 1000;
            next_commit = now + ms / 1000.0;
            commit_durable(d, kc);
        }
        mt__trainer_progress(d, kc, res.examples, now, 1, &pr);
    }
    if (fl.on) { /* the last step in flight: a failure leaves it to the marks (a next run) */
        if (mt__trainer_inflight_confirm(&fl, d, kc) < 0 && !rc) {
            mt_log(MT_LOG_ERROR, WHO,
                   "the last pipelined step failed: the shards' marks hold "
                   "what a next run re-feeds");
            rc = 1;
        }
        mt_trainer_set_pipelined(d->tr, 0);
    }
    free(fl.msg);
    res.seconds = mt_mono_s() - t0;
    mt__trainer_eval_results(d, d->eval, &res);
    if (mt__trainer_write_report(d, "online", &res, 1, NULL, 0)) rc = 1;
out:
    mt_cover_destroy(cv);
    mt_batch_free(&b);
    free(msgs);
    free(held);
    free(probs);
    return rc;
}
