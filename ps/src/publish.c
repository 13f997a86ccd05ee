/*
 * publish.c - the shard's change stream on Kafka (docs/serving.md, "Parameter fan-out
 * through Kafka"): one thread per shard does what a follow Sync round does, once for every
 * replica, and produces the round's SyncChunks to partition <shard> of the parameters topic.
 *
 * A round: the changes after the published version `pub` (mt_table_changes_begin), in
 * chunks with caught_up = 0, each carrying the shard's incarnation, since_version = pub and
 * the round's upto_version; once every one of them is delivered (a flush), a last chunk
 * without entries and with caught_up = 1 closes the round, and pub moves to upto. A round
 * whose delivery failed is not closed: the next one starts again at pub (a reader applies
 * the repeated rows twice: upserts and deletions are idempotent), so a reader never records
 * a version whose changes did not all reach the topic.
 *
 * A resync marker (full = 1, no entries, since = upto = the shard's clock) goes first after
 * the start, after a restore (the incarnation changed) and when the change log no longer
 * covers pub: the rows are not in the topic, readers sync from the shard directly.
 *
 * The table is read between mt__ps_enter() and mt__ps_leave() (a restore waits for the
 * section to end, never for Kafka: the flushes run outside it). Thread: the publisher's
 * own; the counters are atomics read by mt_ps_publisher_render_metrics() from any thread.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "monolith/v1/ps.pb-c.h"
#include "mt/clock.h"
#include "mt/kafka.h"
#include "mt/log.h"
#include "shard_int.h"

#define WHO "ps"

struct mt_ps_publisher {
    mt_ps_t *ps;
    mt_kafka_producer_t *producer;
    char *topic;
    uint32_t interval_ms, flush_ms;
    size_t chunk;
    pthread_t thread;
    pthread_mutex_t lock; /* guards stop (with cond) */
    pthread_cond_t cond;
    int stop;
    /* The publisher thread's state. */
    uint64_t pub, pub_inc;
    int need_marker;
    mt_table_change_t *ents;
    float *vals;
    uint64_t *fids;
    uint8_t *del, *buf;
    size_t cap;
    /* Counters (any thread). */
    _Atomic uint64_t rounds, messages, entries, failures, resyncs, version;
    _Atomic int64_t last_ok_ms; /* CLOCK_MONOTONIC ms of the last closed round; 0: none */
};

void mt_ps_publish_config_init(mt_ps_publish_config_t *c) {
    memset(c, 0, sizeof(*c));
    c->topic = "params";
    c->interval_ms = 100;
    c->max_message_bytes = 900000;
    c->flush_ms = 5000;
}

/* Packs @p m and queues it on the shard's partition. @returns MT_OK or the producer's
 * error (counted as a failure by the caller). */
static mt_err_t produce(mt_ps_publisher_t *p, Monolith__V1__SyncChunk *m) {
    size_t len = monolith__v1__sync_chunk__get_packed_size(m);
    if (len > p->cap) {
        uint8_t *nb = realloc(p->buf, len);
        if (!nb) return MT_NOMEM;
        p->buf = nb;
        p->cap = len;
    }
    monolith__v1__sync_chunk__pack(m, p->buf);
    char key[16];
    int kl = snprintf(key, sizeof(key), "%u", p->ps->cfg.shard);
    mt_err_t err = mt_kafka_produce(p->producer, p->topic, (int32_t)p->ps->cfg.shard, key,
                                    (size_t)kl, p->buf, len, (int)p->flush_ms);
    if (!err) atomic_fetch_add(&p->messages, 1);
    return err;
}

static void failed(mt_ps_publisher_t *p, const char *what, mt_err_t err) {
    atomic_fetch_add(&p->failures, 1);
    mt_log(MT_LOG_WARN, WHO, "shard %u: publishing to %s[%u]: %s: %s (retried from version %llu)",
           p->ps->cfg.shard, p->topic, p->ps->cfg.shard, what, mt_strerror(err),
           (unsigned long long)p->pub);
}

/* A resync marker at the shard's clock. @returns 0, or -1 (not published: retried). */
static int marker(mt_ps_publisher_t *p) {
    mt_ps_t *ps = p->ps;
    if (mt__ps_enter(ps) != 0) return -1; /* a restore runs: after it */
    uint64_t inc = atomic_load(&ps->incarnation), clock = 0;
    mt_table_changes_t *it = NULL;
    int full;
    mt_err_t err = mt_table_changes_begin(ps->table, 0, &it, &clock, &full);
    mt_table_changes_end(it);
    mt__ps_leave(ps);
    if (err) {
        failed(p, "reading the table's clock", err);
        return -1;
    }
    Monolith__V1__SyncChunk m = MONOLITH__V1__SYNC_CHUNK__INIT;
    m.full = 1;
    m.incarnation = inc;
    m.since_version = clock;
    m.upto_version = clock;
    m.caught_up = 1;
    if ((err = produce(p, &m)) != MT_OK ||
        (err = mt_kafka_producer_flush(p->producer, (int)p->flush_ms)) != MT_OK) {
        failed(p, "a resync marker", err);
        return -1;
    }
    p->pub = clock;
    p->pub_inc = inc;
    p->need_marker = 0;
    atomic_fetch_add(&p->resyncs, 1);
    atomic_store(&p->version, clock);
    atomic_store(&p->last_ok_ms, (int64_t)(mt_mono_s() * 1000));
    mt_log(MT_LOG_INFO, WHO, "shard %u: resync marker published at version %llu (incarnation %llx)",
           ps->cfg.shard, (unsigned long long)clock, (unsigned long long)inc);
    return 0;
}

/* One round (see the top). @returns 0, or -1 (a marker is due or the round failed). */
static int round_once(mt_ps_publisher_t *p) {
    mt_ps_t *ps = p->ps;
    if (mt__ps_enter(ps) != 0) return -1;
    uint64_t inc = atomic_load(&ps->incarnation), upto = 0, entries = 0;
    if (inc != p->pub_inc) {
        mt__ps_leave(ps);
        p->need_marker = 1;
        return -1;
    }
    mt_table_changes_t *it = NULL;
    int full = 0;
    mt_err_t err = mt_table_changes_begin(ps->table, p->pub, &it, &upto, &full);
    if (!err && full) p->need_marker = 1; /* the log moved past pub */
    while (!err && !full) {
        size_t n = 0;
        err = mt_table_changes_next(it, p->ents, p->chunk, p->vals, p->chunk * ps->max_dim, &n);
        if (err == MT_FULL_SYNC) {
            p->need_marker = 1;
            break;
        }
        if (err || n == 0) break;
        size_t nv = mt__ps_chunk_split(p->ents, n, p->fids, p->del);
        Monolith__V1__SyncChunk m = MONOLITH__V1__SYNC_CHUNK__INIT;
        m.incarnation = inc;
        m.since_version = p->pub;
        m.upto_version = upto;
        m.n_fids = n;
        m.fids = p->fids;
        m.n_values = nv;
        m.values = p->vals;
        m.deleted.len = n;
        m.deleted.data = p->del;
        if ((err = produce(p, &m)) != MT_OK) break;
        entries += n;
    }
    mt_table_changes_end(it);
    mt__ps_leave(ps);
    if (p->need_marker) return -1;
    if (err) {
        failed(p, "a round's chunk", err);
        return -1;
    }
    /* every chunk delivered, then the round's end */
    Monolith__V1__SyncChunk m = MONOLITH__V1__SYNC_CHUNK__INIT;
    m.incarnation = inc;
    m.since_version = p->pub;
    m.upto_version = upto;
    m.caught_up = 1;
    if ((entries && (err = mt_kafka_producer_flush(p->producer, (int)p->flush_ms)) != MT_OK) ||
        (err = produce(p, &m)) != MT_OK ||
        (err = mt_kafka_producer_flush(p->producer, (int)p->flush_ms)) != MT_OK) {
        failed(p, "delivery", err);
        return -1;
    }
    p->pub = upto;
    atomic_fetch_add(&p->rounds, 1);
    atomic_fetch_add(&p->entries, entries);
    atomic_store(&p->version, upto);
    atomic_store(&p->last_ok_ms, (int64_t)(mt_mono_s() * 1000));
    return 0;
}

/* Sleeps until @p deadline_s or stop. @returns 1 when stopping. */
static int wait_until(mt_ps_publisher_t *p, double deadline_s) {
    pthread_mutex_lock(&p->lock);
    while (!p->stop) {
        double left = deadline_s - mt_mono_s();
        if (left <= 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + left;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&p->cond, &p->lock, &ts);
    }
    int stop = p->stop;
    pthread_mutex_unlock(&p->lock);
    return stop;
}

static void *publish_main(void *arg) {
    mt_ps_publisher_t *p = arg;
    double period = p->interval_ms / 1000.0, next = mt_mono_s();
    while (!wait_until(p, next)) {
        double t0 = mt_mono_s();
        int was_marker = p->need_marker;
        int rc = was_marker ? marker(p) : round_once(p);
        if (rc == 0)
            next = t0 + period; /* published: the next round one interval after this one */
        else if (!was_marker && p->need_marker)
            next = mt_mono_s(); /* a marker is due: at once */
        else
            next = mt_mono_s() + (period > 0.1 ? period : 0.1); /* failed, or a restore runs */
    }
    return NULL;
}

/* Destroys the producer (a flush of up to 5 s) and frees everything (no thread runs). */
static void publisher_free(mt_ps_publisher_t *p) {
    mt_kafka_producer_destroy(p->producer);
    free(p->topic);
    free(p->ents);
    free(p->vals);
    free(p->fids);
    free(p->del);
    free(p->buf);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    free(p);
}

mt_err_t mt_ps_publisher_start(mt_ps_t *ps, const mt_ps_publish_config_t *cfg,
                               mt_ps_publisher_t **out, char *errbuf, size_t errlen) {
    if (!ps || !cfg || !out || !cfg->bootstrap || !*cfg->bootstrap || !cfg->topic || !*cfg->topic ||
        !cfg->interval_ms) {
        mt_msgf(errbuf, errlen, "the publisher needs a bootstrap, a topic and an interval");
        return MT_INVALID;
    }
    /* entries per chunk: what fits max_message_bytes, at most ps.sync_chunk_fids */
    size_t fit = mt__ps_chunk_fit(ps, cfg->max_message_bytes);
    size_t chunk = ps->cfg.sync_chunk_fids ? ps->cfg.sync_chunk_fids : 4096;
    if (chunk > fit) chunk = fit;
    if (chunk == 0) {
        mt_msgf(errbuf, errlen, "a row of dim %u does not fit a %u-byte message", ps->max_dim,
                cfg->max_message_bytes);
        return MT_CONFIG;
    }
    mt_ps_publisher_t *p = calloc(1, sizeof(*p));
    if (!p) return MT_NOMEM;
    p->ps = ps;
    p->interval_ms = cfg->interval_ms;
    p->flush_ms = cfg->flush_ms ? cfg->flush_ms : 5000;
    p->chunk = chunk;
    p->need_marker = 1;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    mt_err_t err = MT_NOMEM;
    p->topic = strdup(cfg->topic);
    p->ents = malloc(chunk * sizeof(*p->ents));
    p->vals = malloc(chunk * ps->max_dim * sizeof(float));
    p->fids = malloc(chunk * sizeof(uint64_t));
    p->del = malloc(chunk);
    if (!p->topic || !p->ents || !p->vals || !p->fids || !p->del) goto fail;
    /* idempotent: a retried send is written once and in order (a shard's partition is its
     * history); linger 0: a round is flushed at once anyway */
    const char *defaults[16];
    size_t nd = 0;
    defaults[nd++] = "enable.idempotence=true";
    defaults[nd++] = "linger.ms=0";
    char maxb[64];
    snprintf(maxb, sizeof(maxb), "message.max.bytes=%u", cfg->max_message_bytes + 4096);
    defaults[nd++] = maxb;
    for (size_t i = 0; cfg->kafka_conf && cfg->kafka_conf[i] && nd < 15; i++)
        defaults[nd++] = cfg->kafka_conf[i];
    defaults[nd] = NULL;
    char kerr[512] = "";
    if ((err = mt_kafka_producer_create(cfg->bootstrap, defaults, &p->producer, kerr,
                                        sizeof(kerr))) != MT_OK) {
        mt_msgf(errbuf, errlen, "the parameters' producer: %s", kerr);
        goto fail;
    }
    if (pthread_create(&p->thread, NULL, publish_main, p) != 0) {
        err = MT_INTERNAL;
        mt_msgf(errbuf, errlen, "cannot start the publisher thread");
        goto fail;
    }
    mt_log(MT_LOG_INFO, WHO, "shard %u: publishing its changes to %s[%u] every %u ms",
           ps->cfg.shard, p->topic, ps->cfg.shard, p->interval_ms);
    *out = p;
    return MT_OK;
fail:
    publisher_free(p);
    return err;
}

void mt_ps_publisher_stop(mt_ps_publisher_t *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stop = 1;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    pthread_join(p->thread, NULL);
    if (!p->need_marker) round_once(p); /* what changed since the last round */
    publisher_free(p);
}

void mt_ps_publisher_stats(const mt_ps_publisher_t *p, mt_ps_publish_stats_t *out) {
    memset(out, 0, sizeof(*out));
    out->rounds = atomic_load(&p->rounds);
    out->messages = atomic_load(&p->messages);
    out->entries = atomic_load(&p->entries);
    out->failures = atomic_load(&p->failures);
    out->resyncs = atomic_load(&p->resyncs);
    out->version = atomic_load(&p->version);
    int64_t ms = atomic_load(&p->last_ok_ms);
    out->last_ok_s = ms ? (double)ms / 1000.0 : 0;
}

void mt_ps_publisher_render_metrics(const mt_ps_publisher_t *p, char *buf, size_t len) {
    if (!len) return;
    buf[0] = 0;
    if (!p) return;
    mt_ps_publish_stats_t st;
    mt_ps_publisher_stats(p, &st);
    unsigned shard = p->ps->cfg.shard;
    double age = st.last_ok_s > 0 ? mt_mono_s() - st.last_ok_s : -1;
    snprintf(buf, len,
             "# HELP monolith_ps_publish_rounds_total Rounds of changes published to the "
             "parameters topic.\n"
             "# TYPE monolith_ps_publish_rounds_total counter\n"
             "monolith_ps_publish_rounds_total{shard=\"%u\"} %llu\n"
             "# HELP monolith_ps_publish_entries_total Rows and deletions published.\n"
             "# TYPE monolith_ps_publish_entries_total counter\n"
             "monolith_ps_publish_entries_total{shard=\"%u\"} %llu\n"
             "# HELP monolith_ps_publish_messages_total Messages produced to the parameters "
             "topic.\n"
             "# TYPE monolith_ps_publish_messages_total counter\n"
             "monolith_ps_publish_messages_total{shard=\"%u\"} %llu\n"
             "# HELP monolith_ps_publish_failures_total Rounds or markers not delivered "
             "(retried).\n"
             "# TYPE monolith_ps_publish_failures_total counter\n"
             "monolith_ps_publish_failures_total{shard=\"%u\"} %llu\n"
             "# HELP monolith_ps_publish_resyncs_total Resync markers published (start, "
             "restore, log overrun).\n"
             "# TYPE monolith_ps_publish_resyncs_total counter\n"
             "monolith_ps_publish_resyncs_total{shard=\"%u\"} %llu\n"
             "# HELP monolith_ps_publish_version The version published up to.\n"
             "# TYPE monolith_ps_publish_version gauge\n"
             "monolith_ps_publish_version{shard=\"%u\"} %llu\n"
             "# HELP monolith_ps_publish_age_seconds Seconds since the last round was "
             "published (-1: none yet).\n"
             "# TYPE monolith_ps_publish_age_seconds gauge\n"
             "monolith_ps_publish_age_seconds{shard=\"%u\"} %.3f\n",
             shard, (unsigned long long)st.rounds, shard, (unsigned long long)st.entries, shard,
             (unsigned long long)st.messages, shard, (unsigned long long)st.failures, shard,
             (unsigned long long)st.resyncs, shard, (unsigned long long)st.version, shard, age);
}
