/*
 * run_int.h - what the files of the trainer's runs share (trainer/src/run.c: creation,
 * /metrics, the step with its retries, batch mode; online.c: the online loop, at least once
 * and exactly once with checkpoints; online_marks.c: one of many trainers, covered steps).
 */
#ifndef MT_TRAINER_RUN_INT_H
#define MT_TRAINER_RUN_INT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "mt/config.h"
#include "mt/eval.h"
#include "mt/kafka.h"
#include "mt/psclient.h"
#include "mt/trainer.h"
#include "mt/trainer_run.h"

#define WHO                     "trainer"
#define MT__TRAINER_BAD_LOG_MAX 100 /* bad lines / messages logged one by one; then only counted */

/* Counters shown by /metrics (written by the training thread, read by the HTTP thread). */
typedef struct mt__trainer_counters {
    _Atomic uint64_t examples, batches, bad_lines, bad_messages, ignored_slots, ps_errors, commits,
        commit_failures, dense_syncs;
    _Atomic uint64_t overlapped; /* steps that confirmed a previous step's apply in flight */
    /* exactly-once mode (trainer.checkpoint_interval_s) */
    _Atomic uint64_t checkpoints, checkpoint_failures, recoveries, last_checkpoint;
    /* many trainers (trainer.idempotent) */
    _Atomic uint64_t steps_skipped, out_of_order, resets, retention_errors, consumer_gaps,
        consumer_stalls;

    _Atomic uint64_t window_auc_bits, window_loss_bits; /* doubles */
    _Atomic uint64_t task_auc_bits[MT_BATCH_MAX_TASKS]; /* doubles: each task's window AUC */
    _Atomic int64_t kafka_lag;                          /* online: -1 unknown */
    /* nanoseconds of the steps that went through in each phase (mt_trainer_phase_t); the
     * dense one also of every dense sync round with the PS */
    _Atomic uint64_t phase_ns[MT_TRAINER_NPHASES];
} mt__trainer_counters_t;

struct mt_trainer_run {
    const mt_config_t *cfg; /* borrowed */
    uint16_t slots[256];
    size_t nslots;
    mt_trainer_t *tr;
    mt_psc_t *psc;
    mt_trainer_dense_sync_t *dense;
    mt_eval_t *eval[MT_BATCH_MAX_TASKS]; /* progressive validation, one per task (the click's
                                            first: window_auc) */
    uint32_t ntasks;                     /* the model's: labels and scores per example */
    mt__trainer_counters_t ctr;
    int (*stop)(void *ud);
    void *stop_ud;
    double started;
    const char *report_path;
    uint64_t bad_logged;
    int exact; /* online with checkpoints: a PS failure means recover, never retry a step */
};

/* a consumer with messages behind and none delivered that long: seek again */
#define MT__TRAINER_STALL_S 5.0

/* 1 once the run should stop (its stop callback). */
int mt__trainer_stopping(mt_trainer_run_t *d);

void mt__trainer_store_double(_Atomic uint64_t *a, double v);

/* One training step, retried in the at-least-once mode (run.c). @returns 0, 1 (stop) or 2
 * (recover). */
int mt__trainer_train_batch(mt_trainer_run_t *d, const mt_batch_t *b, float *probs,
                            double *loss_sum);

/* One step. With @p previous (pipelined steps): no retry, since an error may be the previous
 * step's: 3 (drop both, seek back to the marks) in the at-least-once mode; *previous = 1 when
 * the step confirmed the previous one. @returns 0, 1 (stop), 2 (recover) or 3. */
int mt__trainer_train_step(mt_trainer_run_t *d, const mt_batch_t *b, float *probs, double *loss_sum,
                           int *previous);

/* The dense half of a step (with the dense parameters on the PS: push and pull on their
 * clock, with @p cover when given). @returns MT_OK (also without them) or the push's error. */
mt_err_t mt__trainer_dense_step(mt_trainer_run_t *d, const mt_psc_range_t *cover, size_t ncover,
                                char *errbuf, size_t errlen);

/* A step that went through: its scores to the evaluator, its loss, its phases' times and the
 * counters. */
void mt__trainer_count_step(mt_trainer_run_t *d, const mt_batch_t *b, const float *probs,
                            const mt_trainer_step_t *st, double *loss_sum);

/* Adds the Example in Kafka message @p m to @p b; garbage is counted, logged (the first
 * MT__TRAINER_BAD_LOG_MAX) and skipped, slots the model lacks are counted. @returns MT_OK
 * (also for garbage) or MT_NOMEM. */
mt_err_t mt__trainer_decode(mt_trainer_run_t *d, const mt_kafka_msg_t *m, mt_batch_t *b);

/* The online progress line (every trainer.progress_interval_ms; the window's AUC and log
 * loss also go to /metrics then). */
typedef struct mt__trainer_progress {
    double next, last_t;
    uint64_t last_examples;
} mt__trainer_progress_t;
void mt__trainer_progress(mt_trainer_run_t *d, mt_kafka_consumer_t *kc, uint64_t examples,
                          double now, int skipped, mt__trainer_progress_t *pr);

/* What a pass (or an online run) did, for the report. */
typedef struct mt__trainer_pass {
    uint64_t examples;
    double seconds, loss_sum;
    mt_eval_result_t task_ev[MT_BATCH_MAX_TASKS]; /* each task's: [0] the click's */
} mt__trainer_pass_t;

/* A multi-task model's window AUCs (task 0's is @p auc0) to /metrics, and the others', " / "
 * separated, into @p line when given (the progress line). */
void mt__trainer_store_tasks(mt_trainer_run_t *d, mt_eval_t *const *ev, double auc0, char *line,
                             size_t len);

/* The results of evaluators @p ev [d->ntasks] into @p res. */
void mt__trainer_eval_results(const mt_trainer_run_t *d, mt_eval_t *const *ev,
                              mt__trainer_pass_t *res);

/* A batch of the model's slots and tasks. @returns MT_OK, MT_NOMEM. */
mt_err_t mt__trainer_batch_init(const mt_trainer_run_t *d, mt_batch_t *b);

/* The report on stdout, and as JSON to report_path. @returns 0 or 1 (the JSON could not
 * be written). */
int mt__trainer_write_report(mt_trainer_run_t *d, const char *mode, const mt__trainer_pass_t *tr,
                             uint32_t epochs, const mt__trainer_pass_t *ev, int has_eval);

/* Pipelined steps in the online loop (trainer.pipelined): the messages whose step's apply is
 * in flight, marked once a later step or a wait confirms it (mt_trainer_wait). */
typedef struct inflight {
    int on;              /* the trainer's steps are pipelined */
    int busy;            /* a step is in flight */
    mt_kafka_msg_t *msg; /* its messages (topic, partition and offset only: marks need no more) */
    size_t n, cap;
} mt__trainer_inflight_t;

/* Marks the messages of the step in flight, now applied. */
void mt__trainer_inflight_mark(mt__trainer_inflight_t *f, mt_kafka_consumer_t *kc);

/* The step in flight (if any) answered: marked on success. @returns the number of messages
 * marked, or -1 on error (nothing in flight afterwards, nothing marked). */
long mt__trainer_inflight_confirm(mt__trainer_inflight_t *f, mt_trainer_run_t *d,
                                  mt_kafka_consumer_t *kc);

/* The messages of a step just handed over. @returns 0 or 1 (out of memory). */
int mt__trainer_inflight_set(mt__trainer_inflight_t *f, const mt_kafka_msg_t *msgs, size_t n);

/* The online loop of one of many trainers (online_marks.c). @returns an exit status. */
int mt__trainer_run_online_marks(mt_trainer_run_t *d, mt_kafka_consumer_t *kc,
                                 uint64_t max_examples, double duration_s, int until_caught_up);

#endif /* MT_TRAINER_RUN_INT_H */
