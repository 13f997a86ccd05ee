/*
 * run.c - the run of monolith-joiner (mt/joiner_run.h): Kafka in and out around the join
 * core, the commit round, /metrics and the report. docs/joiner.md.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mt/clock.h"
#include "mt/joiner_run.h"
#include "mt/kafka.h"
#include "mt/log.h"
#include "mt/metrics.h"

#define WHO         "joiner"
#define BAD_LOG_MAX 100    /* bad messages logged one by one; then only counted */
#define POLL_BATCH  1024   /* messages per poll */
#define OUTBOX_HIGH 20000  /* outbox size that starts a commit round early */
#define OUTBOX_STOP 200000 /* outbox size at which polling pauses (Kafka down) */
#define MAX_PARTS   4096   /* partitions tracked for marks */

/* The last applied message of each partition since the previous commit round. */
typedef struct mark {
    char topic[256];
    int32_t partition;
    int64_t offset;
} mark_t;

struct mt_joiner_run {
    const mt_config_t *cfg;
    mt_joiner_t *j;
    const char *report_path;
    double duration_s;
    int drain;
    int until_caught_up;
    int (*stop)(void *ud);
    void *stop_ud;
    int stopped; /* the stop callback said so */
    int ran;
    double started;
    uint64_t bad_logged;
    const char *task_names[MT_JOINER_MAX_TASKS]; /* joiner.task_actions, in task order */
    uint32_t ntasks;
    char tasks[64]; /* "click, conversion" */
    mark_t *marks;  /* the running thread's only */
    size_t nmarks;
    /* the running thread writes these under lock; mt_joiner_run_render() reads them */
    pthread_mutex_t lock;
    mt_joiner_stats_t snap;
    uint64_t delivered, delivery_failures, commits, commit_failures, messages;
    double wall_now_s; /* Unix time of the snapshot */
    int64_t kafka_lag; /* messages behind the inputs' high watermarks, -1 unknown */
};

static int stop_requested(mt_joiner_run_t *d) {
    if (!d->stopped && d->stop && d->stop(d->stop_ud)) d->stopped = 1;
    return d->stopped;
}

static void snapshot(mt_joiner_run_t *d) {
    pthread_mutex_lock(&d->lock);
    mt_joiner_stats(d->j, &d->snap);
    d->wall_now_s = mt_wall_s();
    pthread_mutex_unlock(&d->lock);
}

/* ---------------- metrics ---------------- */

int mt_joiner_run_render(void *ud, const char *path, char **body, size_t *len) {
    mt_joiner_run_t *d = ud;
    if (strcmp(path, "/metrics") != 0) return 404;
    mt_metrics_page_t pg;
    if (mt_metrics_page_open(&pg, "monolith_joiner_") != MT_OK) return 500;
    FILE *f = mt_metrics_page_file(&pg);
    pthread_mutex_lock(&d->lock);
    mt_joiner_stats_t s = d->snap;
    uint64_t delivered = d->delivered, dfail = d->delivery_failures, commits = d->commits,
             cfail = d->commit_failures, messages = d->messages;
    double wall = d->wall_now_s;
    int64_t kafka_lag = d->kafka_lag;
    pthread_mutex_unlock(&d->lock);
#define C(name, help, v) mt_metrics_counter(&pg, name, help, (uint64_t)(v))
#define G(name, help, v) mt_metrics_gauge(&pg, name, help, (double)(v))
    C("messages_total", "Messages consumed from both topics.", messages);
    C("impressions_total", "Impressions applied.", s.impressions);
    C("actions_total", "Actions applied.", s.actions);
    C("positives_total", "Positive examples emitted.", s.positives);
    C("negatives_total", "Negative examples emitted (after sampling).", s.negatives);
    C("sampled_out_total", "Negatives dropped by negative sampling.", s.sampled_out);
    C("late_actions_total", "Actions after their window (no label).", s.late_actions);
    C("late_impressions_total", "Impressions whose window had closed on arrival.",
      s.late_impressions);
    C("duplicates_total", "Impressions and actions seen before.",
      s.duplicate_impressions + s.duplicate_actions);
    C("early_actions_total", "Actions stored before their impression.", s.early_actions);
    C("early_expired_total", "Early actions whose impression never came.", s.early_expired);
    C("early_dropped_total", "Early actions dropped at joiner.max_early_actions.", s.early_dropped);
    C("ambiguous_actions_total", "item_id 0 actions of a request with several impressions.",
      s.ambiguous_actions);
    C("no_task_actions_total", "Actions of a type in no task of joiner.task_actions (ignored).",
      s.no_task_actions);
    C("closed_early_total",
      "Examples emitted before their window closed: every task's action had come.", s.closed_early);
    fprintf(f, "# HELP monolith_joiner_task_positives_total Examples emitted with the task's "
               "label 1 (joiner.task_actions).\n"
               "# TYPE monolith_joiner_task_positives_total counter\n");
    for (uint32_t t = 0; t < d->ntasks; t++)
        fprintf(f, "monolith_joiner_task_positives_total{task=\"%s\"} %" PRIu64 "\n",
                d->task_names[t], s.task_positives[t]);
    C("bad_messages_total", "Messages skipped as not valid protobufs.", s.bad_messages);
    C("dropped_messages_total",
      "Messages that produced nothing: bad, late, duplicate, ambiguous or of no task.",
      s.bad_messages + s.late_actions + s.duplicate_impressions + s.duplicate_actions +
          s.ambiguous_actions + s.no_task_actions);
    C("replayed_total", "Re-consumed messages skipped (already applied).", s.replayed);
    C("delivered_total", "Examples delivered to the examples topic.", delivered);
    C("delivery_failures_total", "Commit rounds whose delivery failed (retried).", dfail);
    C("commits_total", "Offset commits.", commits);
    C("commit_failures_total", "Offset commits that failed.", cfail);
    C("memory_misses_total", "Pending impressions read from RocksDB (not in memory).",
      s.memory_misses);
    G("join_rate", "Positives / (positives + closed negatives incl. sampled out).",
      s.positives + s.negatives + s.sampled_out
          ? (double)s.positives / (double)(s.positives + s.negatives + s.sampled_out)
          : 0.0);
    G("pending", "Pending impressions (all, in RocksDB).", s.pending);
    G("pending_memory", "Pending impressions also held in memory.", s.pending_memory);
    G("early_pending", "Early actions waiting.", s.early_pending);
    G("outbox", "Examples made but not yet delivered.", s.outbox);
    G("watermark_ms", "The joiner's watermark (event time, Unix ms).",
      s.watermark_ms == INT64_MIN ? 0 : s.watermark_ms);
    G("event_lag_seconds", "Wall clock minus the largest event time seen.",
      s.max_event_ms == INT64_MIN ? 0 : wall - (double)s.max_event_ms / 1000.0);
    G("consumer_lag_messages",
      "Messages behind the high watermarks of the assigned input partitions (-1: unknown).",
      kafka_lag);
    G("uptime_seconds", "Seconds since start.", mt_mono_s() - d->started);
#undef C
#undef G
    return mt_metrics_page_close(&pg, (double)time(NULL) - (mt_mono_s() - d->started), body, len);
}

/* ---------------- Kafka ---------------- */

static void remember(mt_joiner_run_t *d, const mt_kafka_msg_t *m) {
    for (size_t i = 0; i < d->nmarks; i++) {
        mark_t *k = &d->marks[i];
        if (k->partition == m->partition && !strcmp(k->topic, m->topic)) {
            if (m->offset > k->offset) k->offset = m->offset;
            return;
        }
    }
    if (d->nmarks == MAX_PARTS) return; /* not marked now: committed by a later round */
    mark_t *k = &d->marks[d->nmarks++];
    snprintf(k->topic, sizeof(k->topic), "%s", m->topic);
    k->partition = m->partition;
    k->offset = m->offset;
}

/* Steps 2-5 of the commit round. @returns 0, or 1 on a failure of the state (fatal). */
static int commit_round(mt_joiner_run_t *d, mt_kafka_producer_t *p, mt_kafka_consumer_t *kc) {
    mt_err_t e = mt_joiner_sync(d->j);
    if (e) {
        mt_log(MT_LOG_ERROR, WHO, "syncing the state: %s", mt_strerror(e));
        return 1;
    }
    size_t n = mt_joiner_outbox_size(d->j);
    if (n) {
        size_t queued = 0;
        for (; queued < n; queued++) {
            const mt_joiner_example_t *x = mt_joiner_outbox_get(d->j, queued);
            e = mt_kafka_produce(p, d->cfg->kafka.examples_topic, -1, x->request_id,
                                 x->request_id_len, x->value, x->len, 1000);
            if (e) break;
        }
        mt_err_t fe = mt_kafka_producer_flush(p, 10000);
        if (e || fe) {
            pthread_mutex_lock(&d->lock);
            d->delivery_failures++;
            pthread_mutex_unlock(&d->lock);
            mt_log(MT_LOG_WARN, WHO,
                   "delivering %zu examples: %s (kept in the outbox, offsets not committed)", n,
                   mt_strerror(e ? e : fe));
            return 0; /* all of them again next round: the outbox stays whole */
        }
        if ((e = mt_joiner_outbox_done(d->j, n))) {
            mt_log(MT_LOG_ERROR, WHO, "removing delivered examples: %s", mt_strerror(e));
            return 1;
        }
        pthread_mutex_lock(&d->lock);
        d->delivered += n;
        pthread_mutex_unlock(&d->lock);
    }
    if (kc && d->nmarks) {
        for (size_t i = 0; i < d->nmarks; i++) {
            mt_kafka_msg_t m = {.topic = d->marks[i].topic,
                                .partition = d->marks[i].partition,
                                .offset = d->marks[i].offset};
            mt_kafka_consumer_mark(kc, &m);
        }
        d->nmarks = 0;
        e = mt_kafka_consumer_commit(kc);
        pthread_mutex_lock(&d->lock);
        if (e)
            d->commit_failures++;
        else
            d->commits++;
        pthread_mutex_unlock(&d->lock);
        if (e)
            mt_log(MT_LOG_WARN, WHO, "offset commit: %s (positions kept for the next one)",
                   mt_strerror(e));
    }
    return 0;
}

static void json_u64(FILE *f, const char *k, uint64_t v, int last) {
    fprintf(f, "\"%s\": %" PRIu64 "%s", k, v, last ? "" : ", ");
}

static int write_report(mt_joiner_run_t *d, double seconds) {
    mt_joiner_stats_t s;
    mt_joiner_stats(d->j, &s);
    printf("== monolith-joiner report ==\n");
    printf("impressions        %" PRIu64 "\n", s.impressions);
    printf("actions            %" PRIu64 "\n", s.actions);
    printf("positives          %" PRIu64 "\n", s.positives);
    printf("negatives          %" PRIu64 "   (sampled out %" PRIu64 ")\n", s.negatives,
           s.sampled_out);
    printf("late actions       %" PRIu64 "   late impressions %" PRIu64 "\n", s.late_actions,
           s.late_impressions);
    printf("duplicates         %" PRIu64 "\n", s.duplicate_impressions + s.duplicate_actions);
    printf("early actions      %" PRIu64 "   (joined %" PRIu64 ", expired %" PRIu64
           ", dropped %" PRIu64 ")\n",
           s.early_actions, s.early_joined, s.early_expired, s.early_dropped);
    printf("ambiguous actions  %" PRIu64 "\n", s.ambiguous_actions);
    printf("tasks             ");
    for (uint32_t t = 0; t < d->ntasks; t++)
        printf(" %s %" PRIu64, d->task_names[t], s.task_positives[t]);
    printf("   (closed early %" PRIu64 ", no-task actions %" PRIu64 ")\n", s.closed_early,
           s.no_task_actions);
    printf("bad messages       %" PRIu64 "\n", s.bad_messages);
    printf("replayed (skipped) %" PRIu64 "   outbox recovered %" PRIu64 "\n", s.replayed,
           s.outbox_recovered);
    printf("pending            %" PRIu64 "   early waiting %" PRIu64 "\n", s.pending,
           s.early_pending);
    printf("delivered          %" PRIu64 "   in %.1f s\n", d->delivered, seconds);
    fflush(stdout);
    if (!d->report_path) return 0;
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", d->report_path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        mt_log(MT_LOG_ERROR, WHO, "%s: %s", tmp, strerror(errno));
        return 1;
    }
    fputc('{', f);
    json_u64(f, "impressions", s.impressions, 0);
    json_u64(f, "actions", s.actions, 0);
    json_u64(f, "positives", s.positives, 0);
    json_u64(f, "negatives", s.negatives, 0);
    json_u64(f, "sampled_out", s.sampled_out, 0);
    json_u64(f, "late_actions", s.late_actions, 0);
    json_u64(f, "late_impressions", s.late_impressions, 0);
    json_u64(f, "duplicates", s.duplicate_impressions + s.duplicate_actions, 0);
    json_u64(f, "duplicate_impressions", s.duplicate_impressions, 0);
    json_u64(f, "duplicate_actions", s.duplicate_actions, 0);
    json_u64(f, "early_actions", s.early_actions, 0);
    json_u64(f, "early_joined", s.early_joined, 0);
    json_u64(f, "early_expired", s.early_expired, 0);
    json_u64(f, "early_dropped", s.early_dropped, 0);
    json_u64(f, "ambiguous_actions", s.ambiguous_actions, 0);
    json_u64(f, "no_task_actions", s.no_task_actions, 0);
    json_u64(f, "closed_early", s.closed_early, 0);
    fputs("\"task_positives\": {", f);
    for (uint32_t t = 0; t < d->ntasks; t++)
        json_u64(f, d->task_names[t], s.task_positives[t], t + 1 == d->ntasks);
    fputs("}, ", f);
    json_u64(f, "bad_messages", s.bad_messages, 0);
    json_u64(f, "replayed", s.replayed, 0);
    json_u64(f, "outbox_recovered", s.outbox_recovered, 0);
    json_u64(f, "pending", s.pending, 0);
    json_u64(f, "early_pending", s.early_pending, 0);
    json_u64(f, "delivered", d->delivered, 0);
    json_u64(f, "commits", d->commits, 0);
    fprintf(f, "\"seconds\": %.3f}\n", seconds);
    if (fclose(f) != 0 || rename(tmp, d->report_path) != 0) {
        mt_log(MT_LOG_ERROR, WHO, "%s: %s", d->report_path, strerror(errno));
        return 1;
    }
    return 0;
}

int mt_joiner_run(mt_joiner_run_t *d) {
    assert(!d->ran); /* once per run: the marks and counters are its own */
    d->ran = 1;
    const double duration_s = d->duration_s;
    char bootstrap[8192], err[512] = "", session[64];
    if (mt_config_kafka_bootstrap(d->cfg, bootstrap, sizeof(bootstrap), err, sizeof(err))) {
        mt_log(MT_LOG_ERROR, WHO, "%s", err);
        return 1;
    }
    snprintf(session, sizeof(session), "session.timeout.ms=%u", d->cfg->kafka.session_timeout_ms);
    const char *cconf[] = {session, NULL};
    /* lz4: the examples of one request share their user-side fids; it also stretches what a
     * mock partition retains (~5 MiB each) */
    const char *pconf[] = {"linger.ms=1", "compression.codec=lz4", NULL};
    const char *topics[] = {d->cfg->kafka.features_topic, d->cfg->kafka.actions_topic};
    mt_kafka_producer_t *p = NULL;
    mt_kafka_consumer_t *kc = NULL;
    mt_kafka_msg_t *msgs = calloc(POLL_BATCH, sizeof(*msgs));
    int rc = 1;
    if (!msgs) goto out;
    if (mt_kafka_producer_create(bootstrap, pconf, &p, err, sizeof(err))) {
        mt_log(MT_LOG_ERROR, WHO, "Kafka producer on %s: %s", bootstrap, err);
        goto out;
    }
    /* examples left undelivered by the previous run go first */
    if (mt_joiner_outbox_size(d->j)) {
        mt_log(MT_LOG_INFO, WHO, "delivering %zu examples left by the previous run",
               mt_joiner_outbox_size(d->j));
        if (commit_round(d, p, NULL)) goto out;
    }
    if (mt_kafka_consumer_create(bootstrap, d->cfg->joiner.group, topics, 2, cconf, &kc, err,
                                 sizeof(err))) {
        mt_log(MT_LOG_ERROR, WHO, "Kafka consumer on %s: %s", bootstrap, err);
        goto out;
    }
    mt_log(MT_LOG_INFO, WHO, "joining %s + %s -> %s on %s as group %s (window %u s, tasks %s)",
           d->cfg->kafka.features_topic, d->cfg->kafka.actions_topic, d->cfg->kafka.examples_topic,
           bootstrap, d->cfg->joiner.group, d->cfg->joiner.window_s, d->tasks);
    const mt_config_joiner_t *jc = &d->cfg->joiner;
    double t0 = mt_mono_s(), next_commit = t0 + jc->commit_interval_ms / 1000.0;
    double next_progress = t0 + 1.0, last_t = t0, next_lag = t0;
    uint64_t last_msgs = 0, msgs_total = 0;
    size_t last_n = 1; /* messages of the last poll (none yet: not caught up) */
    while (!stop_requested(d)) {
        if (duration_s > 0 && mt_mono_s() - t0 >= duration_s) break;
        /* a few librdkafka calls: once a second is plenty for /metrics; more often when the
         * lag ends the run. Caught up: an empty poll, and every assigned partition at its
         * high watermark (each message polled is applied by then). */
        if (mt_mono_s() >= next_lag) {
            int64_t lag = mt_kafka_consumer_lag(kc);
            pthread_mutex_lock(&d->lock);
            d->kafka_lag = lag;
            pthread_mutex_unlock(&d->lock);
            next_lag = mt_mono_s() + (d->until_caught_up ? 0.2 : 1.0);
            if (d->until_caught_up && !last_n && lag == 0) {
                mt_log(MT_LOG_INFO, WHO,
                       "caught up: every assigned input partition read to its end");
                break;
            }
        }
        size_t n = 0;
        if (mt_joiner_outbox_size(d->j) < OUTBOX_STOP)
            n = mt_kafka_consumer_poll(kc, msgs, POLL_BATCH, 100);
        else
            usleep(100000);
        last_n = n;
        for (size_t i = 0; i < n; i++) {
            const mt_kafka_msg_t *m = &msgs[i];
            mt_joiner_stream_t stream = strcmp(m->topic, d->cfg->kafka.features_topic) == 0
                                            ? MT_JOINER_IMPRESSIONS
                                            : MT_JOINER_ACTIONS;
            mt_joiner_outcome_t oc;
            char why[256];
            mt_err_t e = mt_joiner_add(d->j, stream, m->topic, m->partition, m->offset, m->value,
                                       m->len, &oc, why, sizeof(why));
            if (e) {
                mt_log(MT_LOG_ERROR, WHO, "%s/%d@%" PRId64 ": applying to the state: %s", m->topic,
                       (int)m->partition, m->offset, mt_strerror(e));
                goto out;
            }
            if (oc == MT_JOINER_BAD && d->bad_logged++ < BAD_LOG_MAX)
                mt_log(MT_LOG_WARN, WHO, "%s/%d@%" PRId64 ": bad message skipped: %s", m->topic,
                       (int)m->partition, m->offset, why);
            remember(d, m);
        }
        msgs_total += n;
        /* waiting for partitions is not idleness: keep the watermark from following the clock */
        size_t assigned = mt_kafka_consumer_assigned(kc);
        if (!n && assigned == 0) mt_joiner_hold(d->j);
        mt_joiner_set_partitions(d->j, assigned);
        uint64_t closed = 0;
        mt_err_t e = mt_joiner_tick(d->j, &closed);
        if (e) {
            mt_log(MT_LOG_ERROR, WHO, "closing windows: %s", mt_strerror(e));
            goto out;
        }
        pthread_mutex_lock(&d->lock);
        d->messages = msgs_total;
        pthread_mutex_unlock(&d->lock);
        double now = mt_mono_s();
        if (now >= next_commit || mt_joiner_outbox_size(d->j) >= OUTBOX_HIGH) {
            next_commit = now + jc->commit_interval_ms / 1000.0;
            if (commit_round(d, p, kc)) goto out;
        }
        if (now >= next_progress) { /* also refreshes what /metrics shows */
            snapshot(d);
            if (jc->progress_interval_ms) {
                next_progress = now + jc->progress_interval_ms / 1000.0;
                mt_joiner_stats_t s = d->snap;
                fprintf(stderr,
                        "joiner  %" PRIu64 " msg  %.0f msg/s  imp %" PRIu64 "  act %" PRIu64
                        "  pos %" PRIu64 "  neg %" PRIu64 "  pending %" PRIu64 "  late %" PRIu64
                        "  dup %" PRIu64 "  bad %" PRIu64 "  partitions %zu\n",
                        msgs_total, (double)(msgs_total - last_msgs) / (now - last_t),
                        s.impressions, s.actions, s.positives, s.negatives, s.pending,
                        s.late_actions, s.duplicate_impressions + s.duplicate_actions,
                        s.bad_messages, mt_kafka_consumer_assigned(kc));
                last_msgs = msgs_total;
                last_t = now;
            } else {
                next_progress = now + 1.0;
            }
        }
    }
    if (d->drain) {
        uint64_t closed = 0;
        mt_err_t e = mt_joiner_drain(d->j, &closed);
        if (e) {
            mt_log(MT_LOG_ERROR, WHO, "draining: %s", mt_strerror(e));
            goto out;
        }
        mt_log(MT_LOG_INFO, WHO, "drained: %" PRIu64 " windows closed", closed);
    }
    if (commit_round(d, p, kc)) goto out;
    if (mt_joiner_outbox_size(d->j)) {
        mt_log(MT_LOG_ERROR, WHO, "%zu examples could not be delivered (kept for the next run)",
               mt_joiner_outbox_size(d->j));
        goto out;
    }
    snapshot(d);
    rc = write_report(d, mt_mono_s() - t0);
out:
    mt_kafka_consumer_destroy(kc);
    mt_kafka_producer_destroy(p);
    free(msgs);
    return rc;
}

/* ---------------- configuration, create, destroy ---------------- */

mt_err_t mt_joiner_run_check(const mt_config_t *cfg, mt_joiner_config_t *out, char *errbuf,
                             size_t errlen) {
    char err[512] = "";
    /* The joiner needs no [slot.N]: mt_config_validate() (which requires one) runs only on a
     * file that has slots (a shared cluster file); every value was bounds-checked as read. */
    if (cfg->nslots && mt_config_validate(cfg, err, sizeof(err)) != MT_OK) {
        snprintf(errbuf, errlen, "%s", err);
        return MT_CONFIG;
    }
    mt_joiner_config_t jc;
    mt_joiner_config_init(&jc);
    jc.window_ms = (int64_t)cfg->joiner.window_s * 1000;
    jc.allowed_lateness_ms = (int64_t)cfg->joiner.allowed_lateness_s * 1000;
    jc.idle_advance_ms = cfg->joiner.idle_advance_ms;
    jc.negative_rate = cfg->joiner.negative_rate;
    jc.seed = cfg->joiner.seed;
    jc.max_pending_memory = cfg->joiner.max_pending_memory;
    jc.max_early_actions = cfg->joiner.max_early_actions;
    jc.sync = cfg->joiner.sync;
    jc.write_buffer_mb = cfg->joiner.rocksdb_write_buffer_mb;
    jc.block_cache_mb = cfg->joiner.rocksdb_block_cache_mb;
    _Static_assert(MT_CONFIG_MAX_TASK_ACTIONS == MT_JOINER_MAX_TASKS, "task limits differ");
    size_t ntasks = 0;
    if (mt_config_joiner_task_actions(cfg, jc.task_actions, &ntasks, err, sizeof(err)) != MT_OK) {
        snprintf(errbuf, errlen, "%s", err);
        return MT_CONFIG;
    }
    jc.ntasks = (uint32_t)ntasks;
    if (mt_joiner_config_validate(&jc, err, sizeof(err)) != MT_OK) {
        snprintf(errbuf, errlen, "joiner.%s", err);
        return MT_CONFIG;
    }
    if (!strcmp(cfg->kafka.features_topic, cfg->kafka.actions_topic)) {
        snprintf(errbuf, errlen, "kafka.features_topic and actions_topic are equal");
        return MT_CONFIG;
    }
    if (out) *out = jc;
    return MT_OK;
}

void mt_joiner_run_tasks(const mt_joiner_config_t *jc, char *buf, size_t len) {
    size_t off = 0;
    if (len) buf[0] = '\0';
    for (uint32_t t = 0; t < jc->ntasks && off < len; t++) {
        int w = snprintf(buf + off, len - off, "%s%s", t ? ", " : "",
                         mt_joiner_action_name(jc->task_actions[t]));
        if (w < 0) break;
        off += (size_t)w;
    }
}

int mt_joiner_run_create(const mt_joiner_run_config_t *rc, mt_joiner_run_t **out) {
    char err[512] = "";
    mt_joiner_config_t jc;
    *out = NULL;
    if (mt_joiner_run_check(rc->cfg, &jc, err, sizeof(err)) != MT_OK) {
        mt_log(MT_LOG_ERROR, WHO, "%s", err);
        return MT_JOINER_EXIT_CONFIG;
    }
    mt_joiner_run_t *d = calloc(1, sizeof(*d));
    if (!d) return MT_JOINER_EXIT_FAILED;
    d->cfg = rc->cfg;
    d->report_path = rc->report_path;
    d->duration_s = rc->duration_s;
    d->drain = rc->drain;
    d->until_caught_up = rc->until_caught_up;
    d->stop = rc->stop;
    d->stop_ud = rc->stop_ud;
    d->kafka_lag = -1;
    d->started = mt_mono_s();
    pthread_mutex_init(&d->lock, NULL);
    *out = d;
    d->ntasks = jc.ntasks;
    for (uint32_t t = 0; t < jc.ntasks; t++)
        d->task_names[t] = mt_joiner_action_name(jc.task_actions[t]);
    mt_joiner_run_tasks(&jc, d->tasks, sizeof(d->tasks));
    if (!(d->marks = calloc(MAX_PARTS, sizeof(*d->marks)))) return MT_JOINER_EXIT_FAILED;
    const char *dir = d->cfg->joiner.state_dir;
    if (mt_joiner_open(dir, &jc, NULL, NULL, &d->j, err, sizeof(err)) != MT_OK) {
        mt_log(MT_LOG_ERROR, WHO, "state %s: %s", dir, err);
        return MT_JOINER_EXIT_FAILED;
    }
    snapshot(d);
    mt_log(MT_LOG_INFO, WHO,
           "state %s: %" PRIu64 " pending impressions, %" PRIu64 " early actions, %" PRIu64
           " undelivered examples",
           dir, d->snap.pending, d->snap.early_pending, d->snap.outbox);
    return MT_JOINER_EXIT_OK;
}

void mt_joiner_run_destroy(mt_joiner_run_t *d) {
    if (!d) return;
    mt_joiner_close(d->j);
    free(d->marks);
    pthread_mutex_destroy(&d->lock);
    free(d);
}
