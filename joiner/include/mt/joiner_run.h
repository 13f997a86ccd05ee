/*
 * joiner_run.h - the run of monolith-joiner, over the join core (mt/joiner.h): Kafka in and
 * out, the exactly-once commit round, /metrics and the final report. The daemon is a thin
 * main over this (flags, configuration, signals, the metrics server). docs/joiner.md.
 *
 * One consumer-group member (joiner.group) on kafka.features_topic and kafka.actions_topic;
 * the examples go to kafka.examples_topic. The commit round, every
 * joiner.commit_interval_ms (and when the outbox grows large, and at the end):
 *   1. every polled message is already applied to the state, each in one atomic RocksDB
 *      write with the examples it produced (the outbox) and its partition's next offset;
 *   2. the state is synced (WAL fsync, joiner.sync);
 *   3. the outbox is produced to the examples topic and the producer flushed: delivered;
 *   4. the delivered examples are removed from the outbox (synced);
 *   5. the offsets of the messages applied before step 2 are marked and committed.
 * A run first delivers the outbox a previous run left (a crash, Kafka down at its end) and
 * skips re-consumed messages below the positions stored with the state: nothing is lost and
 * nothing is applied twice; only examples delivered in the instant between the end of step 3
 * and step 4 are delivered a second time (the report's outbox_recovered counts them).
 * A delivery that fails keeps the whole outbox and commits no offset: the next round (or
 * run) tries again. Garbage messages are counted, logged with topic/partition/offset (the
 * first 100) and skipped.
 *
 * Statuses: the functions that run return the daemon's exit statuses (MT_JOINER_EXIT_*) and
 * log why.
 *
 * Ownership: the configuration and the strings of mt_joiner_run_config_t are borrowed for
 * the run's life. Thread safety: one thread creates, runs and destroys a run;
 * mt_joiner_run_render() may be called from another thread meanwhile (it reads a copy of
 * the counters under the run's lock, docs/locking.md). The stop callback is called from the
 * running thread.
 */
#ifndef MT_JOINER_RUN_H
#define MT_JOINER_RUN_H

#include <stddef.h>

#include "mt/config.h"
#include "mt/err.h"
#include "mt/joiner.h"

/* Exit statuses of a run (and of monolith-joiner). */
enum { MT_JOINER_EXIT_OK = 0, MT_JOINER_EXIT_FAILED = 1, MT_JOINER_EXIT_CONFIG = 2 };

typedef struct mt_joiner_run mt_joiner_run_t;

typedef struct mt_joiner_run_config {
    const mt_config_t *cfg;  /* checked by mt_joiner_run_check() */
    const char *report_path; /* optional: the final report as one JSON object */
    double duration_s;       /* > 0: end the run after this long; 0: no limit */
    int drain;               /* at the end, close every window (end of a replayed stream) */
    /* End the run once this member has read every assigned input partition to its end
     * (an empty poll, then consumer lag 0; checked every 200 ms): a backfill of a stream
     * that has ended. While the lag is unknown (nothing assigned, Kafka down) it goes on:
     * duration_s bounds it. */
    int until_caught_up;
    /* Polled once per poll of Kafka (at most every 100 ms): non-zero ends the run as
     * SIGTERM does (a last commit round, the report). NULL: never. */
    int (*stop)(void *ud);
    void *stop_ud;
} mt_joiner_run_config_t;

/** The core's configuration from [joiner] (@p jc, may be NULL: check only): the windows,
 *  the task list (joiner.task_actions), the RocksDB sizes; and distinct input topics.
 *  @returns MT_OK or MT_CONFIG (@p errbuf says why, naming the key). */
mt_err_t mt_joiner_run_check(const mt_config_t *cfg, mt_joiner_config_t *jc, char *errbuf,
                             size_t errlen);

/** Writes the task list of @p jc ("click, conversion") to @p buf (truncated to fit). */
void mt_joiner_run_tasks(const mt_joiner_config_t *jc, char *buf, size_t len);

/** Opens the state (joiner.state_dir) and logs what it holds. No Kafka yet.
 *  @param[out] out  caller frees with mt_joiner_run_destroy() (also after a failure, when
 *  *out is set). @returns an exit status: 0, 1 (the state cannot be opened), 2 (the
 *  configuration does not pass mt_joiner_run_check()). */
int mt_joiner_run_create(const mt_joiner_run_config_t *rc, mt_joiner_run_t **out);

/** Runs until stop, duration_s, caught up (until_caught_up), or a failure; then (drain)
 *  closes every window, makes a last commit round and writes the report (stdout, and
 *  report_path). @returns 0; 1 when Kafka is unusable, the state cannot be read or
 *  written, or examples are left undelivered at the end (kept in the state for the next
 *  run). Once per run. */
int mt_joiner_run(mt_joiner_run_t *r);

/** The /metrics page of the run (Prometheus text), as mt/http.h's handler: @p ud is the
 *  run. @returns 200 (*body malloc'd, caller frees), 404 or 500. */
int mt_joiner_run_render(void *ud, const char *path, char **body, size_t *len);

/** Closes the state. NULL is a no-op. */
void mt_joiner_run_destroy(mt_joiner_run_t *r);

#endif /* MT_JOINER_RUN_H */
