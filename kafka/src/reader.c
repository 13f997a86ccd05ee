/*
 * reader.c - a reader of chosen partitions from chosen offsets, outside any consumer group
 * (rd_kafka_assign without subscribe): every reader sees every message of its partitions.
 * It keeps no positions of its own; the caller decides where each partition starts and
 * restarts. An offset out of range (retention passed it, or it is above the end) is not
 * reset: the partition stops and the next poll reports it (auto.offset.reset=error).
 *
 * State: rk, the assignment list (under lock: start/stop may be called from any thread,
 * though the one user, serving's shard threads, keeps a reader per thread), and the
 * messages handed out by the last poll (poll thread only).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kafka_int.h"
#include "mt/kafka.h"
#include "mt/log.h"

struct mt_kafka_reader {
    rd_kafka_t *rk;
    pthread_mutex_t lock;                    /* guards assign */
    rd_kafka_topic_partition_list_t *assign; /* what is assigned, with the start offsets */
    rd_kafka_message_t **held;               /* poll thread only */
    size_t nheld, held_cap;
    _Atomic uint64_t messages, errors, out_of_range;
};

mt_err_t mt_kafka_reader_create(const char *bootstrap, const char *const *conf,
                                mt_kafka_reader_t **out, char *errbuf, size_t errlen) {
    mt__kafka_errf(errbuf, errlen, "%s", "");
    if (!out || !bootstrap || !*bootstrap) {
        mt__kafka_errf(errbuf, errlen, "need a bootstrap");
        return MT_INVALID;
    }
    /* fetch.wait.max.ms: how long a broker holds a fetch with nothing to return; a message
     * that arrives meanwhile is returned at once (fetch.min.bytes=1), so this bounds idle
     * fetches, not the latency. */
    /* librdkafka 2.0.2's assign() wants a group.id; without subscribe() and commits no
     * group is joined, so every reader may share this one. */
    static const char *const defaults[] = {"client.id=monolith",
                                           "group.id=monolith-reader",
                                           "enable.auto.commit=false",
                                           "enable.auto.offset.store=false",
                                           "auto.offset.reset=error",
                                           "enable.partition.eof=false",
                                           "fetch.wait.max.ms=100",
                                           "fetch.error.backoff.ms=50",
                                           NULL};
    rd_kafka_conf_t *rconf = NULL;
    mt_kafka_reader_t *r = calloc(1, sizeof(*r));
    if (!r) return MT_NOMEM;
    pthread_mutex_init(&r->lock, NULL);
    mt_err_t rc = MT_NOMEM;
    if (!(r->assign = rd_kafka_topic_partition_list_new(4))) goto fail;
    rc = mt__kafka_conf_new(defaults, conf, &rconf, errbuf, errlen);
    if (!rc) rc = mt__kafka_conf_set(rconf, "bootstrap.servers", bootstrap, errbuf, errlen);
    if (rc) goto fail;
    char errstr[512];
    r->rk = rd_kafka_new(RD_KAFKA_CONSUMER, rconf, errstr, sizeof(errstr));
    if (!r->rk) {
        mt__kafka_errf(errbuf, errlen, "cannot create a reader: %s", errstr);
        rc = MT_INTERNAL;
        goto fail;
    }
    rconf = NULL; /* owned by r->rk */
    rd_kafka_poll_set_consumer(r->rk);
    *out = r;
    return MT_OK;
fail:
    if (rconf) rd_kafka_conf_destroy(rconf);
    if (r->assign) rd_kafka_topic_partition_list_destroy(r->assign);
    pthread_mutex_destroy(&r->lock);
    free(r);
    return rc;
}

mt_err_t mt_kafka_reader_end(mt_kafka_reader_t *r, const char *topic, int32_t partition,
                             int timeout_ms, int64_t *start, int64_t *end, char *errbuf,
                             size_t errlen) {
    int64_t lo = -1, hi = -1;
    rd_kafka_resp_err_t e =
        rd_kafka_query_watermark_offsets(r->rk, topic, partition, &lo, &hi, timeout_ms);
    if (e) {
        mt__kafka_errf(errbuf, errlen, "offsets of %s[%d]: %s", topic, (int)partition,
                       rd_kafka_err2str(e));
        return e == RD_KAFKA_RESP_ERR__TIMED_OUT ? MT_TIMEOUT
               : e == RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION ||
                       e == RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC ||
                       e == RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART
                   ? MT_NOT_FOUND
                   : MT_IO;
    }
    if (start) *start = lo;
    if (end) *end = hi;
    return MT_OK;
}

/* Assigns r->assign (caller holds lock). */
static mt_err_t reassign_locked(mt_kafka_reader_t *r, char *errbuf, size_t errlen) {
    rd_kafka_resp_err_t e = rd_kafka_assign(r->rk, r->assign);
    if (e) {
        mt__kafka_errf(errbuf, errlen, "cannot assign: %s", rd_kafka_err2str(e));
        return MT_IO;
    }
    return MT_OK;
}

mt_err_t mt_kafka_reader_start(mt_kafka_reader_t *r, const char *topic, int32_t partition,
                               int64_t offset, char *errbuf, size_t errlen) {
    if (!topic || !*topic || partition < 0 || offset < 0) {
        mt__kafka_errf(errbuf, errlen, "need a topic, a partition and an offset >= 0");
        return MT_INVALID;
    }
    pthread_mutex_lock(&r->lock);
    rd_kafka_topic_partition_t *tp =
        rd_kafka_topic_partition_list_find(r->assign, topic, partition);
    if (!tp) tp = rd_kafka_topic_partition_list_add(r->assign, topic, partition);
    tp->offset = offset;
    mt_err_t rc = reassign_locked(r, errbuf, errlen);
    pthread_mutex_unlock(&r->lock);
    return rc;
}

mt_err_t mt_kafka_reader_stop(mt_kafka_reader_t *r, const char *topic, int32_t partition,
                              char *errbuf, size_t errlen) {
    pthread_mutex_lock(&r->lock);
    mt_err_t rc = MT_OK;
    if (rd_kafka_topic_partition_list_del(r->assign, topic, partition)) {
        /* offsets of the partitions that stay: where they are now, not where they started */
        for (int i = 0; i < r->assign->cnt; i++) {
            rd_kafka_topic_partition_t *tp = &r->assign->elems[i];
            rd_kafka_topic_partition_list_t *one = rd_kafka_topic_partition_list_new(1);
            if (!one) continue;
            rd_kafka_topic_partition_list_add(one, tp->topic, tp->partition);
            if (rd_kafka_position(r->rk, one) == RD_KAFKA_RESP_ERR_NO_ERROR &&
                one->elems[0].offset >= 0)
                tp->offset = one->elems[0].offset;
            rd_kafka_topic_partition_list_destroy(one);
        }
        rc = reassign_locked(r, errbuf, errlen);
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

static void release_held(mt_kafka_reader_t *r) {
    for (size_t i = 0; i < r->nheld; i++)
        rd_kafka_message_destroy(r->held[i]);
    r->nheld = 0;
}

size_t mt_kafka_reader_poll(mt_kafka_reader_t *r, mt_kafka_msg_t *msgs, size_t cap, int timeout_ms,
                            mt_kafka_reader_event_t *ev) {
    release_held(r);
    if (ev) memset(ev, 0, sizeof(*ev));
    if (!cap || !msgs) return 0;
    if (cap > r->held_cap) {
        rd_kafka_message_t **h = realloc(r->held, cap * sizeof(*h));
        if (!h) {
            if (!r->held_cap) return 0;
            cap = r->held_cap;
        } else {
            r->held = h;
            r->held_cap = cap;
        }
    }
    int64_t deadline = mt__kafka_now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    size_t n = 0;
    while (n < cap) {
        int wait_ms = 0;
        if (n == 0) {
            int64_t left = deadline - mt__kafka_now_ms();
            wait_ms = left > 0 ? (int)left : 0;
        }
        rd_kafka_message_t *rkm = rd_kafka_consumer_poll(r->rk, wait_ms);
        if (!rkm) break;
        if (rkm->err) {
            if (rkm->err == RD_KAFKA_RESP_ERR__AUTO_OFFSET_RESET ||
                rkm->err == RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE) {
                atomic_fetch_add(&r->out_of_range, 1);
                if (ev && !ev->out_of_range) {
                    ev->out_of_range = 1;
                    ev->partition = rkm->partition;
                }
                mt_log(MT_LOG_WARN, MT__KAFKA_WHO, "reader: %s[%d]: %s",
                       rkm->rkt ? rd_kafka_topic_name(rkm->rkt) : "-", (int)rkm->partition,
                       rd_kafka_message_errstr(rkm));
            } else if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
                atomic_fetch_add(&r->errors, 1);
                mt_log(MT_LOG_DEBUG, MT__KAFKA_WHO, "reader: %s", rd_kafka_message_errstr(rkm));
            }
            rd_kafka_message_destroy(rkm);
            if (ev && ev->out_of_range) break; /* the caller must act before reading on */
            if (n == 0 && mt__kafka_now_ms() >= deadline) break;
            continue;
        }
        r->held[r->nheld++] = rkm;
        mt__kafka_msg_fill(&msgs[n++], rkm, rd_kafka_topic_name(rkm->rkt));
    }
    atomic_fetch_add(&r->messages, (uint64_t)n);
    return n;
}

void mt_kafka_reader_counts(const mt_kafka_reader_t *r, uint64_t *messages, uint64_t *errors,
                            uint64_t *out_of_range) {
    if (messages) *messages = atomic_load(&r->messages);
    if (errors) *errors = atomic_load(&r->errors);
    if (out_of_range) *out_of_range = atomic_load(&r->out_of_range);
}

void mt_kafka_reader_destroy(mt_kafka_reader_t *r) {
    if (!r) return;
    release_held(r);
    free(r->held);
    rd_kafka_assign(r->rk, NULL);
    rd_kafka_consumer_close(r->rk);
    rd_kafka_destroy(r->rk);
    rd_kafka_topic_partition_list_destroy(r->assign);
    pthread_mutex_destroy(&r->lock);
    free(r);
}
