/*
 * trainer_run.h - the runs of monolith-trainer, over the trainer library (the daemon is a
 * thin main over this: flags, configuration, signals):
 *   - batch: trains on a file ([input] says how) for some epochs, scoring each batch before
 *     training on it (progressive validation), scores an eval file after each epoch, and
 *     reports (stdout, and as JSON to report_path); with trainer.pipelined the next batch's
 *     lookup and this step's apply run on the trainer's pipeline thread beside the step;
 *   - online: one member of the consumer group kafka.group on kafka.examples_topic, in one of
 *     three modes (docs/checkpoint.md): at least once (offsets committed after the PS applied
 *     the updates), exactly once with cluster checkpoints (trainer.checkpoint_interval_s > 0,
 *     mt/coord.h: one coordinator, fenced), or one of many trainers with covered steps
 *     (trainer.idempotent, mt/cover.h); pipelined steps with trainer.pipelined;
 *   - /metrics of the run (mt_trainer_run_render, for mt/http.h).
 * Statuses: the runs return the daemon's exit statuses, MT_TRAINER_EXIT_*, and log why.
 *
 * Ownership: the configuration and the strings of mt_trainer_run_config_t are borrowed for
 * the run's life. Thread safety: one thread creates, runs and destroys a run;
 * mt_trainer_run_render() may be called from another thread meanwhile (it reads atomic
 * counters only). The stop callback is called from the running thread.
 */
#ifndef MT_TRAINER_RUN_H
#define MT_TRAINER_RUN_H

#include <stddef.h>
#include <stdint.h>

#include "mt/config.h"
#include "mt/err.h"

/* Exit statuses of the runs (and of monolith-trainer). FENCED: another exactly-once trainer
 * took the cluster's checkpoints over (docs/checkpoint.md): distinct so that supervisors do
 * not restart it (systemd: RestartPreventExitStatus=3). */
enum {
    MT_TRAINER_EXIT_OK = 0,
    MT_TRAINER_EXIT_FAILED = 1,
    MT_TRAINER_EXIT_CONFIG = 2,
    MT_TRAINER_EXIT_FENCED = 3
};

typedef struct mt_trainer_run mt_trainer_run_t;

typedef struct mt_trainer_run_config {
    const mt_config_t *cfg;  /* validated (mt_config_validate, mt_trainer_run_check) */
    const uint16_t *slots;   /* the feature slots (mt_config_derive_trainer_slots) */
    size_t nslots;           /* 1..256 */
    int online;              /* an online run (with checkpoints: exactly once) */
    const char *report_path; /* optional: the final report as one JSON object */
    /* Polled between steps and while waiting: non-zero ends the run as SIGTERM does (a
     * last checkpoint, a last commit, the report). NULL: never. */
    int (*stop)(void *ud);
    void *stop_ud;
} mt_trainer_run_config_t;

/** Checks what a run needs of the configuration's combinations: trainer.pipelined needs
 *  the PS shards; trainer.idempotent needs them, dense_sync_batches = 1 and no
 *  checkpoints; an online run with checkpoints needs every parameter on the PS.
 *  @returns MT_OK or MT_CONFIG (@p errbuf says why). */
mt_err_t mt_trainer_run_check(const mt_config_t *cfg, int online, char *errbuf, size_t errlen);

/** Creates the trainer: a local table, or a client of the PS shards (cluster.ps) with the
 *  dense parameters on shard 0 (trainer.dense_sync_batches > 0; retried for 30 s while
 *  the PS starts). @param[out] out  caller frees with mt_trainer_run_destroy() (also
 *  after a failure, when *out is set). @returns an exit status (logged). */
int mt_trainer_run_create(const mt_trainer_run_config_t *rc, mt_trainer_run_t **out);
void mt_trainer_run_destroy(mt_trainer_run_t *r);

/** 1 if the parameters are on the PS shards, 0 if in a local table. */
int mt_trainer_run_on_ps(const mt_trainer_run_t *r);

/** Batch training: @p train for @p epochs, @p eval (optional) after each. @returns an exit
 *  status: 0, 1 (unreadable input, PS failures after retries), 2 (the input's columns do
 *  not fit the model). */
int mt_trainer_run_batch(mt_trainer_run_t *r, const char *train, const char *eval, uint32_t epochs);

/** Online training until stop, @p max_examples (0: no limit), @p duration_s (0: none), or
 *  with @p until_caught_up once every assigned partition is consumed to its high watermark
 *  and a poll finds nothing more. @returns an exit status (FENCED: another trainer took
 *  over). */
int mt_trainer_run_online(mt_trainer_run_t *r, uint64_t max_examples, double duration_s,
                          int until_caught_up);

/** The /metrics page of the run (Prometheus text), as mt/http.h's handler: @p ud is the
 *  run. @returns 200 (*body malloc'd, caller frees), 404 or 500. */
int mt_trainer_run_render(void *ud, const char *path, char **body, size_t *len);

#endif /* MT_TRAINER_RUN_H */
